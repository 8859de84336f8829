"""Configuration: the config dataclasses, loading from dict/YAML/dataclass, env overrides, log dir.

Precedence, lowest to highest: defaults < the ``config`` passed to :func:`rltrace.configure`
(a dataclass, a mapping or a YAML path) < ``RLTRACE_*`` environment variables < keyword
overrides.  The standard ``OTEL_*`` variables keep their OpenTelemetry meaning and are read by
the OTel SDK/exporters themselves (e.g. ``OTEL_SERVICE_NAME``, ``OTEL_EXPORTER_OTLP_ENDPOINT``).

Keys follow AReaL's ``perf_tracer`` section (``enabled``, ``experiment_name``, ``trial_name``,
``fileroot``, ``save_interval``, ``session_tracer: {enabled, flush_threshold}``) so an existing
AReaL YAML file loads unchanged; rltrace's own keys sit beside them.
"""

from __future__ import annotations

import dataclasses
import difflib
import getpass
import importlib.util
import logging
import os
import re
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit

if typing.TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = [
    "ConfigError",
    "DeviceConfig",
    "ExportTuning",
    "ExportersConfig",
    "OTLPConfig",
    "SamplingConfig",
    "SessionTracerConfig",
    "SpanLimitsConfig",
    "TracerConfig",
    "load_config",
    "log_dir",
    "redact_endpoint",
    "redact_urls",
    "redacted",
]

ENV_PREFIX = "RLTRACE_"
logger = logging.getLogger("rltrace")


class ConfigError(ValueError):
    """A configuration value is unknown, of the wrong type, or unusable (names key and fix)."""


