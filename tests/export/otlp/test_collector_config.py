"""Structural tests of collector-config/ and docker-compose.yml.

There is no Docker engine and no collector binary on the development machines, so the stack is
checked by relationships between the files: pipelines only name defined components, ports agree
between compose, the collector, Tempo, Prometheus, Grafana and rltrace's endpoint, every
published port is on 127.0.0.1, and the dashboard only uses datasources that are provisioned and
metric / label / attribute names that a real rltrace run and the collector configuration produce.
"""

from __future__ import annotations

import json
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from conftest import REPO

import rltrace
from rltrace import perf_tracer
from rltrace.testing import capture_spans

CONFIG_DIR = REPO / "collector-config"
COMPOSE_FILE = REPO / "docker-compose.yml"
COLLECTOR_FILE = CONFIG_DIR / "otel-collector.yaml"
TEMPO_FILE = CONFIG_DIR / "tempo.yaml"
PROMETHEUS_FILE = CONFIG_DIR / "prometheus.yml"
DATASOURCES_FILE = CONFIG_DIR / "grafana" / "provisioning" / "datasources" / "datasources.yaml"
DASH_PROVIDERS_FILE = CONFIG_DIR / "grafana" / "provisioning" / "dashboards" / "dashboards.yaml"
DASHBOARD_FILE = CONFIG_DIR / "grafana" / "dashboards" / "rltrace.json"
#: the documentation page of the stack (docs/guide/collector-stack.md), from its heading on
README = REPO / "docs" / "guide" / "collector-stack.md"
README_SECTION = "# Collector, Jaeger, Tempo, Grafana (docker compose)"

Cfg = dict[str, Any]

KINDS = ("receivers", "processors", "exporters", "connectors", "extensions")
# Component types renamed in collector-contrib 0.14x-0.15x: the old names still load but are
# deprecated aliases (or, for `logging`, removed).  The config must use the current names.
DEPRECATED_ALIASES = {
    "exporters": {"otlp": "otlp_grpc", "otlphttp": "otlp_http", "logging": "debug",
                  "prometheusremotewrite": "prometheus_remote_write"},
    "connectors": {"spanmetrics": "span_metrics"},
    "processors": {"spanmetrics": "span_metrics connector"},
}
# Jaeger v2's built-in all-in-one configuration: OTLP gRPC on ${JAEGER_LISTEN_HOST}:4317,
# UI/query on :16686.  Prometheus listens on :9090 unless --web.listen-address says otherwise.
JAEGER_OTLP_GRPC_PORT = 4317
JAEGER_QUERY_PORT = 16686
PROMETHEUS_DEFAULT_PORT = 9090
GRAFANA_DEFAULT_PROVISIONING = "/etc/grafana/provisioning"
# Labels every series gets from the collector's prometheus exporter / Prometheus itself.
BASE_LABELS = {"job", "instance", "__name__"}
# Labels the span_metrics connector always adds (besides the configured dimensions).
SPAN_METRICS_DEFAULT_LABELS = {"service_name", "span_name", "span_kind", "status_code",
                               "collector_instance_id"}


# ---------------------------------------------------------------------------------------------
# loading


def _yaml(path: Path) -> Any:
    with open(path, encoding="utf-8") as fh:
        return yaml.safe_load(fh)


@pytest.fixture(scope="module")
def collector() -> Cfg:
    return _yaml(COLLECTOR_FILE)


@pytest.fixture(scope="module")
def compose() -> Cfg:
    return _interpolate(_yaml(COMPOSE_FILE))


@pytest.fixture(scope="module")
def tempo() -> Cfg:
    return _yaml(TEMPO_FILE)


@pytest.fixture(scope="module")
def prometheus() -> Cfg:
    return _yaml(PROMETHEUS_FILE)


@pytest.fixture(scope="module")
def datasources() -> dict[str, dict[str, Any]]:
    return {ds["uid"]: ds for ds in _yaml(DATASOURCES_FILE)["datasources"]}


