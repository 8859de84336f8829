"""StatsLogger: rank 0 only, increasing steps, __count filtered; console, JSONL, W&B (offline),
TensorBoard and OTel metrics read back from what they wrote; failing sinks never raise."""

from __future__ import annotations

import importlib.util
import io
import json
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import SHARED, need

import rltrace
from rltrace import stats
from rltrace.stats import StatsLogger
from rltrace.testing import read_jsonl

READ_OFFLINE = SHARED / "tools" / "wandb" / "read_offline_run.py"


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    stats.enable_span_timings()
    stats.reset()
    yield
    stats.reset()


def _logger(tmp_path: Path, **kw: Any) -> StatsLogger:
    kw.setdefault("console", False)
    kw.setdefault("otel", False)
    return StatsLogger(log_dir=tmp_path / "logs", rank=0, **kw)


# ---- commit semantics and JSONL ---------------------------------------------------------------------


def test_commit_writes_rows_at_increasing_steps_without_count_keys(tmp_path: Path) -> None:
    lg = _logger(tmp_path)
    lg.commit(0, 0, 0, {"loss": 1.5, "loss__count": 4.0, "lr": 1e-4})
    lg.commit(0, 1, 2, [{"a": 1.0}, {"a": 2.0}])  # a list: consecutive steps 2, 3
    lg.close()
    rows = read_jsonl(tmp_path / "logs" / "metrics.jsonl")
    assert [(r["step"], r["global_step"], r["epoch_step"], r["metrics"]) for r in rows] == [
        (0, 0, 0, {"loss": 1.5, "lr": 1e-4}), (2, 2, 1, {"a": 1.0}), (3, 2, 1, {"a": 2.0})]
    assert lg.last_step == 3


def test_a_non_increasing_step_is_skipped_with_a_warning(tmp_path: Path, caplog: Any) -> None:
    lg = _logger(tmp_path)
    lg.commit(0, 0, 5, {"x": 1.0})
    with caplog.at_level(logging.WARNING, logger="rltrace.stats"):
        lg.commit(0, 1, 5, {"x": 2.0})
        lg.commit(0, 2, 3, {"x": 3.0})
    lg.commit(0, 3, 6, {"x": 4.0})
    lg.close()
    steps = [r["step"] for r in read_jsonl(tmp_path / "logs" / "metrics.jsonl")]
    assert steps == [5, 6]
    assert sum("global_step 5 skipped" in r.message or "global_step 3 skipped" in r.message
               for r in caplog.records) == 2


def test_tensor_values_are_converted_and_non_numbers_left_out(tmp_path: Path) -> None:
    torch = need("torch", "tensor values need torch")
    lg = _logger(tmp_path)
    lg.commit(0, 0, 0, {"t": torch.tensor(2.5), "s": "text", "n": 3})
    lg.close()
    assert read_jsonl(tmp_path / "logs" / "metrics.jsonl")[0]["metrics"] == {"t": 2.5, "n": 3.0}


def test_console_prints_a_plain_table(tmp_path: Path) -> None:
    out = io.StringIO()
    lg = StatsLogger(log_dir=tmp_path, rank=0, jsonl=False, otel=False, stream=out)
    lg.sinks[0].use_rich = False  # the plain-text table whether or not rich is installed
    lg.commit(1, 2, 3, {"actor/loss": 0.25, "n": 128.0, "x__count": 2.0})
    assert out.getvalue() == (
        "epoch 1 step 2 global_step 3\n"
        "+------------+-------+\n"
        "| key        | value |\n"
        "+------------+-------+\n"
        "| actor/loss |  0.25 |\n"
        "| n          |   128 |\n"
        "+------------+-------+\n"
    )


def test_rank_other_than_zero_writes_nothing(tmp_path: Path) -> None:
    lg = StatsLogger(log_dir=tmp_path / "r1", rank=1, tensorboard=True, wandb="offline")
    assert lg.sinks == []
    lg.commit(0, 0, 0, {"x": 1.0})
    lg.close()
    assert not (tmp_path / "r1").exists()


def test_defaults_follow_the_rltrace_configuration(tmp_path: Path) -> None:
    rltrace.configure(fileroot=str(tmp_path), experiment_name="exp", trial_name="t1", flush_at_exit=False)
    lg = StatsLogger(console=False, otel=False)
    assert lg.log_dir == rltrace.runtime.get_pipeline().log_dir
    assert (lg.experiment_name, lg.trial_name) == ("exp", "t1")
    other = StatsLogger.get_log_path({"experiment_name": "e2", "trial_name": "t2", "fileroot": str(tmp_path)})
    assert other.parts[-2:] == ("e2", "t2") and str(other).startswith(str(tmp_path))
    lg.close()