#: the userinfo (``user:password@``) of a URL's authority, with or without a scheme
_USERINFO = re.compile(r"^(\s*(?:[A-Za-z][A-Za-z0-9+.-]*://)?)[^/?#\s]*@")
#: the userinfo of every ``scheme://`` URL inside a text
_USERINFO_IN_TEXT = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)[^/?#\s@]*(?:@[^/?#\s@]*)*@")


_T = typing.TypeVar("_T")
_Section = typing.TypeVar("_Section", bound="DataclassInstance")


def redact_endpoint(endpoint: _T) -> _T:
    """``endpoint`` as it may be shown or saved: the userinfo of the URL (``user:password@``,
    which HTTP exporters send as basic auth) replaced by ``<redacted>@``; any other value
    unchanged.  The one helper every place that prints or writes the endpoint uses; the
    exporter itself gets the real value."""
    if not isinstance(endpoint, str) or "@" not in endpoint:
        return endpoint
    return typing.cast(_T, _USERINFO.sub(r"\1<redacted>@", endpoint, count=1))


def redact_urls(text: str) -> str:
    """``text`` (a log line, an error) with the userinfo of every URL in it redacted (see
    :func:`redact_endpoint`)."""
    return _USERINFO_IN_TEXT.sub(r"\1<redacted>@", text) if "@" in text else text


@dataclass
class SessionTracerConfig:
    """Per-session lifecycle tracing (AReaL's ``perf_tracer.session_tracer``)."""

    enabled: bool = False
    #: finished sessions buffered before ``sessions-r{rank}.jsonl`` is appended to
    flush_threshold: int = 100
    #: keep every finished session in a ring that survives SIGKILL (:mod:`rltrace.sessions.flight`)
    flight_recorder: bool = True


@dataclass
class OTLPConfig:
    """OTLP export.  Off unless an endpoint is set here or in ``OTEL_EXPORTER_OTLP_*``."""

    endpoint: str | None = None
    #: ``grpc`` or ``http/protobuf``; ``None`` follows ``OTEL_EXPORTER_OTLP_PROTOCOL`` (default grpc)
    protocol: str | None = None
    #: extra headers (e.g. auth); never written to ``config.yaml``, logs or reprs
    headers: dict[str, str] = field(default_factory=dict, repr=False)
    #: ``gzip``/``none``; ``None`` follows the OTel variables
    compression: str | None = None
    timeout_s: float | None = None
    insecure: bool | None = None
    certificate_file: str | None = None
    #: spans waiting to be sent; beyond it they are counted as dropped (never blocks training)
    max_queue_size: int = 65_536
    #: spans per export request (the SDK's ``BatchSpanProcessor`` sends 512: the sender thread
    #: then waits for the GIL once per 512 spans, and a burst overflows its queue); a request
    #: over 3 MiB is sent in halves, under the 4 MiB gRPC receivers accept
    max_export_batch_size: int = 2_048
    #: also export the session metrics over OTLP (off as well when OTEL_METRICS_EXPORTER=none;
    #: some trace-only backends, e.g. Phoenix, refuse metrics)
    metrics: bool = True

    def __repr__(self) -> str:
        """The fields but ``headers``, the endpoint's userinfo redacted (never a secret)."""
        shown = (f"{f.name}={redact_endpoint(getattr(self, f.name))!r}"
                 for f in dataclasses.fields(self) if f.repr)
        return f"{type(self).__name__}({', '.join(shown)})"


#: the values of ``sampling.mode`` (see :mod:`rltrace.pipeline.sampling`)
SAMPLING_MODES = ("parent", "ratio", "always_off", "sessions")


@dataclass
class SamplingConfig:
    """Which traces leave the process over OTel (OTLP, span processors); see :mod:`rltrace.pipeline.sampling`.

    The Chrome file, session records and metrics always see every span and session.
    """

    #: ``parent`` (follow a foreign parent's flag, sample roots), ``ratio`` (that fraction of
    #: traces, by trace id, whole), ``always_off``, ``sessions`` (whole task traces for OTLP: a
    #: ``ratio`` of tasks plus every task with a failed, rejected or slow session, decided
    #: when the task ends); None follows ``OTEL_TRACES_SAMPLER``/``OTEL_TRACES_SAMPLER_ARG``
    mode: str | None = None
    #: fraction kept by ``ratio``/``sessions``; None: ``OTEL_TRACES_SAMPLER_ARG`` or 1.0
    ratio: float | None = None
    #: ``sessions``: keep every task with a session finalized with one of these statuses
    keep_statuses: list[str] = field(default_factory=lambda: ["failed", "rejected"])
    #: ``sessions``: and every task with a session this slow or slower (seconds); None: off
    slow_s: float | None = None
    #: ``sessions``: most spans held awaiting their task's decision (then the oldest is decided)
    max_held: int = 65_536


@dataclass
class SpanLimitsConfig:
    """The OTel span limits for exported spans; unset keys follow the standard variables
    (``OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT``, ``OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT``,
    ``OTEL_SPAN_EVENT_COUNT_LIMIT``, ...) and then the SDK's defaults.  The local Chrome file
    keeps every attribute and instant."""

    #: attributes per span (oldest dropped beyond it, counted on the span)
    attribute_count: int | None = None
    #: longest string attribute value (truncated beyond it)
    attribute_value_length: int | None = None
    #: events per span (rltrace instants inside a scope, ``add_event``)
    event_count: int | None = None
    link_count: int | None = None
    #: attributes per event and per link
    event_attribute_count: int | None = None
    link_attribute_count: int | None = None


@dataclass
class DeviceConfig:
    """Config-wide device options by span category (see :mod:`rltrace.device`)."""

    #: categories whose scopes wait for the device at entry/exit (e.g. ``[compute, comm]``)
    sync_categories: list[str] = field(default_factory=list)
    #: categories whose scopes record CUDA events (``device_timing="events"``)
    timing_categories: list[str] = field(default_factory=list)
    #: emit every scope as an NVTX range / JAX TraceAnnotation too
    annotate: bool = False


class DeviceDefaults:
    """Config-wide device options by category (``device:`` in the config): made by each
    pipeline from its config, put in force by ``configure`` (``recorder.STATE.device``, read by
    :mod:`rltrace.spans` and :mod:`rltrace.device`)."""

    __slots__ = ("annotate", "sync", "timing")

    def __init__(self, sync: Iterable[str] = (), timing: Iterable[str] = (),
                 annotate: bool = False) -> None:
        self.sync: frozenset[str] = frozenset(sync)
        self.timing: frozenset[str] = frozenset(timing)
        self.annotate = bool(annotate)

    @classmethod
    def of(cls, cfg: DeviceConfig) -> DeviceDefaults | None:
        """The defaults a :class:`~rltrace.config.DeviceConfig` asks for; None when it asks for
        none (the hot path then pays one ``is None`` check)."""
        d = cls(cfg.sync_categories, cfg.timing_categories, cfg.annotate)
        return d if d.sync or d.timing or d.annotate else None


@dataclass
class ExportersConfig:
    """Which built-in outputs are on."""

    #: per-rank Chrome-trace JSONL file ``perf_tracer/traces-r{rank}.jsonl``
    chrome: bool = True
    #: per-rank native Perfetto trace ``perf_tracer/traces-r{rank}.pftrace`` written as the run
    #: goes, from the records the Chrome exporter writes (needs ``chrome`` and the ``perfetto`` extra;
    #: :mod:`rltrace.timeline.stream`)
    native: bool = False
    #: sessions whose counter samples a rank's native trace keeps for its end (about 50 bytes
    #: each; the slices are drawn for every session)
    native_counter_cap: int = 1_000_000


@dataclass
class ExportTuning:
    """How the export loop shares work between recording threads and its exporter thread.

    The defaults suit a training loop on a GIL build; tests and unusual workloads set them here
    (``export_tuning: {help_rate: 0}``, ``RLTRACE_EXPORT_TUNING_HELP_RATE=0``) instead of
    patching module constants.  See :meth:`rltrace.pipeline.loop.Pipeline.help` for the policy.
    """

    #: queued records at which the exporter thread is woken (at most a quarter of
    #: ``max_queue_size``)
    wake_at: int = 8192
    #: queued records from which a recording thread offers to run export cycles itself
    help_at: int = 512
    #: records per second from which a recording thread exports them itself instead of waking
    #: the exporter thread (0: at any rate): that fast, the recording thread holds the GIL most
    #: of the time, so the exporter thread's cycle would stall it just as long
    help_rate: float = 10_000
    #: queued records past which a recording thread helps whatever the rate (the exporter
    #: thread is not keeping up)
    help_backlog: int = 16384
    #: records per export cycle of the exporter thread and of a helping thread (the lock is
    #: free between cycles); an explicit flush takes everything
    cycle_max: int = 2048
    #: how long a helping thread waits for a running cycle before backing off (seconds)
    help_wait_s: float = 0.1
    #: whether threads share one GIL; None: ask the interpreter (False on a free-threaded build
    #: running without it, where a recording thread never helps)
    shared_gil: bool | None = None


@dataclass
class TracerConfig:
    """Everything :func:`rltrace.configure` accepts.  AReaL's keys first, then rltrace's own."""

    enabled: bool = True
    experiment_name: str = "default"
    trial_name: str = "trial0"
    fileroot: str = "./rltrace-logs"
    #: ``save(step)`` flushes on the last step of every interval, ``(step + 1) % save_interval
    #: == 0`` (AReaL's rule: steps 2, 5, 8, ... for 3)
    save_interval: int = 1
    #: ``None`` (AReaL's default) means session tracing off
    session_tracer: SessionTracerConfig = field(default_factory=SessionTracerConfig)
    #: steps whose ``trace_scope(..., enable_profiler=True, args={"global_step": n})`` run
    #: torch.profiler (AReaL's rule; see :mod:`rltrace.perf_tracer`)
    profile_steps: list[int] | None = None
    # --- rltrace's own ---------------------------------------------------------------
    #: OTel ``service.name``; ``None`` uses ``OTEL_SERVICE_NAME`` or ``"rltrace"``
    service_name: str | None = None
    #: role of this process (trainer, rollout, reward, ...): AReaL's ``perf_tracer/{role}/`` and
    #: ``session_tracer/{role}/`` folders, ``role`` in session records and event args, and
    #: the process names
    role: str | None = None
    rank: int | None = None
    world_size: int | None = None
    otlp: OTLPConfig = field(default_factory=OTLPConfig)
    #: which traces are sent over OTel (the local files always get everything)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    #: span limits for exported spans (unset: the OTEL_*_LIMIT variables, then SDK defaults)
    span_limits: SpanLimitsConfig = field(default_factory=SpanLimitsConfig)
    exporters: ExportersConfig = field(default_factory=ExportersConfig)
    device: DeviceConfig = field(default_factory=DeviceConfig)
    #: the background exporter wakes at least this often (seconds)
    flush_interval_s: float = 1.0
    #: how recording threads and the exporter thread share the export work
    export_tuning: ExportTuning = field(default_factory=ExportTuning)
    #: with session tracing on, publish this rank's live state (open sessions, current step) to
    #: ``live/live-r{rank}.json`` at most this often, for ``rltrace top`` (seconds; 0: off)
    live_interval_s: float = 2.0
    #: most finished spans held in memory awaiting export; beyond it spans are counted as dropped
    max_queue_size: int = 262_144
    #: make rltrace's provider the global OTel tracer provider (if none is set yet)
    set_global_provider: bool = True
    #: flush and close everything at interpreter exit
    flush_at_exit: bool = True
    #: collect the run summary (per-scope count/total/p50/p99, counters; ``rltrace.summary()``)
    #: and print it at shutdown
    print_summary: bool = False
    #: forked children (dataloader workers): ``trace`` into their own ``-p{pid}`` files, or
    #: ``disable`` tracing in them
    fork_mode: str = "trace"
    #: name output files ``traces-r{rank}-p{pid}.jsonl`` (set for spawned/forked children)
    per_process_files: bool = False
    #: on SIGTERM, flush everything (open sessions written as pending), then terminate as before
    handle_sigterm: bool = True
    #: user name in the log dir; ``None`` uses the login name
    user: str | None = None


_SECRET_KEYS: frozenset[tuple[str, str]] = frozenset({("otlp", "headers")})


# --------------------------------------------------------------------------------------------
# loading


def load_config(
    config: object = None,
    *,
    env: Mapping[str, str] | None = None,
    warned: set[str] | None = None,
    **overrides: object,
) -> TracerConfig:
    """Build a validated :class:`TracerConfig` from ``config``, ``RLTRACE_*`` env and overrides.

    ``config`` may be a :class:`TracerConfig`, any dataclass with the same keys (e.g. AReaL's
    ``PerfTracerConfig``), a mapping, a path to a YAML file (whose top level is either the
    tracer section itself or a document with a ``perf_tracer``/``rltrace`` section), or None.
    Raises :class:`ConfigError` naming the offending key and the fix.  An unknown ``RLTRACE_*``
    variable is ignored with a warning, once per name in ``warned`` (the caller's record of the
    names already warned about; None: warn on every call).
    """
    data: dict[str, object] = {}
    source = "config"
    if config is None:
        pass
    elif isinstance(config, (str, os.PathLike)):
        source = str(config)
        data = _read_yaml(Path(config))
    elif _is_omegaconf(config):  # before Mapping: a DictConfig is one, with lazy interpolation
        plain = _omegaconf_plain(config)
        if not isinstance(plain, Mapping):
            raise ConfigError("rltrace.configure: an OmegaConf config must be a mapping (DictConfig), "
                              f"got {type(config).__name__}")
        data = _plain(plain)
    elif dataclasses.is_dataclass(config) and not isinstance(config, type):
        data = dataclass_to_dict(config)
    elif isinstance(config, Mapping):
        data = _plain(config)
    else:
        raise ConfigError(
            f"rltrace.configure: config must be a TracerConfig, a dict, a dataclass or a path to a "
            f"YAML file, got {type(config).__name__}"
        )
    cfg = _build(TracerConfig, data, prefix="", source=source)
    for path, raw in _env_overrides(env if env is not None else os.environ,
                                    set() if warned is None else warned):
        _apply(cfg, path, raw, source="environment variable " + ENV_PREFIX + "_".join(path).upper())
    for key, value in overrides.items():
        if value is None:
            continue
        path = tuple(key.split("__")) if "__" in key else (key,)
        _apply(cfg, path, value, source=f"keyword argument {key}=")
    _check_values(cfg)
    return cfg


def _read_yaml(path: Path) -> dict[str, object]:
    import yaml

    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"rltrace config file {str(path)!r} cannot be read: {exc}") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"rltrace config file {str(path)!r} is not valid YAML: {exc}") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ConfigError(
            f"rltrace config file {str(path)!r} must hold a mapping, got {type(doc).__name__}"
        )
    section = next((s for s in ("rltrace", "perf_tracer") if isinstance(doc.get(s), dict)), None)
    mapping = _interpolate(doc if section is None else doc[section], doc, str(path))
    return mapping if isinstance(mapping, dict) else {}