@pytest.fixture(scope="module")
def dashboard() -> Cfg:
    return json.loads(DASHBOARD_FILE.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def readme_section() -> str:
    text = README.read_text(encoding="utf-8")
    assert README_SECTION in text, f"{README} lacks the section {README_SECTION!r}"
    body = text.split(README_SECTION, 1)[1]
    return body.split("\n## ", 1)[0]


@pytest.fixture(scope="module")
def rltrace_output() -> Cfg:
    """What a real rltrace run emits: span names/attributes, resource attributes, metrics."""
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    with tempfile.TemporaryDirectory(prefix="rltrace-collector-cfg-") as tmp, capture_spans(
        tmp, session_tracer__enabled=True, role="actor", rank=0, world_size=2,
        metric_readers=[reader],
    ) as cap:
        with rltrace.step(3):
            with rltrace.trace_scope("train.rollout", "compute"):
                tid = perf_tracer.register_task()
                for status in ("accepted", "rejected"):
                    sid = perf_tracer.register_session(tid)
                    with perf_tracer.trace_session_phase("generate", session_id=sid):
                        pass
                    with perf_tracer.trace_session_phase("reward", session_id=sid):
                        pass
                    perf_tracer.trace_session_event("mark_finalized", session_id=sid, status=status)
        spans = cap.spans()
        rltrace.flush()
        metrics_data = reader.get_metrics_data()
    span_attrs: dict[str, set[str]] = {}
    resource_attrs: set[str] = set()
    for s in spans:
        span_attrs.setdefault(s.name, set()).update((s.attributes or {}).keys())
        resource_attrs.update(s.resource.attributes.keys())
    metrics: dict[str, dict[str, Any]] = {}
    metric_resource_attrs: set[str] = set()
    for rm in metrics_data.resource_metrics:
        metric_resource_attrs.update(rm.resource.attributes.keys())
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                kind = type(m.data).__name__
                entry = metrics.setdefault(m.name, {"unit": m.unit, "kind": kind,
                                                    "monotonic": getattr(m.data, "is_monotonic", None),
                                                    "attrs": set()})
                for p in m.data.data_points:
                    entry["attrs"].update(p.attributes.keys())
    assert metrics, "rltrace recorded no metrics in the reference run"
    return {"span_attrs": span_attrs, "resource_attrs": resource_attrs, "metrics": metrics,
            "metric_resource_attrs": metric_resource_attrs}


# ---------------------------------------------------------------------------------------------
# helpers

_VAR = re.compile(r"\$(?:\$|\{(?P<braced>[^}]*)\}|(?P<plain>[A-Za-z_][A-Za-z0-9_]*))")


def _interpolate(value: Any, found: list[str] | None = None) -> Any:
    """Compose's variable substitution with an empty environment (defaults only)."""
    if isinstance(value, dict):
        return {k: _interpolate(v, found) for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolate(v, found) for v in value]
    if not isinstance(value, str):
        return value

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        expr = m.group("braced") if m.group("braced") is not None else m.group("plain")
        name = re.match(r"[A-Za-z_][A-Za-z0-9_]*", expr)
        assert name, f"bad variable reference {m.group(0)!r} in docker-compose.yml"
        rest = expr[name.end():]
        if found is not None:
            found.append(name.group(0))
        for op in (":-", "-"):
            if rest.startswith(op):
                return rest[len(op):]
        raise AssertionError(
            f"{m.group(0)!r} in docker-compose.yml has no default; use ${{{name.group(0)}:-default}}"
        )

    return _VAR.sub(sub, value)


def _host_port(endpoint: str) -> tuple[str, int]:
    """``host:port`` or ``scheme://host:port[/path]`` -> (host, port)."""
    if "://" not in endpoint:
        endpoint = "//" + endpoint
    parts = urlsplit(endpoint)
    assert parts.port is not None, f"endpoint {endpoint!r} has no port"
    return parts.hostname or "", parts.port


def _ctype(component_id: str) -> str:
    return component_id.split("/", 1)[0]


def _of_type(section: Cfg | None, ctype: str) -> Cfg:
    return {cid: cfg or {} for cid, cfg in (section or {}).items() if _ctype(cid) == ctype}


def _published(service: Cfg) -> dict[int, tuple[str, int]]:
    """container port -> (host ip, host port) for a compose service's ``ports``."""
    out: dict[int, tuple[str, int]] = {}
    for spec in service.get("ports", []):
        if isinstance(spec, dict):
            host_ip = str(spec.get("host_ip", ""))
            out[int(spec["target"])] = (host_ip, int(spec.get("published", spec["target"])))
            continue
        spec = str(spec).split("/", 1)[0]
        parts = spec.rsplit(":", 2)
        if len(parts) == 3:
            host_ip, hp, cp = parts
        elif len(parts) == 2:
            host_ip, (hp, cp) = "", parts
        else:
            host_ip, hp, cp = "", "", parts[0]
        out[int(cp)] = (host_ip, int(hp) if hp else -1)
    return out


def _exposed(service: Cfg) -> set[int]:
    return {int(str(p).split("/", 1)[0]) for p in service.get("expose", [])} | set(_published(service))


def _bind_mounts(service: Cfg) -> list[tuple[str, str]]:
    mounts = []
    for v in service.get("volumes", []):
        if isinstance(v, dict):
            if v.get("type") == "bind":
                mounts.append((v["source"], v["target"]))
            continue
        parts = str(v).split(":")
        if parts[0].startswith((".", "/")):
            mounts.append((parts[0], parts[1]))
    return mounts


def _flag(command: Any, *names: str) -> str | None:
    """Value of ``--name=value`` / ``-name=value`` / ``--name value`` in a compose command."""
    args = command if isinstance(command, list) else str(command or "").split()
    for i, a in enumerate(args):
        for n in names:
            if a.startswith(n + "="):
                return a.split("=", 1)[1]
            if a == n and i + 1 < len(args):
                return args[i + 1]
    return None


def _environment(service: Cfg) -> dict[str, str]:
    env = service.get("environment", {})
    if isinstance(env, list):
        env = dict(e.split("=", 1) for e in env)
    return {k: str(v) for k, v in env.items()}


def _walk(obj: Any) -> Iterator[Any]:
    yield obj
    if isinstance(obj, dict):
        for v in obj.values():
            yield from _walk(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _walk(v)


def _pipelines(collector: Cfg) -> dict[str, dict[str, list[str]]]:
    return collector["service"]["pipelines"]


def _span_metrics(collector: Cfg) -> tuple[str, dict[str, Any]]:
    found = _of_type(collector.get("connectors"), "span_metrics")
    assert len(found) == 1, f"expected one span_metrics connector, found {sorted(found)}"
    return next(iter(found.items()))


# -- OTel -> Prometheus names (the prometheus exporter's UnderscoreEscapingWithSuffixes) --------

_UNIT_WORDS = {"s": "seconds", "ms": "milliseconds", "us": "microseconds", "ns": "nanoseconds",
               "min": "minutes", "h": "hours", "d": "days", "By": "bytes", "KiBy": "kibibytes",
               "MiBy": "mebibytes", "GiBy": "gibibytes", "%": "percent", "": ""}


def _prom_label(name: str) -> str:
    out = re.sub(r"[^A-Za-z0-9_]", "_", name)
    return "_" + out if out[:1].isdigit() else out


def _prom_names(name: str, unit: str, kind: str, monotonic: bool | None, suffixes: bool) -> set[str]:
    base = re.sub(r"_+", "_", _prom_label(name))
    if suffixes:
        unit = re.sub(r"\{[^}]*\}", "", unit or "")
        if unit == "1":
            word = "ratio" if kind == "Gauge" else ""
        else:
            assert unit in _UNIT_WORDS, f"metric {name!r}: unit {unit!r} not handled by this test"
            word = _UNIT_WORDS[unit]
        if word and not base.endswith("_" + word):
            base += "_" + word
        if kind == "Sum" and monotonic and not base.endswith("_total"):
            base += "_total"
    if kind in ("Histogram", "ExponentialHistogram"):
        if kind == "ExponentialHistogram":
            return {base}  # a native histogram: no _bucket series
        return {base + "_bucket", base + "_sum", base + "_count"}
    return {base}


def _exporter_adds_suffixes(collector: Cfg) -> bool:
    (_, prom), = _of_type(collector.get("exporters"), "prometheus").items()
    strategy = prom.get("translation_strategy")
    if strategy is not None:
        assert strategy in ("UnderscoreEscapingWithSuffixes", "UnderscoreEscapingWithoutSuffixes"), (
            f"translation_strategy {strategy!r} keeps dots in names; the dashboard expects "
            "underscore names")
        return strategy.endswith("WithSuffixes")
    return bool(prom.get("add_metric_suffixes", True))


def _copied_resource_labels(collector: Cfg, pipeline: list[str]) -> dict[str, str]:
    """datapoint attribute -> resource attribute, for transform processors in ``pipeline``."""
    out: dict[str, str] = {}
    procs = collector.get("processors") or {}
    pat = re.compile(r'set\(\s*(?:datapoint\.)?attributes\["([^"]+)"\]\s*,'
                     r'\s*resource\.attributes\["([^"]+)"\]\s*\)')
    for pid in pipeline:
        if _ctype(pid) != "transform":
            continue
        for group in procs[pid].get("metric_statements", []):
            statements = group.get("statements", []) if isinstance(group, dict) else [group]
            for st in statements:
                for dst, src in pat.findall(st):
                    out[dst] = src
    return out


def _produced_metrics(collector: Cfg, rl: Cfg) -> dict[str, set[str]]:
    """Prometheus series name -> label names, as the collector config would serve them."""
    suffixes = _exporter_adds_suffixes(collector)
    metrics_pipes = [p for n, p in _pipelines(collector).items() if _ctype(n) == "metrics"
                     and any(_ctype(e) == "prometheus" for e in p.get("exporters", []))]
    assert metrics_pipes, "no metrics pipeline exports to the prometheus exporter"
    out: dict[str, set[str]] = {"target_info": set(BASE_LABELS)}
    sm_id, sm = _span_metrics(collector)
    for pipe in metrics_pipes:
        copied = {_prom_label(k) for k in _copied_resource_labels(collector, pipe.get("processors", []))}
        common = BASE_LABELS | copied
        receivers = pipe.get("receivers", [])
        if sm_id in receivers:
            ns = sm.get("namespace", "traces.span.metrics")
            prefix = (ns + ".") if ns else ""
            dims = {_prom_label(d["name"]) for d in sm.get("dimensions", [])}
            labels = common | SPAN_METRICS_DEFAULT_LABELS | dims
            hist = sm.get("histogram") or {}
            if not hist.get("disable", False):
                kind = "ExponentialHistogram" if "exponential" in hist else "Histogram"
                for n in _prom_names(prefix + "duration", hist.get("unit", "ms"), kind, None, suffixes):
                    out.setdefault(n, set()).update(labels | ({"le"} if n.endswith("_bucket") else set()))
            for n in _prom_names(prefix + "calls", "", "Sum", True, suffixes):
                out.setdefault(n, set()).update(labels)
        if any(_ctype(r) == "otlp" for r in receivers):
            for name, m in rl["metrics"].items():
                labels = common | {_prom_label(a) for a in m["attrs"]}
                for n in _prom_names(name, m["unit"], m["kind"], m["monotonic"], suffixes):
                    out.setdefault(n, set()).update(labels | ({"le"} if n.endswith("_bucket") else set()))
    return out


# -- PromQL scanning -----------------------------------------------------------------------------

_PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or",
                 "unless", "bool", "offset", "le"}


def _promql_metric_names(expr: str) -> set[str]:
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    names = set(re.findall(r"([A-Za-z_:][A-Za-z0-9_:]*)\s*[{\[]", expr))
    names |= set(re.findall(r"label_values\(\s*([A-Za-z_:][A-Za-z0-9_:]*)\s*,", expr))
    return names


def _promql_label_names(expr: str) -> set[str]:
    labels: set[str] = set()
    for sel in re.findall(r"\{([^}]*)\}", re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)):
        labels |= set(re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)", sel))
    for grp in re.findall(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)", expr):
        labels |= {x.strip() for x in grp.split(",") if x.strip()}
    labels |= set(re.findall(r"label_values\(\s*[A-Za-z_:][A-Za-z0-9_:]*\s*,\s*([A-Za-z_]\w*)", expr))
    labels |= set(re.findall(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}", expr))
    return labels - {"__name__"}


def _prom_queries(dashboard: Cfg) -> list[tuple[str, str]]:
    """(expression, legend) of every Prometheus target and query variable."""
    out = []
    for node in _walk(dashboard):
        if isinstance(node, dict) and isinstance(node.get("expr"), str):
            out.append((node["expr"], str(node.get("legendFormat", ""))))
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            q = var.get("query")
            out.append((q["query"] if isinstance(q, dict) else str(q), ""))
    return out


def _tempo_queries(dashboard: Cfg, datasources: Cfg) -> list[str]:
    tempo_uids = {u for u, ds in datasources.items() if ds["type"] == "tempo"}
    return [n["query"] for n in _walk(dashboard)
            if isinstance(n, dict) and isinstance(n.get("query"), str)
            and isinstance(n.get("datasource"), dict) and n["datasource"].get("uid") in tempo_uids]


def _traceql_refs(query: str) -> tuple[set[str], set[str], set[str]]:
    """(span names, span.* attributes, resource.* attributes) referenced by a TraceQL query."""
    names = set(re.findall(r'\bname\s*=\s*"([^"]+)"', query))
    span_attrs = set(re.findall(r"\bspan\.([A-Za-z_][A-Za-z0-9_.]*[A-Za-z0-9_])", query))
    res_attrs = set(re.findall(r"\bresource\.([A-Za-z_][A-Za-z0-9_.]*[A-Za-z0-9_])", query))
    return names, span_attrs, res_attrs


# ---------------------------------------------------------------------------------------------
# files


def test_every_config_file_parses() -> None:
    files = [COMPOSE_FILE, *sorted(CONFIG_DIR.rglob("*.yaml")), *sorted(CONFIG_DIR.rglob("*.yml"))]
    assert {COLLECTOR_FILE, TEMPO_FILE, PROMETHEUS_FILE, DATASOURCES_FILE, DASH_PROVIDERS_FILE} <= set(files)
    for f in files:
        assert isinstance(_yaml(f), dict), f"{f} is not a YAML mapping"
    dashboards = sorted(CONFIG_DIR.rglob("*.json"))
    assert DASHBOARD_FILE in dashboards
    for f in dashboards:
        assert isinstance(json.loads(f.read_text(encoding="utf-8")), dict), f


def test_bind_mounted_files_exist_and_are_the_files_the_services_read(compose: Cfg) -> None:
    services = compose["services"]
    mounted: dict[str, dict[str, Path]] = {}
    for name, svc in services.items():
        for src, target in _bind_mounts(svc):
            path = (REPO / src).resolve()
            assert path.exists(), f"service {name} mounts {src}, which does not exist"
            assert REPO in path.parents, f"service {name} mounts {src} from outside the repository"
            mounted.setdefault(name, {})[target] = path
    # each service is pointed at the file that is mounted for it
    for svc, flags, path in (("collector", ("--config",), COLLECTOR_FILE),
                             ("tempo", ("-config.file", "--config.file"), TEMPO_FILE),
                             ("prometheus", ("--config.file",), PROMETHEUS_FILE)):
        arg = _flag(services[svc].get("command"), *flags)
        assert arg in mounted[svc], f"{svc} reads {arg}, which is not a mounted file"
        assert mounted[svc][arg] == path, f"{svc} reads {arg}, mounted from {mounted[svc][arg]}, not {path}"
    env = _environment(services["grafana"])
    prov = env.get("GF_PATHS_PROVISIONING", GRAFANA_DEFAULT_PROVISIONING)
    prov_dir = mounted["grafana"][prov]
    assert prov_dir / "datasources" / "datasources.yaml" == DATASOURCES_FILE
    assert prov_dir / "dashboards" / "dashboards.yaml" == DASH_PROVIDERS_FILE
    # the dashboard provider reads a directory that is mounted and holds rltrace.json
    providers = _yaml(DASH_PROVIDERS_FILE)["providers"]
    for p in providers:
        path = p["options"]["path"]
        assert path in mounted["grafana"], f"dashboard provider path {path} is not mounted"
    dash_dirs = [mounted["grafana"][p["options"]["path"]] for p in providers]
    assert DASHBOARD_FILE.parent in dash_dirs
    home = env.get("GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH")
    if home:
        target_dir, fname = home.rsplit("/", 1)
        assert (mounted["grafana"][target_dir] / fname).is_file(), f"home dashboard {home} is not mounted"


# ---------------------------------------------------------------------------------------------
# collector pipelines


def test_pipelines_name_only_defined_components(collector: Cfg) -> None:
    defined = {k: set((collector.get(k) or {}).keys()) for k in KINDS}
    pipelines = _pipelines(collector)
    assert pipelines
    for name, p in pipelines.items():
        assert _ctype(name) in ("traces", "metrics", "logs"), f"unknown pipeline type {name}"
        assert p.get("receivers") and p.get("exporters"), f"pipeline {name} needs receivers and exporters"
        for r in p["receivers"]:
            assert r in defined["receivers"] | defined["connectors"], f"{name}: receiver {r} not defined"
        for proc in p.get("processors", []):
            assert proc in defined["processors"], f"{name}: processor {proc} not defined"
        for e in p["exporters"]:
            assert e in defined["exporters"] | defined["connectors"], f"{name}: exporter {e} not defined"
    for ext in collector["service"].get("extensions", []):
        assert ext in defined["extensions"], f"extension {ext} not defined"


def test_every_defined_component_is_used(collector: Cfg) -> None:
    pipes = _pipelines(collector).values()
    used_r = {r for p in pipes for r in p.get("receivers", [])}
    used_p = {x for p in pipes for x in p.get("processors", [])}
    used_e = {e for p in pipes for e in p.get("exporters", [])}
    for cid in collector.get("receivers") or {}:
        assert cid in used_r, f"receiver {cid} is defined but in no pipeline"
    for cid in collector.get("processors") or {}:
        assert cid in used_p, f"processor {cid} is defined but in no pipeline"
    for cid in collector.get("exporters") or {}:
        assert cid in used_e, f"exporter {cid} is defined but in no pipeline"
    for cid in collector.get("connectors") or {}:
        assert cid in used_e and cid in used_r, f"connector {cid} must be an exporter and a receiver"
    for cid in collector.get("extensions") or {}:
        assert cid in collector["service"].get("extensions", []), f"extension {cid} is not enabled"


def test_component_names_are_current_not_deprecated_aliases(collector: Cfg) -> None:
    for kind, aliases in DEPRECATED_ALIASES.items():
        for cid in collector.get(kind) or {}:
            assert _ctype(cid) not in aliases, (
                f"{kind}: {cid!r} uses the deprecated name {_ctype(cid)!r}; use {aliases[_ctype(cid)]!r}")


def test_memory_limiter_first_and_batch_last(collector: Cfg) -> None:
    for name, p in _pipelines(collector).items():
        procs = [_ctype(x) for x in p.get("processors", [])]
        assert procs[:1] == ["memory_limiter"], f"{name}: memory_limiter must be the first processor"
        assert procs[-1:] == ["batch"], f"{name}: batch must be the last processor"


def test_span_metrics_connector_bridges_traces_to_metrics(collector: Cfg) -> None:
    sm_id, _ = _span_metrics(collector)
    pipes = _pipelines(collector)
    traces_in = [n for n, p in pipes.items() if _ctype(n) == "traces" and sm_id in p["exporters"]
                 and any(_ctype(r) == "otlp" for r in p["receivers"])]
    metrics_out = [n for n, p in pipes.items() if _ctype(n) == "metrics" and sm_id in p["receivers"]
                   and any(_ctype(e) == "prometheus" for e in p["exporters"])]
    assert traces_in, f"{sm_id} is not an exporter of a traces pipeline fed by the otlp receiver"
    assert metrics_out, f"{sm_id} is not a receiver of a metrics pipeline exporting to prometheus"
    # rltrace's own OTLP metrics reach Prometheus too
    assert any(any(_ctype(r) == "otlp" for r in pipes[n]["receivers"]) for n in metrics_out)


def test_span_metrics_dimensions_are_attributes_rltrace_emits(collector: Cfg, rltrace_output: Cfg) -> None:
    _, sm = _span_metrics(collector)
    dims = [d["name"] for d in sm.get("dimensions", [])]
    for required in ("rl.phase", "rl.session.status", "rl.rank"):
        assert required in dims, f"span_metrics dimensions lack {required}"
    span_keys = set().union(*rltrace_output["span_attrs"].values())
    known = span_keys | rltrace_output["resource_attrs"]
    for d in dims:
        assert d in known, f"dimension {d!r} is neither a span nor a resource attribute rltrace sets"
    # rank is a resource attribute, which span_metrics dimensions look up (no span carries it)
    assert "rl.rank" in rltrace_output["resource_attrs"]
    assert "rl.phase" in rltrace_output["span_attrs"]["generate"]
    assert "rl.session.status" in rltrace_output["span_attrs"]["rl.session"]
    for key in sm.get("resource_metrics_key_attributes", []):
        assert key in rltrace_output["resource_attrs"], f"resource_metrics_key_attributes: {key} unknown"


def test_resource_labels_copied_onto_metrics_exist(collector: Cfg, rltrace_output: Cfg) -> None:
    copied: dict[str, str] = {}
    for n, p in _pipelines(collector).items():
        if _ctype(n) == "metrics":
            copied.update(_copied_resource_labels(collector, p.get("processors", [])))
    assert "rl.rank" in copied, "the metrics pipeline must copy resource attribute rl.rank onto points"
    for src in copied.values():
        assert src in rltrace_output["metric_resource_attrs"], f"{src} is not on rltrace's metric resource"


# ---------------------------------------------------------------------------------------------
# ports and addresses


def test_every_published_port_is_bound_to_loopback_by_default(compose: Cfg) -> None:
    for name, svc in compose["services"].items():
        assert svc.get("network_mode") != "host", f"{name} uses the host network"
        for cport, (host_ip, _) in _published(svc).items():
            assert host_ip == "127.0.0.1", (
                f"{name}: container port {cport} is published on {host_ip or 'all interfaces'!r}, "
                "not 127.0.0.1")


def test_compose_variables_have_defaults_and_are_not_rltrace_config() -> None:
    found: list[str] = []
    _interpolate(_yaml(COMPOSE_FILE), found)
    for name in found:
        assert not name.startswith("RLTRACE_"), f"{name}: RLTRACE_* variables are rltrace's own config"


def test_otlp_receiver_ports_match_compose_and_rltrace_endpoint(collector: Cfg, compose: Cfg,
                                                                 readme_section: str) -> None:
    (_, otlp), = _of_type(collector["receivers"], "otlp").items()
    published = _published(compose["services"]["collector"])
    ports = {}
    for proto in ("grpc", "http"):
        host, port = _host_port(otlp["protocols"][proto]["endpoint"])
        assert host == "0.0.0.0", f"otlp {proto} listens on {host}: unreachable through the port mapping"
        assert port in published, f"otlp {proto} port {port} is not published by the collector service"
        assert published[port][1] == port, f"otlp {proto}: host port {published[port][1]} != {port}"
        ports[proto] = port
    # rltrace's documented endpoint (README) is the gRPC receiver on loopback
    m = re.search(r"rltrace demo --otlp-endpoint (http://[^\s`]+)", readme_section)
    assert m, "README section does not show `rltrace demo --otlp-endpoint ...`"
    host, port = _host_port(m.group(1))
    assert host == published[ports["grpc"]][0] == "127.0.0.1"
    assert port == ports["grpc"]
    # and the OTLP/HTTP default port of the SDK rltrace uses is the http receiver's
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import DEFAULT_ENDPOINT

    assert _host_port(DEFAULT_ENDPOINT)[1] == ports["http"]
    assert f"http://127.0.0.1:{ports['http']}" in readme_section


def test_trace_exporters_reach_jaeger_and_tempo_on_ports_they_listen_on(collector: Cfg, compose: Cfg,
                                                                         tempo: Cfg) -> None:
    services = compose["services"]
    traces_exporters = {e for n, p in _pipelines(collector).items() if _ctype(n) == "traces"
                        for e in p["exporters"]}
    targets = {}
    for cid, cfg in (collector.get("exporters") or {}).items():
        if _ctype(cid) not in ("otlp_grpc", "otlp_http"):
            continue
        host, port = _host_port(cfg["endpoint"])
        assert host in services, f"exporter {cid} points at {host}, which is not a compose service"
        assert port in _exposed(services[host]), f"exporter {cid}: service {host} does not expose {port}"
        assert host in services["collector"].get("depends_on", []), f"collector does not depend on {host}"
        assert (cfg.get("tls") or {}).get("insecure") is True, f"{cid}: plaintext needs tls.insecure"
        assert cid in traces_exporters, f"{cid} is in no traces pipeline"
        targets[host] = (_ctype(cid), port)
    assert set(targets) >= {"jaeger", "tempo"}, f"traces go to {sorted(targets)}, not Jaeger and Tempo"
    # Tempo: the distributor's OTLP receiver of that protocol listens on that port, on all interfaces
    proto = "grpc" if targets["tempo"][0] == "otlp_grpc" else "http"
    t_host, t_port = _host_port(tempo["distributor"]["receivers"]["otlp"]["protocols"][proto]["endpoint"])
    assert (t_host, t_port) == ("0.0.0.0", targets["tempo"][1])
    # Jaeger v2 all-in-one: OTLP gRPC on ${JAEGER_LISTEN_HOST}:4317; localhost would be unreachable
    assert targets["jaeger"] == ("otlp_grpc", JAEGER_OTLP_GRPC_PORT)
    assert _environment(services["jaeger"]).get("JAEGER_LISTEN_HOST") == "0.0.0.0"


def test_prometheus_scrapes_the_collectors_prometheus_exporter(collector: Cfg, compose: Cfg,
                                                                prometheus: Cfg) -> None:
    (_, prom_exp), = _of_type(collector["exporters"], "prometheus").items()
    host, port = _host_port(prom_exp["endpoint"])
    assert host == "0.0.0.0", "the prometheus exporter must listen on all container interfaces"
    targets = [t for job in prometheus["scrape_configs"] for sc in job.get("static_configs", [])
               for t in sc["targets"]]
    assert f"collector:{port}" in targets, f"Prometheus does not scrape collector:{port} (targets: {targets})"
    assert "collector" in compose["services"]
    assert port in _exposed(compose["services"]["collector"])
    job = next(j for j in prometheus["scrape_configs"]
               if any(f"collector:{port}" in sc["targets"] for sc in j.get("static_configs", [])))
    assert job.get("honor_labels") is True, "honor_labels keeps job = service.name from the exporter"


def test_grafana_datasources_point_at_compose_services(datasources: Cfg, compose: Cfg,
                                                        tempo: Cfg) -> None:
    services = compose["services"]
    prom_listen = _flag(services["prometheus"].get("command"), "--web.listen-address")
    expected_port = {
        "prometheus": _host_port(prom_listen)[1] if prom_listen else PROMETHEUS_DEFAULT_PORT,
        "tempo": int(tempo["server"]["http_listen_port"]),
        "jaeger": JAEGER_QUERY_PORT,
    }
    types = {ds["type"] for ds in datasources.values()}
    assert {"prometheus", "tempo", "jaeger"} <= types
    for uid, ds in datasources.items():
        host, port = _host_port(ds["url"])
        assert host in services, f"datasource {uid} points at {host}, not a compose service"
        assert ds["type"] == host, f"datasource {uid} of type {ds['type']} points at service {host}"
        assert port == expected_port[host], f"datasource {uid}: {host} listens on {expected_port[host]}"
        assert port in _exposed(services[host]), f"datasource {uid}: {host} does not expose {port}"
        assert host in services["grafana"].get("depends_on", [])
    for ds in datasources.values():
        for key in ("datasourceUid",):
            for node in _walk(ds.get("jsonData", {})):
                if isinstance(node, dict) and key in node:
                    assert node[key] in datasources, f"jsonData refers to unknown datasource uid {node[key]}"


def test_readme_urls_match_published_ports(compose: Cfg, readme_section: str) -> None:
    services = compose["services"]
    for svc, cport in (("jaeger", JAEGER_QUERY_PORT), ("grafana", 3000)):
        host_ip, hport = _published(services[svc])[cport]
        assert f"http://{host_ip}:{hport}" in readme_section, f"README does not link {svc}:{hport}"


def test_images_are_pinned_and_documented(compose: Cfg, readme_section: str) -> None:
    expected = {"collector": "otel/opentelemetry-collector-contrib", "jaeger": "jaegertracing/jaeger",
                "tempo": "grafana/tempo", "prometheus": "prom/prometheus", "grafana": "grafana/grafana"}
    for svc, repo in expected.items():
        image = compose["services"][svc]["image"]
        name, _, tag = image.rpartition(":")
        assert name == repo, f"{svc}: image {image}, expected {repo}"
        assert re.fullmatch(r"v?\d+\.\d+\.\d+", tag), f"{svc}: image {image} is not pinned to a version"
        assert f"`{image}`" in readme_section, f"README does not say the files were written for {image}"
    jaeger_major = compose["services"]["jaeger"]["image"].rsplit(":", 1)[1].lstrip("v").split(".")[0]
    assert jaeger_major == "2", "Jaeger v2 is expected (OTLP-native, collector-based)"


# ---------------------------------------------------------------------------------------------
# dashboard


def test_dashboard_uses_only_provisioned_datasources(dashboard: Cfg, datasources: Cfg) -> None:
    seen = set()
    for node in _walk(dashboard):
        if isinstance(node, dict) and isinstance(node.get("datasource"), dict):
            ref = node["datasource"]
            assert ref.get("uid") in datasources, f"unknown datasource uid {ref.get('uid')!r}"
            assert ref.get("type") == datasources[ref["uid"]]["type"], f"datasource {ref} has the wrong type"
            seen.add(ref["uid"])
        elif isinstance(node, dict) and isinstance(node.get("datasource"), str):
            raise AssertionError(f"datasource referenced by name {node['datasource']!r}; use {{type, uid}}")
    assert {u for u, ds in datasources.items() if ds["type"] in ("prometheus", "tempo")} <= seen


def test_dashboard_metric_and_label_names_are_produced(dashboard: Cfg, collector: Cfg,
                                                       rltrace_output: Cfg) -> None:
    produced = _produced_metrics(collector, rltrace_output)
    queries = _prom_queries(dashboard)
    assert queries
    for expr, legend in queries:
        names = _promql_metric_names(expr)
        assert names, f"no metric in {expr!r}"
        for n in names:
            assert n in produced, f"{n} is not produced by the collector ({sorted(produced)})"
        available = set().union(*(produced[n] for n in names))
        for label in _promql_label_names(expr) | _promql_label_names(legend):
            assert label in available, f"label {label!r} is not on {sorted(names)} in {expr!r}"


def test_dashboard_has_the_promised_panels(dashboard: Cfg, collector: Cfg,
                                           datasources: Cfg, rltrace_output: Cfg) -> None:
    _, sm = _span_metrics(collector)
    suffixes = _exporter_adds_suffixes(collector)
    ns = sm.get("namespace", "traces.span.metrics")
    bucket = next(n for n in _prom_names(ns + ".duration", (sm.get("histogram") or {}).get("unit", "ms"),
                                         "Histogram", None, suffixes) if n.endswith("_bucket"))
    sessions = next(iter(_prom_names("rl.sessions", rltrace_output["metrics"]["rl.sessions"]["unit"], "Sum",
                                     True, suffixes)))
    exprs = [e for e, _ in _prom_queries(dashboard)]

    def has(pred: Any) -> bool:
        return any(pred(e) for e in exprs)

    for q in ("0.5", "0.9", "0.99"):
        assert has(lambda e, q=q: f"histogram_quantile({q}" in e and bucket in e and "rl_phase" in e), (
            f"no p{q} phase latency panel on {bucket} by rl_phase")
    assert has(lambda e: sessions in e and "rl_session_status" in e), f"no sessions-by-status on {sessions}"
    assert has(lambda e: "rl_rank" in re.sub(r"\{[^}]*\}", "", e) and "histogram_quantile" in e), (
        "no stragglers-by-rank panel")
    tempo_q = _tempo_queries(dashboard, datasources)
    assert any('name = "rl.session"' in q for q in tempo_q), "no Tempo panel for slow rl.session spans"


def test_traceql_queries_use_span_names_and_attributes_rltrace_emits(dashboard: Cfg,
                                                                     datasources: Cfg,
                                                                     readme_section: str,
                                                                     rltrace_output: Cfg) -> None:
    queries = _tempo_queries(dashboard, datasources)
    queries += [q for q in re.findall(r"`(\{[^`]*\}[^`]*)`", readme_section) if "name =" in q]
    assert len(queries) >= 2
    span_attrs = rltrace_output["span_attrs"]
    for q in queries:
        names, s_attrs, r_attrs = _traceql_refs(q)
        assert names, f"TraceQL {q!r} selects no span name"
        for n in names:
            assert n in span_attrs, f"TraceQL {q!r}: rltrace emits no span named {n!r}"
        for a in s_attrs:
            assert any(a in span_attrs[n] for n in names), f"TraceQL {q!r}: {names} spans lack attribute {a}"
        for a in r_attrs:
            assert a in rltrace_output["resource_attrs"], f"TraceQL {q!r}: no resource attribute {a}"
