"""``rltrace.stats`` as a drop-in for AReaL's ``areal.utils.stats_tracker``.

1. The behaviours of AReaL's own stats_tracker tests, written here for ``rltrace.stats``
   (AReaL's API: torch tensors, ``DistributedStatsTracker``, module-level functions).
2. A differential test: one scripted workload through AReaL's released module (the areal
   1.0.4 wheel, tests/helpers/areal_wheel.py) and through ``rltrace.stats``; the exported
   dicts must match key by key.
3. Two real gloo ranks: ``export_all(reduce_group=None)`` is this process only and waits for
   nobody; with an explicit group both ranks get what AReaL computes.

Deliberate differences from AReaL that the workload does not reach (each has a test below):
``export(key=..., reset=True)`` raises ``KeyError`` in AReaL 1.0.4 and works here; AReaL's
``export(key=...)`` returns tensors, rltrace floats; exporting a key that was never recorded
gives ``{key: nan, key__count: 0}`` in AReaL and ``{}`` here; a key exported by two trackers
is overwritten by the later one in AReaL's ``export_all`` and merged (mean and count over
both) here; NaN/inf among the masked elements or in a scalar raise ``ValueError`` here.
"""

from __future__ import annotations

import ast
import json
import logging
import os
import queue
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import HELPERS, need

torch = need("torch", "AReaL's stats_tracker API takes torch tensors")

import rltrace  # noqa: E402
from rltrace import stats  # noqa: E402
from rltrace.stats import tracker as rl_tracker_module  # noqa: E402

sys.path.insert(0, str(HELPERS))
import areal_wheel  # noqa: E402
from stats_areal_dist_worker import rank_data  # noqa: E402

WORKER = HELPERS / "stats_areal_dist_worker.py"

#: keys of the differential workload where rltrace deliberately differs from AReaL (key -> why)
DELIBERATE_DIFFERENCES: dict[str, str] = {}

#: AReaL 1.0.4's module-level names (read from the wheel's stats_tracker.py), minus its imports
AREAL_PUBLIC_NAMES = {
    "ReduceType", "MOE_AUX_LOSSES", "DistributedStatsTracker", "DEFAULT_TRACKER", "stat",
    "denominator", "export", "scope", "scalar", "record_timing", "scope_func_wrapper",
    "TRACKERS", "LOCK", "get", "export_all",
}
#: ``logger`` is AReaL's internal ``logging.Logger``, not API
AREAL_NAMES_NOT_MIRRORED = {"logger"}
#: the tracker's methods and attributes AReaL's code and tests use
AREAL_TRACKER_API = {
    "scope", "scope_func_wrapper", "Scope", "disable_scope", "record_timing", "denominator",
    "scalar", "stat", "export", "lock", "_get_full_key", "_set_reduce_type",
}


def _all_trackers_reset() -> None:
    for t in list(stats.TRACKERS.values()):
        t.reset()


@pytest.fixture(autouse=True)
def _only_what_the_test_records() -> Iterator[None]:
    stats.disable_span_timings()  # no timeperf/ keys derived from other tests' spans
    _all_trackers_reset()
    yield
    _all_trackers_reset()
    stats.enable_span_timings()


@pytest.fixture
def tracker() -> Any:
    return stats.DistributedStatsTracker()


def _areal() -> Any:
    reason = areal_wheel.skip_reason()
    if reason:
        pytest.skip(reason)
    return areal_wheel.areal_modules()


def _b(*xs: Any) -> Any:
    return torch.tensor(xs, dtype=torch.bool)


def _f(*xs: Any) -> Any:
    return torch.tensor(xs, dtype=torch.float32)


# ---- 1. AReaL's behaviours ------------------------------------------------------------------------