def test_an_areal_style_config_object_is_accepted(tmp_path: Path) -> None:
    cfg = {"experiment_name": "e", "trial_name": "t", "fileroot": str(tmp_path),
           "wandb": {"mode": "disabled", "project": "p"}, "swanlab": {"mode": "disabled"},
           "tensorboard": {"path": None}}
    lg = StatsLogger(cfg, rank=0, console=False, otel=False)
    assert lg.config.wandb.project == "p" and [s.name for s in lg.sinks] == ["jsonl"]
    with pytest.raises(TypeError, match="unknown stats logger config key"):
        StatsLogger({"experiment_nmae": "x"}, rank=0)


# ---- failing sinks --------------------------------------------------------------------------------


class _Broken:
    name = "broken"

    def __init__(self) -> None:
        self.calls = 0

    def write(self, row: Any, info: Any) -> None:
        self.calls += 1
        raise RuntimeError("backend down")

    def close(self) -> None:
        raise RuntimeError("still down")


def test_a_failing_sink_is_logged_once_and_never_raises(tmp_path: Path, caplog: Any) -> None:
    broken = _Broken()
    lg = _logger(tmp_path, sinks=[broken])
    with caplog.at_level(logging.WARNING, logger="rltrace.stats"):
        for step in range(3):
            lg.commit(0, step, step, {"x": float(step)})
        lg.close()
    assert broken.calls == 3
    assert sum("the broken sink failed (training continues" in r.message for r in caplog.records) == 1
    assert len(read_jsonl(tmp_path / "logs" / "metrics.jsonl")) == 3  # the other sinks went on


def test_a_sink_that_cannot_start_is_off_and_the_others_work(tmp_path: Path, caplog: Any) -> None:
    need("wandb", "the W&B sink needs wandb")
    with caplog.at_level(logging.WARNING, logger="rltrace.stats"):
        lg = _logger(tmp_path, wandb={"mode": "no-such-mode", "dir": str(tmp_path / "wb")})
    lg.commit(0, 0, 0, {"x": 1.0})
    lg.close()
    assert any("wandb sink could not start" in r.message for r in caplog.records)
    assert [s.name for s in lg.sinks] == [] and len(read_jsonl(tmp_path / "logs" / "metrics.jsonl")) == 1


# ---- W&B offline --------------------------------------------------------------------------------


