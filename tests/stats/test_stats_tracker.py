"""The stats tracker: reduce types, masks, scopes, scalars, timings, export/reset, bad input.

Every reduce type is checked with numpy, torch and jax inputs against numpy computed here.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from conftest import need

import rltrace
from rltrace import stats
from rltrace.stats import ReduceType, StatsTracker, partials

VALUES = [0.5, -2.0, 3.25, 8.0, 1.0, -0.75]
MASK = [True, False, True, True, False, True]


def _numpy() -> tuple[Callable[..., Any], Callable[..., Any]]:
    return (lambda x, dtype=float: np.asarray(x, dtype=dtype)), (lambda m: np.asarray(m, dtype=bool))


def _torch() -> tuple[Callable[..., Any], Callable[..., Any]]:
    torch = need("torch", "torch inputs need torch")
    dtypes = {float: torch.float32, int: torch.int64}
    return (lambda x, dtype=float: torch.tensor(x, dtype=dtypes[dtype])), (lambda m: torch.tensor(m))


def _jax() -> tuple[Callable[..., Any], Callable[..., Any]]:
    jnp = need("jax.numpy", "jax inputs need jax")
    dtypes = {float: jnp.float32, int: jnp.int32}
    return ((lambda x, dtype=float: jnp.asarray(x, dtype=dtypes[dtype])),
            (lambda m: jnp.asarray(m, dtype=bool)))


@pytest.fixture(params=["numpy", "torch", "jax"])
def xp(request: pytest.FixtureRequest) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """(array constructor, mask constructor) of one framework."""
    return {"numpy": _numpy, "torch": _torch, "jax": _jax}[request.param]()


@pytest.fixture(autouse=True)
def _clean_default_tracker() -> Iterator[None]:
    bridge = stats.span_timings()
    if bridge is not None:
        bridge.drain()  # spans of earlier tests must not show up in these exports
    stats.reset()
    yield
    stats.reset()


def _masked(values: list[float] = VALUES, mask: list[bool] = MASK) -> np.ndarray:
    return np.asarray(values)[np.asarray(mask)]


# ---- reduce types --------------------------------------------------------------------------------


def test_default_reduce_type_exports_masked_avg_min_max_and_the_denominator_count(xp: Any) -> None:
    arr, mask = xp
    t = StatsTracker()
    t.denominator(valid=mask(MASK))
    t.stat(x=arr(VALUES), denominator="valid")
    sel = _masked()
    assert t.export() == pytest.approx(
        {"valid": 4.0, "x/avg": sel.mean(), "x/min": sel.min(), "x/max": sel.max()}, rel=1e-6
    )


@pytest.mark.parametrize("rt, fn", [
    (ReduceType.AVG, np.mean), (ReduceType.MIN, np.min), (ReduceType.MAX, np.max), (ReduceType.SUM, np.sum),
    ("avg", np.mean), ("sum", np.sum),
])
def test_each_reduce_type_exports_one_key_over_the_masked_elements(xp: Any, rt: Any, fn: Any) -> None:
    arr, mask = xp
    t = StatsTracker()
    t.denominator(valid=mask(MASK))
    t.stat(x=arr(VALUES), denominator="valid", reduce_type=rt)
    assert t.export() == pytest.approx({"valid": 4.0, "x": float(fn(_masked()))}, rel=1e-6)


def test_several_calls_reduce_like_the_concatenated_data(xp: Any) -> None:
    arr, mask = xp
    t = StatsTracker()
    a, ma = [1.0, 2.0, 10.0], [True, True, False]
    b, mb = [4.0, -3.0, 7.0, 0.0], [False, True, True, True]
    for v, m in ((a, ma), (b, mb)):
        t.denominator(n=mask(m))
        t.stat(x=arr(v), denominator="n")
        t.stat(s=arr(v, int), denominator="n", reduce_type="sum")
    sel = np.concatenate([_masked(a, ma), _masked(b, mb)])
    assert t.export() == pytest.approx({"n": 5.0, "x/avg": sel.mean(), "x/min": sel.min(),
                                        "x/max": sel.max(), "s": sel.sum()}, rel=1e-6)


def test_a_stat_without_denominator_uses_every_element(xp: Any) -> None:
    arr, _ = xp
    t = StatsTracker()
    t.stat(x=arr([[1.0, 2.0], [3.0, 6.0]]), reduce_type="avg")
    assert t.export() == {"x": 3.0}


def test_a_mask_selecting_nothing_exports_no_mean_min_max_but_sum_zero(xp: Any) -> None:
    arr, mask = xp
    t = StatsTracker()
    t.denominator(none=mask([False, False]))
    t.stat(x=arr([1.0, 2.0]), denominator="none")
    t.stat(s=arr([1.0, 2.0]), denominator="none", reduce_type="sum")
    assert t.export() == {"none": 0.0, "s": 0.0}


def test_python_lists_and_numbers_are_accepted() -> None:
    t = StatsTracker()
    t.denominator(m=[True, False, True])
    t.stat(x=[1, 2, 3], denominator="m", reduce_type="max")
    t.stat(y=4.0, reduce_type="sum")
    assert t.export() == {"m": 2.0, "x": 3.0, "y": 4.0}


def test_nan_in_masked_out_elements_is_ignored(xp: Any) -> None:
    arr, mask = xp
    t = StatsTracker()
    t.denominator(m=mask([True, False]))
    t.stat(x=arr([2.0, math.nan]), denominator="m", reduce_type="avg")
    assert t.export() == {"m": 1.0, "x": 2.0}


# ---- scalars, timings, scopes -------------------------------------------------------------------


def test_scalars_export_their_mean_and_count(xp: Any) -> None:
    arr, _ = xp
    t = StatsTracker()
    t.scalar(loss=1.0, lr=1e-4)
    t.scalar(loss=arr([2.0]))  # a one-element tensor/array counts as a number
    t.scalar(loss=np.float32(6.0))
    assert t.export() == pytest.approx({"loss": 3.0, "loss__count": 3.0, "lr": 1e-4, "lr__count": 1.0})


def test_scopes_nest_into_slash_separated_keys_and_unwind() -> None:
    t = StatsTracker()
    with t.scope("actor"):
        t.scalar(loss=1.0)
        with t.scope("optimizer"):
            t.scalar(lr=0.1)
            assert t.current_scope() == "actor/optimizer"
        t.denominator(n=np.array([True]))
        t.stat(v=np.array([2.0]), denominator="n")
    t.scalar(top=3.0)
    assert set(t.export()) == {"actor/loss", "actor/loss__count", "actor/optimizer/lr",
                               "actor/optimizer/lr__count", "actor/n", "actor/v/avg", "actor/v/min",
                               "actor/v/max", "top", "top__count"}


def test_scope_func_wrapper_scopes_sync_async_and_generator_functions() -> None:
    t = StatsTracker()

    @t.scope_func_wrapper("sync")
    def f() -> int:
        t.scalar(x=1.0)
        return 7

    @t.scope("coro")  # scope() is a decorator too
    async def g() -> None:
        await asyncio.sleep(0)
        t.scalar(x=2.0)

    @t.scope_func_wrapper("gen")
    def h() -> Iterator[int]:
        t.scalar(x=3.0)
        yield 1
        t.scalar(y=4.0)
        yield 2

    @t.scope_func_wrapper("agen")
    async def k() -> Any:
        t.scalar(x=5.0)
        yield 1

    async def consume() -> list[int]:
        return [i async for i in k()]

    assert f() == 7
    asyncio.run(g())
    for _ in h():
        t.scalar(outside=1.0)  # the consumer's code is not inside the generator's scope
    assert asyncio.run(consume()) == [1]
    assert sorted(k for k in t.export() if not k.endswith("__count")) == [
        "agen/x", "coro/x", "gen/x", "gen/y", "outside", "sync/x"]


def test_scopes_are_per_thread() -> None:
    t = StatsTracker()
    entered, done = threading.Event(), threading.Event()

    def other() -> None:
        entered.wait(5)
        t.scalar(b=1.0)  # the main thread's open scope does not apply here
        done.set()

    th = threading.Thread(target=other)
    th.start()
    with t.scope("main"):
        entered.set()
        assert done.wait(5)
        t.scalar(a=1.0)
    th.join(5)
    assert {"main/a", "b"} <= set(t.export())


def test_record_timing_records_seconds_under_timeperf_ignoring_scopes() -> None:
    t = StatsTracker()
    with t.scope("actor"):
        t0 = time.perf_counter()
        with t.record_timing("train_step"):
            busy = time.perf_counter() + 0.01
            while time.perf_counter() < busy:
                pass
        measured = time.perf_counter() - t0
    out = t.export()
    assert set(out) == {"timeperf/train_step", "timeperf/train_step__count"}
    assert 0.01 <= out["timeperf/train_step"] <= measured


def test_named_trackers_prefix_their_keys_and_export_all_merges_every_tracker() -> None:
    stats.scalar(a=1.0)
    rollout = stats.get("rollout")
    assert stats.get("rollout") is rollout
    rollout.scalar(reward=2.0)
    with rollout.scope("episode"):
        rollout.scalar(turns=3.0)
    out = stats.export_all()
    assert {k: v for k, v in out.items() if not k.endswith("__count")} == {
        "a": 1.0, "rollout/reward": 2.0, "rollout/episode/turns": 3.0}
    assert stats.export_all() == {}


def test_module_level_functions_use_the_default_tracker_and_rltrace_exposes_the_alias() -> None:
    assert rltrace.stats is rltrace.stats_tracker
    with rltrace.stats_tracker.scope("s"):
        rltrace.stats_tracker.denominator(m=np.array([True, True]))
        rltrace.stats_tracker.stat(x=np.array([1.0, 3.0]), denominator="m", reduce_type="avg")
        rltrace.stats_tracker.scalar(y=1.0)
    with stats.record_timing("t"):
        pass
    out = stats.export()
    assert out["s/x"] == 2.0 and out["s/y"] == 1.0 and "timeperf/t" in out and out["s/m"] == 2.0


# ---- export / reset --------------------------------------------------------------------------------


def test_export_resets_by_default_and_accumulates_with_reset_false() -> None:
    t = StatsTracker()
    t.scalar(x=1.0)
    assert t.export(reset=False) == {"x": 1.0, "x__count": 1.0}
    t.scalar(x=3.0)
    assert t.export() == {"x": 2.0, "x__count": 2.0}
    assert t.export() == {}


def test_reset_also_drops_denominators() -> None:
    t = StatsTracker()
    t.denominator(m=np.array([True]))
    t.export()
    with pytest.raises(ValueError, match="unknown denominator 'm'"):
        t.stat(x=np.array([1.0]), denominator="m")


def test_export_of_one_key_leaves_the_others() -> None:
    t = StatsTracker()
    with t.scope("a"):
        t.scalar(x=1.0, y=2.0)
    t.scalar(b=3.0)
    assert t.export(key="a") == {"a/x": 1.0, "a/x__count": 1.0, "a/y": 2.0, "a/y__count": 1.0}
    assert t.export() == {"b": 3.0, "b__count": 1.0}


def test_accelerator_values_are_read_back_at_export_and_checked_there(monkeypatch: Any) -> None:
    jnp = need("jax.numpy", "the deferred path is exercised with jax arrays")
    monkeypatch.setattr(partials, "_jax_on_cpu", lambda value: False)  # treat as on a TPU/GPU
    t = StatsTracker()
    t.denominator(m=jnp.array([True, True, False]))
    t.stat(x=jnp.array([1.0, 3.0, math.nan]), denominator="m")
    assert t._deferred, "values should stay on the device until export"
    assert t.export() == {"m": 2.0, "x/avg": 2.0, "x/min": 1.0, "x/max": 3.0}
    t.denominator(m=jnp.array([True]))
    t.stat(bad=jnp.array([math.inf]), denominator="m")  # no error (and no sync) when recorded
    with pytest.raises(ValueError, match="'bad'"):
        t.export()


# ---- bad input ------------------------------------------------------------------------------------


def test_mask_shape_mismatch_names_the_key_and_both_shapes(xp: Any) -> None:
    arr, mask = xp
    t = StatsTracker()
    with t.scope("actor"):
        t.denominator(m=mask([True, False]))
        with pytest.raises(ValueError, match=r"'actor/x' has shape \(3,\).*'actor/m' has shape \(2,\)"):
            t.stat(x=arr([1.0, 2.0, 3.0]), denominator="m")


def test_a_non_boolean_mask_is_a_type_error_naming_the_key(xp: Any) -> None:
    arr, _ = xp
    t = StatsTracker()
    with pytest.raises(TypeError, match="'n_tokens' must be a boolean mask"):
        t.denominator(n_tokens=arr([1.0, 0.0]))
    with pytest.raises(TypeError, match="'ints' must be a boolean mask"):
        t.denominator(ints=[1, 0])


def test_non_finite_values_are_value_errors_naming_the_key(xp: Any) -> None:
    arr, mask = xp
    t = StatsTracker()
    t.denominator(m=mask([True, True]))
    with pytest.raises(ValueError, match="'logp' has 1 non-finite"):
        t.stat(logp=arr([1.0, math.inf]), denominator="m")
    with pytest.raises(ValueError, match="'loss' is nan"):
        t.scalar(loss=math.nan)
    with pytest.raises(ValueError, match="'loss' is inf"):
        t.scalar(loss=arr([math.inf]))
    assert t.export() == {"m": 2.0}  # nothing of the rejected calls was kept


def test_unknown_denominator_is_a_value_error_listing_the_known_ones() -> None:
    t = StatsTracker()
    t.denominator(valid=np.array([True]))
    with pytest.raises(ValueError, match=r"unknown denominator 'vaild' for 'x'.*known: valid"):
        t.stat(x=np.array([1.0]), denominator="vaild")


def test_other_bad_input_gives_clear_errors() -> None:
    t = StatsTracker()
    with pytest.raises(TypeError, match="'x' must be a numeric"):
        t.stat(x=np.array(["a", "b"]))
    with pytest.raises(TypeError, match="'x' must be a number or a one-element"):
        t.scalar(x=np.ones(3))
    with pytest.raises(TypeError, match="'x' must be numeric"):
        t.scalar(x="1.0")
    with pytest.raises(ValueError, match="unknown reduce_type 'median' for 'x'"):
        t.stat(x=np.ones(2), reduce_type="median")
    with pytest.raises(ValueError, match=r"stats\.scalar\(\)"):
        t.stat(x=np.ones(2), reduce_type=ReduceType.SCALAR)
    t.scalar(y=1.0)
    with pytest.raises(ValueError, match="'y' was recorded as 'scalar' and now as 'sum'"):
        t.stat(y=np.ones(2), reduce_type="sum")
    with pytest.raises(TypeError, match="non-empty str"):
        t.scope("")


def test_traced_jax_values_are_rejected_with_a_hint() -> None:
    jax = need("jax", "needs jax")
    t = StatsTracker()

    @jax.jit
    def f(x: Any) -> Any:
        t.stat(x=x)
        return x

    with pytest.raises(TypeError, match="'x' is a traced JAX value"):
        f(jax.numpy.ones(2))
