"""OTLP export into a real, independent backend: Arize Phoenix (``phoenix serve``).

Phoenix runs as a subprocess on free local ports; rltrace exports to it over OTLP/HTTP,
OTLP/gRPC and through the standard ``OTEL_EXPORTER_OTLP_*`` variables, and the tests read the
spans back through Phoenix's REST API (``GET /v1/projects/default/spans``), checking names,
parent links, trace membership and attributes as Phoenix stored them.

Phoenix facts these tests rely on (arize-phoenix 20.26.1): spans land in the ``default``
project; the REST API returns attributes as a flat dict of dotted keys; it does not return
resource attributes (``service.name``) or span links; ingestion is asynchronous (spans appear
a moment after the export succeeds), so reads poll until the expected count or a deadline.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO
from opentelemetry.trace import format_span_id, format_trace_id

import rltrace
from rltrace import perf_tracer
from rltrace.perf_tracer import atrace_session_phase, session_context, trace_session

PHOENIX_VERSION = "20.26.1"
START_DEADLINE_S = 120.0  # ~10-20 s usually; the first start of a fresh install is slower
SPAN_DEADLINE_S = 15.0
HOST = "127.0.0.1"


# ---- the Phoenix server ------------------------------------------------------------------------


def _phoenix_bin() -> Path | None:
    env = os.environ.get("PHOENIX_BIN")
    candidates = [Path(env)] if env else []
    candidates += [REPO / ".ci" / "phoenix-venv" / "bin" / "phoenix", Path("/tmp/phoenix-venv/bin/phoenix")]
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return c
    return None


def _free_ports(n: int) -> list[int]:
    """``n`` distinct free TCP ports on 127.0.0.1 (held together while picked, so distinct)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((HOST, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _get_json(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read())


class Phoenix:
    def __init__(self, binary: Path, workdir: Path) -> None:
        self.binary = binary
        self.workdir = workdir
        self.http_port, self.grpc_port = _free_ports(2)
        self.url = f"http://{HOST}:{self.http_port}"
        self.log = workdir / "phoenix.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PHOENIX_", "OTEL_"))}
        env.update(
            PHOENIX_HOST=HOST, PHOENIX_PORT=str(self.http_port), PHOENIX_GRPC_PORT=str(self.grpc_port),
            PHOENIX_WORKING_DIR=str(workdir / "data"), PHOENIX_TELEMETRY_ENABLED="false",
            PHOENIX_ALLOW_EXTERNAL_RESOURCES="false",
        )
        with open(self.log, "wb") as fh:
            self.proc = subprocess.Popen([str(binary), "serve"], cwd=workdir, env=env, stdout=fh,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError as exc:
            return f"(no log: {exc})"

    def wait_healthy(self, deadline_s: float) -> str | None:
        """Poll /healthz until it answers OK (None), else say why not (and stop the server)."""
        deadline = time.monotonic() + deadline_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return f"Phoenix exited during start-up (rc {self.proc.returncode})"
            try:
                with urllib.request.urlopen(f"{self.url}/healthz", timeout=2) as resp:
                    if resp.status == 200:
                        return None
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.25)
        self.stop()
        return f"Phoenix did not become healthy at {self.url}/healthz within {deadline_s:.0f} s"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=15)

    def spans(self, page_size: int = 100, **filters: Any) -> list[dict[str, Any]]:
        """Every span of the default project matching ``filters``, paging with ``cursor=``.

        Filters are the API's query parameters (``trace_id``, ``name``, ``attribute`` as
        ``key:value``, ``parent_id``); a list value repeats the parameter.
        """
        params: list[tuple[str, Any]] = [("limit", page_size)]
        for key, value in filters.items():
            params += [(key, v) for v in value] if isinstance(value, (list, tuple)) else [(key, value)]
        out: list[dict[str, Any]] = []
        cursor = None
        for _ in range(10_000):
            query = urllib.parse.urlencode(params + ([("cursor", cursor)] if cursor else []))
            try:
                page = _get_json(f"{self.url}/v1/projects/default/spans?{query}")
            except urllib.error.HTTPError as exc:
                if exc.code == 404 and cursor is None:  # no project yet: nothing ingested
                    return out
                raise AssertionError(f"Phoenix span query failed: {exc} {exc.read()!r}") from None
            out.extend(page["data"])
            cursor = page.get("next_cursor")
            if not cursor:
                return out
        raise AssertionError("Phoenix pagination did not end")

    def wait_spans(self, expected: int, page_size: int = 100, **filters: Any) -> list[dict[str, Any]]:
        """Poll the query API until ``expected`` spans match (or the deadline); return them."""
        deadline = time.monotonic() + SPAN_DEADLINE_S
        got = self.spans(page_size, **filters)
        while len(got) < expected and time.monotonic() < deadline:
            time.sleep(0.2)
            got = self.spans(page_size, **filters)
        assert len(got) == expected, (
            f"Phoenix has {len(got)} spans for {filters}, expected {expected}: "
            f"{sorted(s['name'] for s in got)}\nlog tail:\n{self.log_tail()}"
        )
        return got