def _wandb_records(run_dir: Path) -> Any:
    spec = importlib.util.spec_from_file_location("read_offline_run", READ_OFFLINE)
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def test_wandb_offline_run_holds_the_committed_values_at_their_steps(tmp_path: Path,
                                                                      monkeypatch: Any) -> None:
    need("wandb", "the W&B sink needs wandb")
    if not READ_OFFLINE.is_file():
        pytest.skip(f"the offline-run reader is not at {READ_OFFLINE}")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    rltrace.configure(fileroot=str(tmp_path), experiment_name="grpo", trial_name="t0", flush_at_exit=False)
    lg = StatsLogger(rank=0, console=False, otel=False, wandb=True,
                     exp_config={"lr": 1e-5, "actor": {"model": "qwen"}})
    lg.commit(0, 0, 0, {"loss": 0.5, "loss__count": 3.0})
    lg.commit(0, 1, 1, {"loss": 0.25})
    lg.commit(0, 2, 1, {"loss": 99.0})  # not above the last step: skipped
    lg.commit(1, 0, 4, [{"loss": 0.125}, {"reward": 1.0}])
    lg.close()
    proc = subprocess.run([sys.executable, str(READ_OFFLINE), str(tmp_path / "wandb")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [(r["_step"], r.get("loss"), r.get("reward")) for r in rows] == [
        (0, 0.5, None), (1, 0.25, None), (4, 0.125, None), (5, None, 1.0)]
    assert not any(k.endswith("__count") for r in rows for k in r)
    reader = _wandb_records(tmp_path / "wandb")
    run = next(r.run for r in reader.records(str(tmp_path / "wandb")) if r.WhichOneof("record_type") == "run")
    assert (run.run_id, run.project, run.display_name, run.run_group) == (
        "grpo_t0_train", "grpo", "t0", "grpo_t0")
    config = {u.key: json.loads(u.value_json) for u in run.config.update}
    assert config["lr"] == 1e-5 and config["actor"] == {"model": "qwen"}
    assert config["rltrace"]["experiment_name"] == "grpo"  # rltrace's effective config too
    assert config["version_info"]["rltrace"] == rltrace.__version__ and "commit" in config["version_info"]


# ---- TensorBoard ------------------------------------------------------------------------------------


def _scalars(path: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util

    acc = EventAccumulator(str(path), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    out = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    for tag in acc.Tags()["tensors"]:  # tensorboard's own writer stores scalars as tensors
        out[tag] = [(e.step, float(tensor_util.make_ndarray(e.tensor_proto))) for e in acc.Tensors(tag)]
    return out


@pytest.mark.parametrize("backend", ["auto", "tensorboard"])
def test_tensorboard_event_files_hold_the_committed_values(tmp_path: Path, backend: str) -> None:
    need("tensorboard", "reading event files needs tensorboard")
    lg = _logger(tmp_path, tensorboard=True)
    if backend == "tensorboard":  # the framework-free writer used when torch is absent
        from tensorboard.summary import Writer

        lg.sinks[-1].writer.close()
        lg.sinks[-1].writer = Writer(str(tmp_path / "logs" / "tensorboard"))
    lg.commit(0, 0, 0, {"actor/loss": 0.5, "actor/loss__count": 2.0})
    lg.commit(0, 1, 3, {"actor/loss": 0.25, "timeperf/rollout": 1.5})
    lg.commit(0, 2, 2, {"actor/loss": 9.0})  # skipped
    lg.close()
    got = _scalars(tmp_path / "logs" / "tensorboard")
    assert got == {"actor/loss": [(0, 0.5), (3, 0.25)], "timeperf/rollout": [(3, 1.5)]}


# ---- OTel metrics -----------------------------------------------------------------------------------


def _points(reader: Any) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data else []:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                out.setdefault(m.name, []).extend(m.data.data_points)
    return out


def test_otel_sink_records_gauges_and_timing_histograms_beside_the_session_metrics(tmp_path: Path) -> None:
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    rltrace.configure(fileroot=str(tmp_path), session_tracer__enabled=True, metric_readers=[reader],
                      flush_at_exit=False)
    sid = rltrace.register_session()
    rltrace.trace_session_event("mark_finalized", session_id=sid, status="accepted")
    lg = StatsLogger(console=False, jsonl=False)
    lg.commit(0, 0, 0, {"actor/loss": 0.5, "timeperf/rollout": 2.0, "x__count": 1.0})
    lg.commit(0, 1, 1, {"actor/loss": 0.25, "timeperf/rollout": 4.0})
    rltrace.flush()
    points = _points(reader)
    assert points["rl.stats.actor/loss"][0].value == 0.25
    assert points["rl.commit.step"][0].value == 1
    hist = points["rl.timeperf.duration"][0]
    assert (hist.count, hist.sum, dict(hist.attributes)) == (2, 6.0, {"rl.timeperf.name": "rollout"})
    assert "rl.session.duration" in points  # the same MeterProvider as the session metrics
    assert not any("__count" in name for name in points)
    lg.close()


def test_otel_sink_without_a_meter_provider_is_a_noop_that_says_so_once(tmp_path: Path, caplog: Any) -> None:
    rltrace.configure(fileroot=str(tmp_path), flush_at_exit=False)
    assert rltrace.runtime.get_pipeline().meter_provider is None
    lg = StatsLogger(console=False, jsonl=False)
    with caplog.at_level(logging.INFO, logger="rltrace.stats"):
        lg.commit(0, 0, 0, {"x": 1.0})
        lg.commit(0, 1, 1, {"x": 2.0})
    assert sum("no OTel MeterProvider" in r.message for r in caplog.records) == 1
    lg.close()


def test_wandb_dir_defaults_to_the_log_dir_when_wandb_dir_is_unset(tmp_path: Path, monkeypatch: Any) -> None:
    need("wandb", "the W&B sink needs wandb")
    monkeypatch.delenv("WANDB_DIR", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    lg = StatsLogger({"experiment_name": "e", "trial_name": "t", "fileroot": str(tmp_path)}, rank=0,
                     console=False, otel=False, wandb={"mode": "offline", "id_suffix": None})
    lg.commit(0, 0, 0, {"x": 1.0})
    lg.close()
    runs = list((lg.log_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and runs[0].name.endswith("-e_t")