_REF = re.compile(r"\$\{([^}]*)\}")


def _interpolate(node: object, root: Mapping[str, object], source: str, depth: int = 0) -> object:
    """Resolve OmegaConf-style ``${a.b}`` and ``${oc.env:VAR[,default]}`` as AReaL files use."""
    if isinstance(node, dict):
        return {k: _interpolate(v, root, source, depth) for k, v in node.items()}
    if isinstance(node, list):
        return [_interpolate(v, root, source, depth) for v in node]
    if not isinstance(node, str) or "${" not in node:
        return node
    if depth > 16:
        raise ConfigError(f"rltrace config file {source!r}: interpolation loop in {node!r}")

    def lookup(ref: str) -> object:
        ref = ref.strip()
        if ref.startswith("oc.env:"):
            name, _, default = ref[len("oc.env:"):].partition(",")
            value = os.environ.get(name.strip(), default.strip() if default else None)
            if value is None:
                raise ConfigError(f"rltrace config file {source!r}: ${{{ref}}} names an unset "
                                  f"environment variable; set {name.strip()} or give a default")
            return value
        cur: object = root
        for part in ref.split("."):
            if not isinstance(cur, dict) or part not in cur:
                raise ConfigError(f"rltrace config file {source!r}: cannot resolve ${{{ref}}} "
                                  f"(no key {ref!r} in the file); write the value instead")
            cur = cur[part]
        return _interpolate(cur, root, source, depth + 1)

    whole = _REF.fullmatch(node)
    if whole:
        return lookup(whole.group(1))
    return _REF.sub(lambda m: str(lookup(m.group(1))), node)