_START_FAILURE: list[str] = []


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Phoenix]:
    binary = _phoenix_bin()
    if binary is None:
        pytest.skip(
            "Arize Phoenix not found (env PHOENIX_BIN, .ci/phoenix-venv/bin/phoenix or "
            "/tmp/phoenix-venv/bin/phoenix); install it in its own venv: python3 -m venv "
            f".ci/phoenix-venv && .ci/phoenix-venv/bin/pip install arize-phoenix=={PHOENIX_VERSION}"
        )
    if _START_FAILURE:  # failed for an earlier test of this module: do not wait again
        pytest.fail(_START_FAILURE[0])
    for attempt in range(3):
        server = Phoenix(binary, tmp_path_factory.mktemp(f"phoenix{attempt}"))
        why = server.wait_healthy(START_DEADLINE_S)
        if why is None:
            break
        server.stop()
        if "exited" not in why:
            break
        # exited: e.g. a port picked free was taken before Phoenix bound it; retry on new ports
    if why is not None:
        _START_FAILURE.append(f"{why}; {binary} serve, log tail:\n{server.log_tail()}")
        pytest.fail(_START_FAILURE[0])
    try:
        yield server
    finally:
        server.stop()


# ---- reading spans -----------------------------------------------------------------------------


def attrs(span: dict[str, Any]) -> dict[str, Any]:
    """A span's attributes as flat dotted keys (Phoenix returns them flat; nested is unfolded)."""
    out: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        else:
            out[prefix] = value

    walk("", span.get("attributes") or {})
    return out


def sid(span: dict[str, Any]) -> str:
    return span["context"]["span_id"]


