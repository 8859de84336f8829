"""OTLP span exporter construction from rltrace's config and the standard ``OTEL_*`` variables."""

from __future__ import annotations

import logging
import os
import re
from typing import TYPE_CHECKING, Any

from opentelemetry.sdk.trace.export import SpanExporter

from rltrace.config import ConfigError, OTLPConfig, endpoint_problem, redact_endpoint, redact_urls
from rltrace.recording.otel_context import encoded_exporter_class

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics.export import MetricExporter

logger = logging.getLogger("rltrace")


def _env(*names: str) -> str | None:
    for n in names:
        v = os.environ.get(n)
        if v:
            return v
    return None


#: the OTel SDK's exporter loggers (and urllib3's, under its HTTP exporter)
_SDK_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.grpc.exporter",
    "opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
    "opentelemetry.exporter.otlp.proto.grpc.metric_exporter",
    "opentelemetry.exporter.otlp.proto.http._common",
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.exporter.otlp.proto.http.metric_exporter",
    "opentelemetry.sdk.metrics._internal.export",
    "urllib3.connectionpool",
)


class SdkLogFold(logging.Filter):
    """Folds the SDK exporters' own log lines (retries, connection errors) into rltrace's one
    warning per rank: each is counted, the last kept for that warning, and logged at DEBUG on
    the ``rltrace`` logger; none reaches the user's stderr as it is.  In force once rltrace has
    built an OTLP exporter in the process."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        #: the last line folded (the reason rltrace's warning gives)
        self.last: str | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            msg = record.getMessage()
        except Exception:
            msg = str(record.msg)
        msg = redact_urls(msg)  # the SDK names the endpoint, userinfo and all
        self.count += 1
        cause = sdk_cause(msg)
        if cause is not None or self.last is None:
            self.last = cause or " ".join(msg.split())[:300]
        logger.debug("rltrace: (OpenTelemetry SDK) %s", msg)
        return False


#: SDK lines that say an export gave up, not why (a shutdown that ended a retry, the final
#: "timeout, max retries or shutdown"): they do not replace the cause seen before them
_NOT_A_CAUSE = re.compile(r"^\s*(Shutdown in progress|Exporter already shut ?down"
                          r"|OTLP client already shut ?down"
                          r"|Failed to export \w+ batch due to timeout, max retries or shutdown"
                          r"|Reinitializing gRPC channel)", re.IGNORECASE)
_RETRY_TAIL = re.compile(r"\s*encountered while exporting .*?, retrying in [\d.]+s\.?")
_OS_ERROR = re.compile(r"(?:[A-Z][\w ]*: )?\[Errno -?\d+\] [^\"')\]]+")


def sdk_cause(msg: str) -> str | None:
    """The cause an SDK exporter line gives for a failed export, shortened (``Failed to establish
    a new connection: [Errno 111] Connection refused``, ``StatusCode.UNAVAILABLE: failed to
    connect to all addresses; ... Connection refused``), or None for a line that names no cause."""
    text = " ".join(msg.split())
    if _NOT_A_CAUSE.match(text):
        return None
    text = _RETRY_TAIL.sub("", text, count=1).removeprefix("Transient error ")
    text = re.sub(r"\.?\s*Error details:", ":", text, count=1)
    os_error = _OS_ERROR.search(text)
    if os_error is not None:
        return os_error.group(0).strip()
    return text[:300]


def fold_sdk_logs(fold: SdkLogFold) -> None:
    """Put ``fold`` on the SDK exporters' loggers (once)."""
    for name in _SDK_LOGGERS:
        lg = logging.getLogger(name)
        if fold not in lg.filters:
            lg.addFilter(fold)


def unfold_sdk_logs(fold: SdkLogFold) -> None:
    """Take ``fold`` off the SDK exporters' loggers (its pipeline closed)."""
    for name in _SDK_LOGGERS:
        logging.getLogger(name).removeFilter(fold)