def _is_omegaconf(obj: object) -> bool:
    """An OmegaConf ``DictConfig``/``ListConfig`` (checked by name: omegaconf is optional)."""
    return type(obj).__name__ in ("DictConfig", "ListConfig") and \
        type(obj).__module__.startswith("omegaconf")


def _omegaconf_plain(obj: object) -> object:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(obj, resolve=True)


def dataclass_to_dict(obj: DataclassInstance) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            v = dataclass_to_dict(v)
        elif _is_omegaconf(v):
            v = _omegaconf_plain(v)
        out[f.name] = v
    return out


def _plain(m: Mapping[object, object]) -> dict[str, object]:
    out: dict[str, object] = {}
    for k, v in m.items():
        if _is_omegaconf(v):
            v = _omegaconf_plain(v)
        out[str(k)] = _plain(v) if isinstance(v, Mapping) else v
    return out


def _build(cls: type[_Section], data: Mapping[str, object], *, prefix: str, source: str) -> _Section:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs: dict[str, Any] = {}  # checked against the annotations by _coerce
    for key, value in data.items():
        full = f"{prefix}{key}"
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f"; did you mean {prefix + close[0]!r}?" if close else ""
            raise ConfigError(
                f"unknown rltrace config key {full!r} (in {source}){hint} "
                f"Known keys{' under ' + prefix.rstrip('.') if prefix else ''}: {', '.join(names)}"
            )
        kwargs[key] = _coerce(hints[key], value, full, source)
    return cls(**kwargs)