def by_name(spans: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [s for s in spans if s["name"] == name]


def ts(span: dict[str, Any], key: str) -> datetime:
    return datetime.fromisoformat(span[key])


def otlp_stats() -> dict[str, Any]:
    """Flush rltrace and its asynchronous OTLP sender; return ``diagnostics()["otlp"]``."""
    rltrace.flush()
    pipe = rltrace.runtime.get_pipeline()
    assert pipe is not None and pipe.otlp is not None, "no OTLP processor configured"
    assert pipe.otlp.force_flush(10_000), "OTLP sender did not drain in 10 s"
    return rltrace.diagnostics()["otlp"]


# ---- the workflow ------------------------------------------------------------------------------


def run_episode(task_id: str, n: int, *, finalize_task: bool = False) -> list[Any]:
    """AReaL-style: one task, ``n`` concurrent sessions of generate + reward; returns session ids."""

    @trace_session("reward")
    async def compute_reward() -> float:
        await asyncio.sleep(0.001)
        return 1.0

    @session_context()
    async def collect() -> Any:
        async with atrace_session_phase("generate", start_payload={"model": "m", "input_tokens": 5}) as ph:
            await asyncio.sleep(0.001)
            ph.set_end_payload(output_tokens=3)
        await compute_reward()
        return perf_tracer.get_session_id()

    async def main() -> list[Any]:
        perf_tracer.set_task_id(perf_tracer.register_task(task_id))
        sessions = list(await asyncio.gather(*[collect() for _ in range(n)]))
        if finalize_task:
            perf_tracer.trace_session_event("mark_finalized", task_id=task_id, status="accepted")
        else:
            for i, s in enumerate(sessions):
                if i % 2:
                    perf_tracer.trace_session_event("mark_finalized", session_id=s, status="rejected",
                                                    reason="stale_weight")
                else:
                    perf_tracer.trace_session_event("mark_finalized", session_id=s, status="accepted")
        return sessions

    return asyncio.run(main())


def check_task_tree(spans: list[dict[str, Any]], task_id: str, sessions: list[Any]) -> dict[str, Any]:
    """The task → session → phase tree as Phoenix stored it; returns the spans by role."""
    [task] = by_name(spans, "rl.task")
    assert task["parent_id"] is None
    assert attrs(task)["rl.task.id"] == task_id
    trace_id = task["context"]["trace_id"]
    assert {s["context"]["trace_id"] for s in spans} == {trace_id}, "one trace per task"
    sess_spans = by_name(spans, "rl.session")
    assert sorted(attrs(s)["rl.session.id"] for s in sess_spans) == sorted(sessions)
    for sess in sess_spans:
        assert sess["parent_id"] == sid(task)
        a = attrs(sess)
        children = [s for s in spans if s["parent_id"] == sid(sess)]
        assert sorted(c["name"] for c in children) == ["generate", "reward"], a
        for child in children:
            ca = attrs(child)
            assert ca["rl.phase"] == child["name"]
            assert ca["rl.session.id"] == a["rl.session.id"]
            assert ca["rl.task.id"] == task_id
            assert ca["rl.turn"] == 0
            assert ts(sess, "start_time") <= ts(child, "start_time") <= ts(child, "end_time")
            assert ts(child, "end_time") <= ts(sess, "end_time")
        assert ts(task, "start_time") <= ts(sess, "start_time")
        assert ts(sess, "end_time") <= ts(task, "end_time")
    n = len(sessions)
    assert sorted(s["name"] for s in spans) == ["generate"] * n + ["reward"] * n + ["rl.session"] * n + [
        "rl.task"]
    return {"task": task, "sessions": sess_spans}


def uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


# ---- tests -------------------------------------------------------------------------------------


def test_http_protobuf_sessions_and_train_step_arrive_in_phoenix(tmp_path: Path, phoenix: Phoenix) -> None:
    task_id = uid("phoenix-http")
    rltrace.configure(
        fileroot=tmp_path, experiment_name="phoenix-http", trial_name="t1",
        service_name="rltrace-phoenix-http", session_tracer={"enabled": True},
        otlp={"endpoint": f"http://{HOST}:{phoenix.http_port}", "protocol": "http/protobuf",
              "metrics": False},  # Phoenix accepts traces only
    )
    sessions = run_episode(task_id, 3)
    with rltrace.step(7) as step_span:
        assert rltrace.link_consumed(task_ids=[task_id]) == 1
        with rltrace.trace_scope("train.ppo_update", args={"lr": 1e-5}):
            pass
    step_trace = format_trace_id(step_span.get_span_context().trace_id)
    step_id = format_span_id(step_span.get_span_context().span_id)

    stats = otlp_stats()
    assert stats["exported"] == 1 + 3 + 3 * 2 + 2, stats
    assert (stats["failed"], stats["dropped"], stats["queued"]) == (0, 0, 0), stats
    assert rltrace.diagnostics()["misuse"] == {}
    rltrace.shutdown()

    # 10 spans in the task's trace; a page of 4 makes the reader follow next_cursor
    spans = phoenix.wait_spans(10, page_size=4, attribute=f"rl.task.id:{task_id}")
    tree = check_task_tree(spans, task_id, sessions)
    statuses = {}
    for sess in tree["sessions"]:
        a = attrs(sess)
        statuses[a["rl.session.id"]] = a["rl.session.status"]
        if a["rl.session.status"] == "rejected":
            assert a["rl.session.reason"] == "stale_weight"
        else:
            assert "rl.session.reason" not in a
        assert a["rl.session.turns"] == 1
        assert a["rl.session.total_s"] > 0 and a["rl.session.generate_s"] > 0
    assert [statuses[s] for s in sessions] == ["accepted", "rejected", "accepted"]
    for gen in by_name(spans, "generate"):
        a = attrs(gen)
        assert a["gen_ai.request.model"] == "m"
        assert a["gen_ai.usage.input_tokens"] == 5
        assert a["gen_ai.usage.output_tokens"] == 3
        assert a["rl.start.model"] == "m"
        assert a["gen_ai.conversation.id"] == f"{gen['context']['trace_id']}-{a['rl.session.id']}"

    train = phoenix.wait_spans(2, trace_id=step_trace)
    [step] = by_name(train, "train.step")
    [update] = by_name(train, "train.ppo_update")
    assert sid(step) == step_id and step["parent_id"] is None
    assert update["parent_id"] == step_id
    assert attrs(step)["rl.step"] == 7
    assert attrs(update)["rl.step"] == 7
    assert attrs(update)["args.lr"] == pytest.approx(1e-5)


def test_grpc_export_keeps_the_task_tree(tmp_path: Path, phoenix: Phoenix) -> None:
    task_id = uid("phoenix-grpc")
    rltrace.configure(
        fileroot=tmp_path, experiment_name="phoenix-grpc", trial_name="t2",
        service_name="rltrace-phoenix-grpc", session_tracer={"enabled": True},
        otlp={"endpoint": f"http://{HOST}:{phoenix.grpc_port}", "protocol": "grpc", "insecure": True,
              "metrics": False},
    )
    sessions = run_episode(task_id, 2, finalize_task=True)
    stats = otlp_stats()
    assert stats["exported"] == 1 + 2 + 2 * 2 and stats["failed"] == 0, stats
    rltrace.shutdown()

    spans = phoenix.wait_spans(7, attribute=f"rl.task.id:{task_id}")
    tree = check_task_tree(spans, task_id, sessions)
    assert {attrs(s)["rl.session.status"] for s in tree["sessions"]} == {"accepted"}


def test_standard_otel_env_variables_select_endpoint_and_protocol(
    tmp_path: Path, phoenix: Phoenix, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
                "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://{HOST}:{phoenix.http_port}")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")  # the standard switch: traces only
    cfg = rltrace.configure(fileroot=tmp_path, experiment_name="phoenix-env", trial_name="t3",
                            service_name="rltrace-phoenix-env")
    assert cfg.otlp.endpoint is None and cfg.otlp.protocol is None  # all from the environment
    marker = uid("env")
    with rltrace.trace_scope("phoenix.env.root", args={"marker": marker}) as root:
        with rltrace.trace_scope("phoenix.env.child"):
            pass
    trace_id = format_trace_id(root.get_span_context().trace_id)
    stats = otlp_stats()
    assert stats["exported"] == 2 and stats["failed"] == 0, stats
    rltrace.shutdown()

    spans = phoenix.wait_spans(2, trace_id=trace_id)
    [r] = by_name(spans, "phoenix.env.root")
    [c] = by_name(spans, "phoenix.env.child")
    assert r["parent_id"] is None and c["parent_id"] == sid(r)
    assert attrs(r)["args.marker"] == marker


def test_session_sampling_sends_phoenix_only_the_tasks_worth_keeping(tmp_path: Path,
                                                                     phoenix: Phoenix) -> None:
    """Mode ``sessions`` at ratio 0: of four tasks only the one with a rejected session (and a
    plain train-step trace) reaches Phoenix, whole; the session records keep all four."""
    ids = [uid(f"phoenix-sampled-{i}") for i in range(4)]
    rltrace.configure(
        fileroot=tmp_path, experiment_name="phoenix-sampling", trial_name="t4",
        service_name="rltrace-phoenix-sampling", session_tracer={"enabled": True},
        sampling={"mode": "sessions", "ratio": 0.0},
        otlp={"endpoint": f"http://{HOST}:{phoenix.http_port}", "protocol": "http/protobuf",
              "metrics": False},
    )
    kept = ids[2]
    sessions = {}
    for task_id in ids:  # run_episode rejects its odd sessions: make that one task's only
        sessions[task_id] = run_episode(task_id, 2 if task_id == kept else 1)
    step_name = uid("phoenix-step")
    with rltrace.trace_scope(step_name):
        pass
    stats = otlp_stats()
    diag = rltrace.diagnostics()["sampling"]
    rltrace.shutdown()
    assert diag["tasks_kept"] == {"ratio": 0, "status": 1, "slow": 0}
    assert diag["tasks_dropped"] == 3 and stats["exported"] == 7 + 1
    spans = phoenix.wait_spans(7, attribute=f"rl.task.id:{kept}")
    check_task_tree(spans, kept, sessions[kept])
    phoenix.wait_spans(1, name=step_name)  # ingested after the task: the dropped ones are not
    for task_id in ids:
        if task_id != kept:
            assert phoenix.spans(attribute=f"rl.task.id:{task_id}") == []
    records = [json.loads(line) for f in tmp_path.rglob("sessions-r0*.jsonl")
               for line in f.read_text().splitlines()]
    assert sorted({r["task_id"] for r in records}) == sorted(ids)


# ---- sessions as agent runs (OTel GenAI conventions, as Phoenix maps them at ingest) ------------


def run_agent_task(task_id: str, rewards: list[float]) -> list[Any]:
    """One task, a session per reward: generate (model ``m``, 11 prompt and 7 completion tokens),
    a ``python`` tool call, generate again, and a reward phase scoring the session."""

    def one(sid: Any, score: float) -> Any:
        with rltrace.trace_session_phase("generate", session_id=sid,
                                         start_payload={"model": "m", "input_tokens": 11},
                                         end_payload={"output_tokens": 7}):
            pass
        with rltrace.trace_session_phase("toolcall", session_id=sid, start_payload={"tool_name": "python"}):
            pass
        with rltrace.trace_session_phase("generate", session_id=sid,
                                         start_payload={"model": "m", "input_tokens": 11},
                                         end_payload={"output_tokens": 7}):
            pass
        with rltrace.trace_session_phase("reward", session_id=sid,
                                         end_payload={"reward": score, "label": "correct" if score > 0.5
                                                      else "wrong"}):
            pass
        perf_tracer.trace_session_event("mark_finalized", session_id=sid, status="accepted")
        return sid

    perf_tracer.register_task(task_id)
    sids = [perf_tracer.register_session(task_id) for _ in rewards]  # open together: one task span
    return [one(sid, r) for sid, r in zip(sids, rewards, strict=True)]


def _configure_for_agents(tmp_path: Path, phoenix: Phoenix, name: str) -> None:
    rltrace.configure(fileroot=tmp_path, experiment_name=name, trial_name="t", service_name=f"rltrace-{name}",
                      session_tracer={"enabled": True},
                      otlp={"endpoint": f"http://{HOST}:{phoenix.http_port}", "protocol": "http/protobuf",
                            "metrics": False})


def test_sessions_are_agent_runs_in_phoenix_with_llm_tool_spans_conversations_and_evaluations(
        tmp_path: Path, phoenix: Phoenix, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OTEL_SEMCONV_STABILITY_OPT_IN", raising=False)
    task_id = uid("phoenix-agents")
    _configure_for_agents(tmp_path, phoenix, "phoenix-agents")
    sessions = run_agent_task(task_id, [1.0, 0.25])
    stats = otlp_stats()
    assert stats["failed"] == 0, stats
    rltrace.shutdown()

    spans = phoenix.wait_spans(1 + 2 * 5, attribute=f"rl.task.id:{task_id}")
    kinds = {(s["name"], s["span_kind"]) for s in spans}
    # what Phoenix 20.26.1 maps at ingest: invoke_agent -> AGENT, text_completion -> LLM,
    # execute_tool -> TOOL; invoke_workflow and a reward phase have no OpenInference kind
    assert kinds == {("rl.task", "UNKNOWN"), ("rl.session", "AGENT"), ("generate", "LLM"),
                     ("toolcall", "TOOL"), ("reward", "UNKNOWN")}, kinds
    [task] = by_name(spans, "rl.task")
    assert attrs(task)["gen_ai.operation.name"] == "invoke_workflow"
    assert attrs(task)["gen_ai.workflow.name"] == "task"
    scores = {}
    conversations: list[str] = []
    for sess in by_name(spans, "rl.session"):
        a = attrs(sess)
        sid_ = a["rl.session.id"]
        conversation = f"{sess['context']['trace_id']}-{sid_}"  # unique across ranks and runs
        assert (a["gen_ai.operation.name"], a["gen_ai.agent.name"], a["gen_ai.conversation.id"]) == (
            "invoke_agent", "rollout", conversation)
        assert a["session.id"] == conversation  # Phoenix's own conversation key, from the GenAI one
        conversations.append(conversation)
        assert a["rl.session.status"] == "accepted" and a["rl.task.id"] == task_id  # rl.* kept
        [ev] = [e for e in sess["events"] if e["name"] == "gen_ai.evaluation.result"]
        ea = ev["attributes"]
        assert ea["gen_ai.evaluation.name"] == "reward" and ea["rl.phase"] == "reward"
        scores[sid_] = (ea["gen_ai.evaluation.score.value"], ea["gen_ai.evaluation.score.label"])
        children = [s for s in spans if s["parent_id"] == sid(sess)]
        for gen in by_name(children, "generate"):
            g = attrs(gen)
            assert (g["llm.token_count.prompt"], g["llm.token_count.completion"]) == (11, 7)
            assert g["llm.model_name"] == "m" and g["session.id"] == conversation
        [tool] = by_name(children, "toolcall")
        assert attrs(tool)["tool.name"] == "python"
    assert scores == {sessions[0]: (1.0, "correct"), sessions[1]: (0.25, "wrong")}

    # conversations: Phoenix files each trace under one session (the first conversation id it
    # meets in it), and a task's trace holds all its sessions, so the task's trace is listed
    # once, under one of its sessions' conversations, with the tokens of all of them
    trace_id = task["context"]["trace_id"]
    found = []
    for conversation in conversations:
        try:
            conv = _get_json(f"{phoenix.url}/v1/sessions/{conversation}")["data"]
        except urllib.error.HTTPError as exc:
            assert exc.code == 404, exc
            continue
        found.append(conv)
    assert len(found) == 1, found
    assert [t["trace_id"] for t in found[0]["traces"]] == [trace_id]  # no other test's trace
    assert (found[0]["token_count_prompt"], found[0]["token_count_completion"]) == (4 * 11, 4 * 7)


def test_semconv_opt_in_names_spans_by_the_latest_genai_conventions_keeping_rl_attributes(
        tmp_path: Path, phoenix: Phoenix, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_SEMCONV_STABILITY_OPT_IN", "http, gen_ai_latest_experimental")
    task_id = uid("phoenix-latest")
    _configure_for_agents(tmp_path, phoenix, "phoenix-latest")
    run_agent_task(task_id, [0.5])
    assert otlp_stats()["failed"] == 0
    rltrace.shutdown()

    spans = phoenix.wait_spans(1 + 5, attribute=f"rl.task.id:{task_id}")
    assert sorted((s["name"], s["span_kind"]) for s in spans) == [
        ("execute_tool python", "TOOL"), ("invoke_agent rollout", "AGENT"),
        ("invoke_workflow task", "UNKNOWN"), ("reward", "UNKNOWN"), ("text_completion m", "LLM"),
        ("text_completion m", "LLM")]
    # queries by rltrace's attributes keep working under the new names
    assert {attrs(s).get("rl.phase") for s in spans} == {None, "generate", "toolcall", "reward"}
    [agent] = by_name(spans, "invoke_agent rollout")
    assert attrs(agent)["rl.session.id"] is not None and attrs(agent)["rl.task.id"] == task_id