def otlp_endpoint(cfg: OTLPConfig) -> str | None:
    """The configured endpoint, from rltrace's config or ``OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT``
    (one from the environment is checked as the config key is: :class:`ConfigError` if bad)."""
    if cfg.endpoint:
        return cfg.endpoint
    for name in ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"):
        value = os.environ.get(name)
        if value:
            problem = endpoint_problem(value, cfg.protocol or _env(
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"))
            if problem is not None:
                raise ConfigError(f"rltrace: the environment variable {name}="
                                  f"{redact_endpoint(value)!r} {problem}; "
                                  f"fix it, or set the config key otlp.endpoint")
            return value
    return None


def otlp_protocol(cfg: OTLPConfig) -> str:
    proto = cfg.protocol or _env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
    proto = (proto or "grpc").strip().lower()
    if proto == "http":
        proto = "http/protobuf"
    if proto not in ("grpc", "http/protobuf"):
        raise ConfigError(
            f"rltrace: OTLP protocol {proto!r} is not supported; use 'grpc' or 'http/protobuf' "
            "(key otlp.protocol or OTEL_EXPORTER_OTLP_PROTOCOL)"
        )
    return proto


def _exporter_kwargs(cfg: OTLPConfig, proto: str) -> dict[str, Any]:
    """Keyword arguments shared by the span and metric exporters of one protocol.

    Values left unset in rltrace's config are left to the exporter, which reads the standard
    ``OTEL_EXPORTER_OTLP_*`` variables (headers, compression, timeout, certificate) itself.
    """
    kwargs: dict[str, Any] = {}
    if cfg.headers:
        kwargs["headers"] = dict(cfg.headers)
    if cfg.timeout_s is not None:
        kwargs["timeout"] = cfg.timeout_s
    if cfg.compression:
        kwargs["compression"] = _compression(cfg.compression, proto)
    if proto == "grpc":
        if cfg.insecure is not None:
            kwargs["insecure"] = cfg.insecure
        if cfg.certificate_file:
            import grpc

            with open(cfg.certificate_file, "rb") as fh:
                kwargs["credentials"] = grpc.ssl_channel_credentials(fh.read())
    elif cfg.certificate_file:
        kwargs["certificate_file"] = cfg.certificate_file
        kwargs["session"] = _pinned_verify_session(cfg.certificate_file)
    return kwargs


def _pinned_verify_session(certificate_file: str) -> object:
    """A ``requests`` session that verifies against ``certificate_file`` whatever the environment.

    requests lets ``REQUESTS_CA_BUNDLE`` / ``CURL_CA_BUNDLE`` (set on many clusters and by conda)
    replace a session's ``verify``; the configured certificate must win.
    """
    import requests

    class PinnedVerifySession(requests.Session):
        def merge_environment_settings(self, url: Any, proxies: Any, stream: Any, verify: Any,
                                       cert: Any) -> Any:
            settings = super().merge_environment_settings(url, proxies, stream, verify, cert)
            settings["verify"] = certificate_file
            return settings

    session = PinnedVerifySession()
    session.verify = certificate_file
    return session


def _http_endpoint(cfg: OTLPConfig, path: str) -> dict[str, Any]:
    if not cfg.endpoint:
        return {}  # the exporter derives it from OTEL_EXPORTER_OTLP_[TRACES_|METRICS_]ENDPOINT
    ep = cfg.endpoint.rstrip("/")
    return {"endpoint": ep if ep.endswith(path) else ep + path}


def make_span_exporter(cfg: OTLPConfig, sdk_logs: SdkLogFold) -> SpanExporter | None:
    """Build an OTLP span exporter, or None when no endpoint is configured.

    The SDK's exporter, subclassed (:func:`rltrace.recording.otel_context.encoded_exporter_class`) so that
    it also sends requests rltrace encoded from its records directly.  Its own log lines (and
    the metric exporter's) are folded into ``sdk_logs`` from now on.
    """
    if not otlp_endpoint(cfg):
        return None
    proto = otlp_protocol(cfg)
    fold_sdk_logs(sdk_logs)
    kwargs = _exporter_kwargs(cfg, proto)
    if proto == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        cls: type = encoded_exporter_class(OTLPSpanExporter) or OTLPSpanExporter
        return cls(endpoint=cfg.endpoint or None, **kwargs)  # type: ignore[no-any-return]
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HTTPExporter

    cls = encoded_exporter_class(HTTPExporter) or HTTPExporter
    return cls(**_http_endpoint(cfg, "/v1/traces"), **kwargs)  # type: ignore[no-any-return]


def make_metric_exporter(cfg: OTLPConfig) -> MetricExporter | None:
    """An OTLP metric exporter for the same endpoint, or None when none is configured.

    None as well when ``otlp.metrics`` is false or ``OTEL_METRICS_EXPORTER=none``.
    """
    if not cfg.metrics or os.environ.get("OTEL_METRICS_EXPORTER", "").strip().lower() == "none":
        return None
    if not (cfg.endpoint or _env("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")):
        return None
    proto = otlp_protocol(cfg)
    kwargs = _exporter_kwargs(cfg, proto)
    if proto == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

        return OTLPMetricExporter(endpoint=cfg.endpoint or None, **kwargs)
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
        OTLPMetricExporter as HTTPMetricExporter,
    )

    return HTTPMetricExporter(**_http_endpoint(cfg, "/v1/metrics"), **kwargs)


def _compression(name: str, proto: str) -> object:
    name = name.strip().lower()
    if proto == "grpc":
        from grpc import Compression

        table = {"gzip": Compression.Gzip, "none": Compression.NoCompression,
                 "deflate": Compression.Deflate}
    else:
        from opentelemetry.exporter.otlp.proto.http import Compression as HTTPCompression

        table = {"gzip": HTTPCompression.Gzip, "none": HTTPCompression.NoCompression,
                 "deflate": HTTPCompression.Deflate}
    if name not in table:
        raise ConfigError(
            f"rltrace config key 'otlp.compression' must be one of {sorted(table)}, got {name!r}"
        )
    return table[name]