def _coerce(tp: object, value: object, key: str, source: str) -> object:
    """Check ``value`` against annotation ``tp``; convert strings from env/YAML where safe."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return _coerce_union(typing.get_args(tp), value, key, source)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _coerce_section(tp, value, key, source)
    if tp is bool:
        return _coerce_bool(value, key, source)
    if tp is int:
        return _coerce_int(value, key, source)
    if tp is float:
        return _coerce_float(value, key, source)
    if tp is str:
        return _coerce_str(value, key, source)
    if origin is dict:
        return _coerce_str_dict(value, key, source)
    if origin is list:
        return _coerce_list(typing.get_args(tp)[0], value, key, source)
    return value


def _coerce_union(args: tuple[object, ...], value: object, key: str, source: str) -> object:
    """An ``X | Y | None`` value: ``None`` where allowed, else the first member type that accepts it.

    When no member accepts the value, the first member's error is raised.
    """
    if value is None and type(None) in args:
        return None
    errors = []
    for a in args:
        if a is type(None):
            continue
        try:
            return _coerce(a, value, key, source)
        except ConfigError as exc:
            errors.append(exc)
    raise errors[0]


def _coerce_section(tp: type[_Section], value: object, key: str, source: str) -> _Section:
    """A nested config section (dataclass ``tp``) from an instance, ``None``, a dataclass or a mapping."""
    if isinstance(value, tp):
        return value
    if value is None:  # e.g. AReaL's ``session_tracer: null``: the section's defaults (off)
        return tp()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclass_to_dict(value)
    if not isinstance(value, Mapping):
        raise _type_error(key, value, f"a mapping of {tp.__name__} keys", source)
    return _build(tp, value, prefix=key + ".", source=source)


def _coerce_bool(value: object, key: str, source: str) -> bool:
    """A boolean, or one of the words in ``_BOOLS`` (any case, surrounding blanks ignored)."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _BOOLS:
        return _BOOLS[value.strip().lower()]
    raise _type_error(key, value, "a boolean (true/false)", source)