def test_every_public_name_of_areals_module_exists_in_rltrace_stats() -> None:
    missing = sorted(n for n in AREAL_PUBLIC_NAMES if not hasattr(stats, n))
    assert not missing
    assert rltrace.stats_tracker is stats
    assert stats.DistributedStatsTracker is stats.StatsTracker
    assert stats.DEFAULT_TRACKER is stats.DEFAULT is stats.get("") is stats.TRACKERS[""]
    assert isinstance(stats.MOE_AUX_LOSSES, dict)
    with stats.LOCK:  # a lock guarding TRACKERS
        pass
    assert [r.name for r in stats.ReduceType] == ["AVG_MIN_MAX", "AVG", "SUM", "MIN", "MAX", "SCALAR"]
    missing_api = sorted(n for n in AREAL_TRACKER_API if not hasattr(stats.DEFAULT_TRACKER, n))
    assert not missing_api
    assert callable(stats.disable_scope)


def test_the_name_lists_match_areals_released_module() -> None:
    with _areal() as m:
        source = Path(m.stats_tracker.__file__.split("!")[0])  # the wheel
        import zipfile

        with zipfile.ZipFile(source) as zf:
            tree = ast.parse(zf.read("areal/utils/stats_tracker.py").decode())
    top: set[str] = set()
    methods: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            top.add(node.name)
        elif isinstance(node, ast.Assign):
            top.update(t.id for t in node.targets if isinstance(t, ast.Name))
        if isinstance(node, ast.ClassDef) and node.name == "DistributedStatsTracker":
            methods = {n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    public = {n for n in top if not n.startswith("_")}
    assert public == AREAL_PUBLIC_NAMES | AREAL_NAMES_NOT_MIRRORED
    public_methods = {n for n in methods if not n.startswith("_")} - {"Scope"}
    assert public_methods <= AREAL_TRACKER_API
    assert all(hasattr(stats.StatsTracker, n) for n in public_methods)


def test_a_masked_stat_exports_avg_min_max_over_the_true_elements(tracker: Any) -> None:
    tracker.denominator(mask=_b(True, False, True))
    tracker.stat(denominator="mask", value=_f(1.0, 2.0, 3.0))
    assert tracker.export() == {"mask": 2.0, "value/avg": 2.0, "value/min": 1.0, "value/max": 3.0}


def test_scopes_nest_and_a_denominator_of_an_outer_scope_is_unknown_inside(tracker: Any) -> None:
    with tracker.scope("parent"):
        tracker.denominator(parent_mask=_b(True))
        tracker.stat(parent_value=_f(1.0), denominator="parent_mask")
        with tracker.scope("child"):
            with pytest.raises(ValueError, match="Denominator `parent/child/child_mask` does not exist"):
                tracker.stat(denominator="child_mask", value=_f(1.0))
            tracker.denominator(child_mask=_b(True))
            tracker.stat(denominator="child_mask", value=_f(1.0))
    assert set(tracker.export()) == {
        "parent/parent_mask", "parent/parent_value/avg", "parent/parent_value/min",
        "parent/parent_value/max", "parent/child/child_mask", "parent/child/value/avg",
        "parent/child/value/min", "parent/child/value/max"}


def test_sum_min_max_reduce_types_export_one_key_over_the_masked_elements(tracker: Any) -> None:
    tracker.denominator(mask=_b(True, False, True))
    values = _f(1.0, 2.0, 3.0)
    tracker.stat(denominator="mask", reduce_type=stats.ReduceType.SUM, sum_val=values)
    tracker.stat(denominator="mask", reduce_type=stats.ReduceType.MIN, min_val=values)
    tracker.stat(denominator="mask", reduce_type=stats.ReduceType.MAX, max_val=values)
    tracker.stat(denominator="mask", reduce_type=stats.ReduceType.AVG, avg_val=values)
    assert tracker.export() == {"mask": 2.0, "sum_val": 4.0, "min_val": 1.0, "max_val": 3.0, "avg_val": 2.0}


def test_bad_masks_and_shapes_raise_areals_exception_types_and_messages(tracker: Any) -> None:
    with pytest.raises(ValueError, match=r"`invalid` must be a pytorch bool tensor: torch\.float32"):
        tracker.denominator(invalid=_f(1.0))
    with pytest.raises(TypeError):  # rltrace's type before: still caught as a TypeError
        tracker.denominator(invalid=_f(1.0))
    with pytest.raises(ValueError, match="`mask` must be non-empty"):
        tracker.denominator(mask=torch.zeros(0, dtype=torch.bool))
    tracker.denominator(mask=_b(True))
    with pytest.raises(ValueError, match="Denominator `nonexistent` does not exist"):
        tracker.stat(denominator="nonexistent", value=_f(1.0))
    with pytest.raises(AssertionError):
        tracker.stat(denominator="mask", value=_f(1.0, 2.0))
    with pytest.raises(ValueError, match="`value` should be non-empty"):
        tracker.stat(denominator="mask", value=torch.zeros(0))
    with pytest.raises(ValueError, match="Cannot use the scalar reduce type for a tensor"):
        tracker.stat(denominator="mask", reduce_type=stats.ReduceType.SCALAR, value=_f(1.0))
    assert issubclass(stats.StatsShapeError, AssertionError) and issubclass(stats.StatsShapeError, ValueError)
    assert issubclass(stats.StatsTypeError, ValueError) and issubclass(stats.StatsTypeError, TypeError)
    assert tracker.export() == {"mask": 1.0}  # nothing of the rejected calls was kept


def test_the_nth_stat_of_a_key_is_reduced_over_the_nth_mask_of_its_denominator(tracker: Any) -> None:
    tracker.denominator(mask=_b(True, False))
    tracker.denominator(mask=_b(False, True))
    tracker.stat(denominator="mask", value=_f(1.0, 2.0))  # with the 1st mask: 1
    tracker.stat(denominator="mask", value=_f(3.0, 4.0))  # with the 2nd mask: 4
    assert tracker.export()["value/avg"] == 2.5


def test_a_later_denominator_call_does_not_change_an_earlier_stat(tracker: Any) -> None:
    tracker.denominator(mask=_b(True, False))
    tracker.stat(denominator="mask", value=_f(1.0, 9.0))
    tracker.denominator(mask=_b(False, True))  # a new mask for the next micro-batch
    assert tracker.export(reset=False) == {"mask": 2.0, "value/avg": 1.0, "value/min": 1.0,
                                           "value/max": 1.0}
    tracker.stat(denominator="mask", value=_f(5.0, 3.0))  # with the 2nd mask: 3
    assert tracker.export()["value/avg"] == 2.0


def test_a_stat_recorded_before_its_mask_waits_for_it_and_is_left_out_with_a_warning_otherwise(
        tracker: Any, caplog: pytest.LogCaptureFixture) -> None:
    tracker.denominator(mask=_b(True, False))
    tracker.stat(denominator="mask", value=_f(1.0, 2.0))
    tracker.stat(denominator="mask", value=_f(5.0, 6.0))  # no 2nd mask yet
    assert tracker.export(reset=False)["value/avg"] == 1.0
    tracker.denominator(mask=_b(False, True))  # the 2nd mask: the waiting stat counts 6
    assert tracker.export(reset=False)["value/avg"] == 3.5
    tracker.stat(denominator="mask", value=_f(7.0, 8.0))  # a 3rd stat, never given a mask
    with caplog.at_level(logging.WARNING, logger="rltrace.stats"):
        out = tracker.export()
    assert out == {"mask": 2.0, "value/avg": 3.5, "value/min": 1.0, "value/max": 6.0}
    assert "left out" in caplog.text and "value" in caplog.text
    assert tracker.export() == {}


def test_a_mask_selecting_nothing_exports_the_zero_denominator_but_no_avg_min_max(tracker: Any) -> None:
    tracker.denominator(mask=_b(False, False))
    tracker.stat(denominator="mask", value=_f(1.0, 2.0))
    assert tracker.export() == {"mask": 0.0}


def test_export_of_one_key_uses_the_scoped_full_key_and_leaves_the_others(tracker: Any) -> None:
    tracker.denominator(mask1=_b(True), mask2=_b(True))
    tracker.stat(denominator="mask1", value1=_f(1.0))
    tracker.stat(denominator="mask2", value2=_f(2.0))
    assert tracker.export(key="value1") == {"value1/avg": 1.0, "value1/min": 1.0, "value1/max": 1.0}
    named = stats.get("compat_named")
    with named.scope("s"):
        named.scalar(x=1.0)
        assert named.export(key="x", reset=False) == {"compat_named/s/x": 1.0, "compat_named/s/x__count": 1}
    assert set(tracker.export()) == {"mask1", "mask2", "value2/avg", "value2/min", "value2/max"}


def test_scalars_export_their_mean_and_an_integer_count(tracker: Any) -> None:
    tracker.scalar(scalar1=1.0, scalar2=2.0)
    tracker.scalar(scalar1=3.0, scalar2=4)
    out = tracker.export()
    assert out == {"scalar1": 2.0, "scalar1__count": 2, "scalar2": 3.0, "scalar2__count": 2}
    assert type(out["scalar1__count"]) is int


def test_an_empty_tracker_exports_an_empty_dict(tracker: Any) -> None:
    assert tracker.export() == {}


def test_export_resets_by_default_and_keeps_everything_with_reset_false(tracker: Any) -> None:
    tracker.denominator(mask=_b(True))
    tracker.stat(denominator="mask", value=_f(1.0))
    assert "value/avg" in tracker.export(reset=False)
    assert "value/avg" in tracker.export()
    assert tracker.export() == {}
    with pytest.raises(ValueError, match="does not exist"):  # the reset dropped the masks too
        tracker.stat(denominator="mask", value=_f(1.0))


def test_module_level_functions_record_into_default_tracker() -> None:
    stats.denominator(mask=_b(True, False, True))
    stats.stat(denominator="mask", value=_f(1.0, 2.0, 3.0))
    stats.stat("mask", stats.ReduceType.SUM, total=_f(1.0, 2.0, 3.0))  # AReaL's positional order
    assert stats.DEFAULT_TRACKER.export(reset=False)["value/avg"] == 2.0
    assert stats.export() == {"mask": 2.0, "value/avg": 2.0, "value/min": 1.0, "value/max": 3.0, "total": 4.0}


def test_reduce_type_validation_raises_value_errors(tracker: Any) -> None:
    with pytest.raises(ValueError, match="reduce_type must be a ReduceType enum"):
        tracker._set_reduce_type("key", "invalid_type")
    tracker.denominator(mask=_b(True))
    with pytest.raises(ValueError, match="reduce_type must be a ReduceType enum"):
        tracker.stat(denominator="mask", reduce_type="invalid", value=_f(1.0))
    with pytest.raises(ValueError):
        tracker.stat(denominator="mask", reduce_type=stats.ReduceType.SCALAR, value=_f(1.0))


def test_full_keys_join_the_tracker_name_and_the_open_scopes() -> None:
    t = stats.DistributedStatsTracker()
    assert t._get_full_key("key") == "key"
    with t.scope("scope1"):
        assert t._get_full_key("key") == "scope1/key"
        with t.scope("scope2"):
            assert t._get_full_key("key") == "scope1/scope2/key"
    assert stats.DistributedStatsTracker(name="")._get_full_key("key") == "key"
    assert stats.DistributedStatsTracker(name="root")._get_full_key("key") == "root/key"


def test_disable_scope_drops_the_open_scopes_and_the_tracker_name_until_the_block_ends() -> None:
    named = stats.get("compat_disable")
    with named.scope("outer"):
        with named.disable_scope():
            named.scalar(bare=1.0)
            with named.scope("inner"):
                named.scalar(x=2.0)
        named.scalar(back=3.0)
    with stats.scope("s"), stats.disable_scope():
        stats.scalar(top=4.0)
    assert {k: v for k, v in stats.export_all().items() if not k.endswith("__count")} == {
        "bare": 1.0, "inner/x": 2.0, "compat_disable/outer/back": 3.0, "top": 4.0}


def test_record_timing_is_under_timeperf_whatever_the_scope_or_tracker_name() -> None:
    named = stats.get("compat_timing")
    with named.scope("s"), named.record_timing("wait"):
        pass
    out = stats.export_all()
    assert set(out) == {"timeperf/wait", "timeperf/wait__count"} and out["timeperf/wait__count"] == 1


def test_areals_own_reduce_type_members_are_accepted() -> None:
    with _areal() as m:
        t = stats.DistributedStatsTracker()
        t.denominator(mask=_b(True, True))
        t.stat(denominator="mask", reduce_type=m.stats_tracker.ReduceType.SUM, x=_f(1.0, 2.0))
        assert t.export() == {"mask": 2.0, "x": 3.0}


def test_deliberate_export_key_differences_from_areal_1_0_4() -> None:
    with _areal() as m:
        theirs = m.stats_tracker.DistributedStatsTracker()
        theirs.scalar(x=1.0)
        with pytest.raises(KeyError):  # AReaL's defect: popping the key twice
            theirs.export(key="x", reset=True)
        nan = theirs.export(key="never", reset=False)
        assert nan["never__count"] == 0 and np.isnan(nan["never"])
    ours = stats.DistributedStatsTracker()
    ours.scalar(x=1.0)
    assert ours.export(key="x", reset=True) == {"x": 1.0, "x__count": 1}
    assert ours.export(key="never") == {}


def test_a_key_recorded_by_two_trackers_is_merged_by_export_all() -> None:
    stats.scalar(shared=1.0)
    with stats.get("compat_other").disable_scope():
        stats.get("compat_other").scalar(shared=3.0)
    assert stats.export_all() == {"shared": 2.0, "shared__count": 2}


# ---- 2. differential: AReaL's released module and rltrace on one workload ------------------------


class StepClock:
    """A deterministic ``time`` stand-in: ``perf_counter`` advances by a fixed pattern."""

    def __init__(self) -> None:
        self.now = 100.0
        self.steps = iter([0.25, 0.5, 1.25, 2.0, 0.75, 3.5, 0.125, 1.0] * 8)

    def perf_counter(self) -> float:
        self.now += next(self.steps)
        return self.now


def _data() -> dict[str, Any]:
    g = torch.Generator().manual_seed(1234)

    def mask(*shape: int) -> Any:
        m = torch.rand(*shape, generator=g) < 0.6
        m.view(-1)[0] = True
        return m

    def vals(*shape: int) -> Any:
        return torch.randn(*shape, generator=g).to(torch.float32)

    return {
        "mbs": [{"tokens": mask(2, 5 + i), "seqs": mask(2), "clip": mask(2, 5 + i),
                 "logp": vals(2, 5 + i), "ent": vals(2, 5 + i), "rew": vals(2),
                 "ratio": vals(2, 5 + i).abs() + 0.5} for i in range(3)],
        "late": [mask(4), mask(4)], "late_x": [vals(4), vals(4)],
        "after": [mask(3), mask(3)], "after_y": [vals(3), vals(3)],
        "turn_mask": mask(6), "turns": vals(6).abs(),
        "step2": [mask(2, 4), vals(2, 4), vals(2, 4)],
    }


def workload(st: Any, d: dict[str, Any]) -> list[dict[str, Any]]:
    """AReaL-style calls on ``st`` (AReaL's module or rltrace.stats); returns every export."""
    rt = st.ReduceType
    out = []
    with st.scope("actor"):
        for i, mb in enumerate(d["mbs"]):
            st.denominator(n_tokens=mb["tokens"], n_seqs=mb["seqs"])
            st.stat(denominator="n_tokens", logprob=mb["logp"], entropy=mb["ent"])
            st.stat(denominator="n_tokens", reduce_type=rt.SUM, n_valid=torch.ones_like(mb["logp"]))
            st.stat(denominator="n_seqs", reduce_type=rt.AVG, reward=mb["rew"])
            with st.scope("clip"):
                st.denominator(clipped=mb["clip"])
                st.stat(denominator="clipped", reduce_type=rt.MIN, ratio_min=mb["ratio"])
                st.stat(denominator="clipped", reduce_type=rt.MAX, ratio_max=mb["ratio"])
            st.scalar(lr=1e-5 * (i + 1), grad_norm=0.5 + i)
        # two masks first, then their stats: the n-th stat pairs with the n-th mask
        st.denominator(late=d["late"][0])
        st.denominator(late=d["late"][1])
        st.stat(denominator="late", x=d["late_x"][0])
        st.stat(denominator="late", x=d["late_x"][1])
        # a denominator call after a stat does not change that stat
        st.denominator(after=d["after"][0])
        st.stat(denominator="after", y=d["after_y"][0])
        st.denominator(after=d["after"][1])
        # a mask that selects nothing
        st.denominator(none=torch.zeros(3, dtype=torch.bool))
        st.stat(denominator="none", z=d["after_y"][0])
        st.stat(denominator="none", reduce_type=rt.SUM, z_sum=d["after_y"][0])
        with st.record_timing("inner_step"):  # timeperf/, not actor/
            pass
        out.append(st.export(key="logprob", reset=False))
    with st.record_timing("train_step"):
        pass
    with st.record_timing("train_step"):
        pass
    rollout = st.get("rollout")
    rollout.scalar(reward=0.75)
    rollout.scalar(reward=0.25)
    with rollout.scope("episode"):
        rollout.denominator(turn_mask=d["turn_mask"])
        rollout.stat(denominator="turn_mask", turns=d["turns"])
        with rollout.disable_scope():
            rollout.scalar(global_reward=2.0)
        with rollout.record_timing("rollout_wait"):
            pass
    out.append(st.export(reset=False))  # the default tracker only, kept
    out.append(st.export_all())  # everything, then reset
    # step 2: fresh state after the reset; one stat never gets its mask (left out by both)
    mask, v, w = d["step2"]
    with st.scope("actor"):
        st.denominator(n_tokens=mask)
        st.stat(denominator="n_tokens", logprob=v)
        st.stat(denominator="n_tokens", logprob=w)
        st.scalar(lr=3e-5)
    out.append(st.export_all(reduce_group=None))
    out.append(st.export_all())  # nothing left
    return out


def _plain(v: Any) -> Any:
    return v.item() if torch.is_tensor(v) else v


def test_one_workload_through_areals_module_and_rltrace_exports_the_same_dicts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    data = _data()
    with _areal() as m:
        monkeypatch.setattr(m.stats_tracker, "time", StepClock())
        theirs = workload(m.stats_tracker, data)
    monkeypatch.setattr(rl_tracker_module, "time", StepClock())
    ours = workload(stats, data)
    assert len(ours) == len(theirs)
    for n, (a, b) in enumerate(zip(theirs, ours, strict=True)):
        a = {k: _plain(v) for k, v in a.items() if k not in DELIBERATE_DIFFERENCES}
        b = {k: v for k, v in b.items() if k not in DELIBERATE_DIFFERENCES}
        assert sorted(a) == sorted(b), f"export {n}: keys differ"
        for k in a:
            assert b[k] == pytest.approx(a[k], rel=1e-6, abs=1e-7), f"export {n}: {k}"
            if k.endswith("__count"):
                assert type(a[k]) is type(b[k]) is int, f"export {n}: {k} is not an int"
    # the clock's steps (inner_step 0.5; train_step 2.0 and 3.5), not the wall clock
    assert ours[2]["timeperf/inner_step"] == 0.5 and ours[2]["timeperf/train_step"] == 2.75
    assert theirs[-1] == ours[-1] == {}


# ---- 3. two gloo ranks ------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Rank:
    """One worker process; its stdout lines arrive on a queue read with a timeout."""

    def __init__(self, mode: str, port: int, rank: int, world: int, workdir: Path) -> None:
        env = {k: v for k, v in os.environ.items()
               if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
        repo = str(Path(rltrace.__file__).resolve().parents[1])
        env["PYTHONPATH"] = os.pathsep.join([repo, *filter(None, [env.get("PYTHONPATH")])])
        env["OMP_NUM_THREADS"] = "1"
        wheel = areal_wheel.find_wheel()
        if wheel is not None:
            env[areal_wheel.WHEEL_ENV] = str(wheel.resolve())
        self.stderr_path = workdir / f"rank{rank}.stderr"
        with open(self.stderr_path, "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, str(WORKER), mode, str(port), str(rank), str(world)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True,
                cwd=str(workdir), env=env, start_new_session=True, restore_signals=True)
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def next_json(self, timeout: float, what: str) -> dict[str, Any]:
        while True:
            try:
                line = self.lines.get(timeout=timeout)
            except queue.Empty:
                raise AssertionError(f"no {what} within {timeout}s:\n{self.stderr()}") from None
            if line is None:
                raise AssertionError(f"exited ({self.proc.wait(5)}) before {what}:\n{self.stderr()}")
            if line.startswith("{"):
                return dict(json.loads(line))

    def send(self, word: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(word + "\n")
        self.proc.stdin.flush()

    def stderr(self) -> str:
        return self.stderr_path.read_text()[-3000:]

    def finish(self, timeout: float) -> None:
        rc = self.proc.wait(timeout)
        assert rc == 0, f"exited {rc}:\n{self.stderr()}"

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def _ranks(mode: str, world: int, workdir: Path) -> list[_Rank]:
    port = _free_port()
    return [_Rank(mode, port, r, world, workdir) for r in range(world)]


def _expected(ranks: list[int]) -> dict[str, Any]:
    """What export_all returns over the data of ``ranks`` (numpy, float64)."""
    mbs = [mb for r in ranks for mb in rank_data(r)["mbs"]]
    mask = np.concatenate([mb["mask"].ravel() for mb in mbs])
    logp = np.concatenate([mb["logp"].ravel() for mb in mbs]).astype(np.float64)[mask]
    adv = np.concatenate([mb["adv"].ravel() for mb in mbs]).astype(np.float64)[mask]
    losses = [mb["loss"] for mb in mbs]
    return {
        "actor/n_tokens": float(mask.sum()),
        "actor/logp/avg": logp.mean(), "actor/logp/min": logp.min(), "actor/logp/max": logp.max(),
        "actor/adv_sum": adv.sum(), "actor/adv_max": adv.max(),
        "actor/loss": float(np.mean(losses)), "actor/loss__count": len(losses),
        "rollout/reward": float(np.mean([0.25 * (r + 1) for r in ranks])),
        "rollout/reward__count": len(ranks),
    }


@pytest.mark.timeout(300)
def test_export_all_with_reduce_group_none_on_one_gloo_rank_is_local_and_does_not_wait(
        tmp_path: Path) -> None:
    ranks = _ranks("local", 2, tmp_path)
    try:
        assert ranks[1].next_json(120, "rank 1 ready")["ready"]
        # rank 1 is blocked on its stdin, exporting nothing: rank 0's export must not wait for it
        first = ranks[0].next_json(120, "rank 0's export_all(reduce_group=None) while rank 1 is idle")
        assert first["default_group_size"] == 2  # a default group exists; None still means local
        assert first["stats"] == pytest.approx(_expected([0]), rel=1e-6)
        ranks[1].send("go")
        second = ranks[1].next_json(120, "rank 1's export")
        assert second["stats"] == pytest.approx(_expected([1]), rel=1e-6)
        for r in ranks:
            r.send("exit")
        for r in ranks:
            r.finish(60)
    finally:
        for r in ranks:
            r.kill()


@pytest.mark.timeout(300)
def test_export_all_with_an_explicit_gloo_group_gives_both_ranks_areals_reduced_values(
        tmp_path: Path) -> None:
    ranks = _ranks("group", 2, tmp_path)
    try:
        outs = [r.next_json(180, f"rank {i}'s export over the group") for i, r in enumerate(ranks)]
        for r in ranks:
            r.finish(60)
    finally:
        for r in ranks:
            r.kill()
    expected = _expected([0, 1])
    for o in outs:
        assert o["stats"] == pytest.approx(expected, rel=1e-6)
        assert isinstance(o["stats"]["actor/loss__count"], int)
    assert outs[0]["stats"] == outs[1]["stats"]
    if areal_wheel.skip_reason() is None:
        for o in outs:
            assert o["areal"] is not None
            assert sorted(o["areal"]) == sorted(o["stats"])
            assert o["stats"] == pytest.approx(o["areal"], rel=1e-6)