def _coerce_int(value: object, key: str, source: str) -> int:
    """An integer (not a bool), or a string that parses as one."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise _type_error(key, value, "an integer", source)


def _coerce_float(value: object, key: str, source: str) -> float:
    """A number (int or float, not a bool) as a float, or a string that parses as one."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value.strip())
        except ValueError:
            pass
    raise _type_error(key, value, "a number", source)


def _coerce_str(value: object, key: str, source: str) -> str:
    """A string, or a path-like object as its ``os.fspath``."""
    if isinstance(value, str):
        return value
    if isinstance(value, os.PathLike):
        path = os.fspath(value)
        if isinstance(path, str):
            return path
    raise _type_error(key, value, "a string", source)


def _coerce_str_dict(value: object, key: str, source: str) -> dict[str, str]:
    """A ``dict[str, str]`` from a mapping or a ``"k1=v1,k2=v2"`` string (keys and values stringified)."""
    if isinstance(value, str):  # "k1=v1,k2=v2" as in OTEL_EXPORTER_OTLP_HEADERS
        value = _parse_kv(value, key, source)
    if not isinstance(value, Mapping):
        raise _type_error(key, value, "a mapping of strings", source)
    return {str(k): str(v) for k, v in value.items()}


def _coerce_list(item_tp: object, value: object, key: str, source: str) -> list[object]:
    """A list of ``item_tp`` from a list, a tuple or a comma/blank separated string; items coerced."""
    if isinstance(value, str):
        value = [v for v in value.replace(",", " ").split() if v]
    if not isinstance(value, (list, tuple)):
        raise _type_error(key, value, "a list", source)
    return [_coerce(item_tp, v, f"{key}[{i}]", source) for i, v in enumerate(value)]


_BOOLS: Mapping[str, bool] = MappingProxyType({
    "1": True, "true": True, "yes": True, "on": True,
    "0": False, "false": False, "no": False, "off": False,
})


def _parse_kv(text: str, key: str, source: str) -> dict[str, str]:
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        if "=" not in part:
            raise ConfigError(
                f"rltrace config key {key!r} (in {source}): expected 'name=value' pairs separated "
                f"by commas, got a value without '=' (not shown: it may be a secret)"
            )
        k, v = part.split("=", 1)
        out[k.strip()] = v.strip()
    return out


def _type_error(key: str, value: object, expected: str, source: str) -> ConfigError:
    shown = "<redacted>" if key.startswith("otlp.headers") else repr(redact_endpoint(value))
    return ConfigError(
        f"rltrace config key {key!r} (in {source}) must be {expected}, "
        f"got {type(value).__name__} {shown}"
    )


def _env_paths(cls: type = TracerConfig, prefix: tuple[str, ...] = ()) -> dict[str, tuple[str, ...]]:
    """Map ``RLTRACE_*`` variable names to config paths (nested keys joined by ``_``)."""
    out: dict[str, tuple[str, ...]] = {}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        path = (*prefix, f.name)
        if dataclasses.is_dataclass(hints[f.name]):
            out.update(_env_paths(hints[f.name], path))
        else:
            out[ENV_PREFIX + "_".join(path).upper()] = path
    return out


_ENV_PATHS: Mapping[str, tuple[str, ...]] = MappingProxyType(_env_paths())


def _env_overrides(env: Mapping[str, str], warned: set[str]) -> list[tuple[tuple[str, ...], str]]:
    out = []
    for name, value in env.items():
        if not name.startswith(ENV_PREFIX):
            continue
        path = _ENV_PATHS.get(name)
        if path is None:
            if name in _ENV_IGNORED:
                continue
            if name not in warned:  # a stray variable must not stop training: warn once
                warned.add(name)
                close = difflib.get_close_matches(name, list(_ENV_PATHS), n=1)
                hint = f"; did you mean {close[0]}?" if close else ""
                logger.warning("rltrace: ignoring unknown environment variable %s%s", name, hint)
            continue
        out.append((path, value))
    return out


#: RLTRACE_* variables used by tools rather than the config (e.g. the test-suite)
_ENV_IGNORED = frozenset({"RLTRACE_PERFETTO_CHECK", "RLTRACE_PARENT_CONFIG",
                          "RLTRACE_PARENT_SECRETS", "RLTRACE_AREAL_WHEEL", "RLTRACE_OPENRLHF_SITE",
                          "RLTRACE_WHEELHOUSE"})


def _apply(cfg: DataclassInstance, path: tuple[str, ...], value: object, *, source: str) -> None:
    obj = cfg
    for i, part in enumerate(path):
        names = [f.name for f in dataclasses.fields(obj)]
        if part not in names:
            key = ".".join(path[: i + 1])
            close = difflib.get_close_matches(part, names, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"unknown rltrace config key {key!r} (from {source}){hint}")
        if i == len(path) - 1:
            tp = typing.get_type_hints(type(obj))[part]
            setattr(obj, part, _coerce(tp, value, ".".join(path), source))
        else:
            obj = getattr(obj, part)


def _check_values(cfg: TracerConfig) -> None:
    def need(cond: bool, key: str, msg: str) -> None:
        if not cond:
            raise ConfigError(f"rltrace config key {key!r}: {msg}")

    need(cfg.save_interval >= 1, "save_interval", f"must be >= 1, got {cfg.save_interval}")
    need(cfg.session_tracer.flush_threshold >= 1, "session_tracer.flush_threshold",
         f"must be >= 1, got {cfg.session_tracer.flush_threshold}")
    need(cfg.max_queue_size >= 1, "max_queue_size", f"must be >= 1, got {cfg.max_queue_size}")
    need(cfg.otlp.max_queue_size >= 1, "otlp.max_queue_size",
         f"must be >= 1, got {cfg.otlp.max_queue_size}")
    need(cfg.otlp.max_export_batch_size >= 1, "otlp.max_export_batch_size",
         f"must be >= 1, got {cfg.otlp.max_export_batch_size}")
    need(cfg.flush_interval_s > 0, "flush_interval_s", f"must be > 0, got {cfg.flush_interval_s}")
    need(cfg.live_interval_s >= 0, "live_interval_s",
         f"must be >= 0 (0 turns the live state off), got {cfg.live_interval_s}")
    need(cfg.rank is None or cfg.rank >= 0, "rank", f"must be >= 0, got {cfg.rank}")
    need(cfg.world_size is None or cfg.world_size >= 1, "world_size",
         f"must be >= 1, got {cfg.world_size}")
    for key in ("experiment_name", "trial_name"):
        v = getattr(cfg, key)
        need(folder_name_ok(v), key, f"must be a non-empty name without '/' or NUL (or any "
                                     f"control character: a newline, a tab), got {v!r}")
    for key in ("role", "user"):
        v = getattr(cfg, key)
        need(v is None or folder_name_ok(v), key,
             f"must be a non-empty name without '/' or NUL (or any control character: a "
             f"newline, a tab; it names a folder), got {v!r}")
    if cfg.exporters.native:
        need(cfg.exporters.chrome, "exporters.native",
             "is drawn from the Chrome lines: it needs exporters.chrome on")
        need(importlib.util.find_spec("perfetto") is not None, "exporters.native",
             "needs the perfetto package: pip install 'rltrace[perfetto]' (the README's install, "
             "'.[dev]', has it), or turn it off and run `rltrace convert LOGDIR -o run.pftrace`")
    need(cfg.fork_mode in ("trace", "disable"), "fork_mode",
         f"must be 'trace' or 'disable', got {cfg.fork_mode!r}")
    proto = cfg.otlp.protocol
    need(proto in (None, "grpc", "http/protobuf", "http"), "otlp.protocol",
         f"must be 'grpc' or 'http/protobuf' ('http' is read as 'http/protobuf'), got {proto!r}"
         + _suggest(proto, ("grpc", "http/protobuf")))
    problem = endpoint_problem(cfg.otlp.endpoint, proto)
    need(problem is None, "otlp.endpoint", f"{problem}, got {redact_endpoint(cfg.otlp.endpoint)!r}")
    smp = cfg.sampling
    modes = SAMPLING_MODES
    need(smp.mode is None or smp.mode in modes, "sampling.mode",
         f"must be one of {', '.join(modes)} (or unset to follow OTEL_TRACES_SAMPLER), "
         f"got {smp.mode!r}" + _suggest(smp.mode, modes))
    need(smp.ratio is None or 0.0 <= smp.ratio <= 1.0, "sampling.ratio",
         f"must be in [0, 1], got {smp.ratio!r}")
    need(smp.slow_s is None or smp.slow_s > 0, "sampling.slow_s", f"must be > 0, got {smp.slow_s!r}")
    need(smp.max_held >= 1, "sampling.max_held", f"must be >= 1, got {smp.max_held}")
    for key, value in vars(cfg.span_limits).items():
        need(value is None or (type(value) is int and value >= 0), f"span_limits.{key}",
             f"must be an integer >= 0 (or unset to follow the OTEL_*_LIMIT variables), got {value!r}")
    statuses = ("accepted", "rejected", "failed", "dropped", "pending")
    bad = [x for x in smp.keep_statuses if x not in statuses]
    need(not bad, "sampling.keep_statuses", f"must be among {', '.join(statuses)}, got {bad}")
    _check_tuning(cfg.export_tuning, need)


def _check_tuning(t: ExportTuning, need: Callable[[bool, str, str], None]) -> None:
    for key in ("wake_at", "help_at", "help_backlog", "cycle_max"):
        v = getattr(t, key)
        need(v >= 1, f"export_tuning.{key}", f"must be >= 1, got {v}")
    need(t.help_rate >= 0, "export_tuning.help_rate",
         f"must be >= 0 (0: a recording thread helps at any rate), got {t.help_rate}")
    need(t.help_wait_s >= 0, "export_tuning.help_wait_s", f"must be >= 0, got {t.help_wait_s}")


# --------------------------------------------------------------------------------------------
# derived values


def endpoint_problem(endpoint: str | None, protocol: str | None) -> str | None:
    """What is wrong with an OTLP ``endpoint`` (None: nothing, or no endpoint): it must be an
    ``http://`` or ``https://`` URL with a host and a port in 1..65535 if one is given (or, for
    gRPC, a bare ``host:port``)."""
    if endpoint is None:
        return None
    if type(endpoint) is not str or not endpoint.strip():
        return "must be a URL such as http://127.0.0.1:4317"
    bare = "://" not in endpoint
    if bare and (protocol or "grpc").lower() != "grpc":
        return "must start with http:// or https:// (e.g. http://127.0.0.1:4318)"
    parts = urlsplit(("http://" if bare else "") + endpoint.strip())
    if parts.scheme not in ("http", "https"):
        return (f"must start with http:// or https:// (the scheme {parts.scheme!r} is not "
                f"OTLP's{_suggest(parts.scheme, ('http', 'https'))})")
    if not parts.hostname or " " in endpoint:
        return "must name a host, as in http://collector:4317"
    try:
        port = parts.port
    except ValueError:
        return "must have a port in 1..65535"
    if port == 0:
        return "must have a port in 1..65535"
    return None


#: characters no folder of the log dir is named with: path separators and control characters
#: (NUL, a newline that would split a listing's lines, escapes that would rewrite a terminal)
_NOT_IN_FOLDER_NAMES = re.compile(r"[/\\\x00-\x1f\x7f-\x9f\u2028\u2029]")


def folder_name_ok(name: str) -> bool:
    """Whether ``name`` can name one folder of the log dir: not empty, ``.`` or ``..``, and
    without a path separator or a control character (NUL, newline, tab, escape...)."""
    return type(name) is str and bool(name) and name not in (".", "..") \
        and _NOT_IN_FOLDER_NAMES.search(name) is None


def current_user() -> str:
    """The login name used in the log dir (``unknown`` when none can be found)."""
    try:
        return getpass.getuser()
    except Exception:
        return "unknown"


def _suggest(value: object, choices: tuple[str, ...]) -> str:
    close = difflib.get_close_matches(str(value), choices, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def log_dir(cfg: TracerConfig) -> Path:
    """``{fileroot}/logs/{user}/{experiment_name}/{trial_name}/`` (not created).  A login name
    from the environment (``LOGNAME``, ``USER``) that cannot name a folder raises
    :class:`ConfigError`."""
    user = cfg.user or current_user()
    if not folder_name_ok(user):
        raise ConfigError(
            f"rltrace: the login name {user!r} (from LOGNAME / USER) cannot name the log dir's "
            f"user folder; set the config key 'user' (or RLTRACE_USER) to a plain name")
    return Path(cfg.fileroot).expanduser() / "logs" / user / cfg.experiment_name / cfg.trial_name


def redacted(cfg: TracerConfig) -> dict[str, Any]:
    """The config as a plain dict with secrets (OTLP headers, the endpoint's userinfo) replaced
    by ``<redacted>``."""
    data = dataclass_to_dict(cfg)
    for path in _SECRET_KEYS:
        node = data
        for p in path[:-1]:
            node = node[p]
        if node.get(path[-1]):
            node[path[-1]] = {k: "<redacted>" for k in node[path[-1]]}
    data["otlp"]["endpoint"] = redact_endpoint(data["otlp"]["endpoint"])
    return data
