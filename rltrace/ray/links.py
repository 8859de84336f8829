"""Ray results back into the consumer's span: ``ray.get`` links to the calls that produced them.

Ray's tracing makes each remote call a span of the caller's trace (``Rollout.rollout
ray.remote``), parent of the worker's span and of what the worker records under it.  When the
results are consumed under another trace (async RL: rollouts submitted under step N are
trained on in step N+1), :func:`rltrace.ray.init` makes ``ray.get`` (and what calls it:
``ActorPool``, ...) add a span link from the current span, the consumer, to the span of each
call whose result it returned (``rl.link.type`` = ``ray.get``).  Links within the consumer's
own trace are left out: that relation is already its tree.

Ray has no public hook for what a ``.remote()`` call returns: ``RemoteFunction._remote`` and
``ActorMethod._remote`` are wrapped (as Ray's own tracing wraps them) and ``ray.get`` is
replaced by a wrapper while the job runs; ``tests/integrations/ray/test_ray.py`` fails on a Ray release where
this stops working.  ``await ref`` in async code and a ``get`` imported before
:func:`~rltrace.ray.init` (``from ray import get``) add no links.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Protocol

from opentelemetry.context import Context
from opentelemetry.sdk.trace import SpanProcessor
from opentelemetry.trace import SpanContext, SpanKind

from rltrace import runtime
from rltrace.pipeline.readable_spans import bound
from rltrace.recording import recorder
from rltrace.sessions.recent import recent, remember
from rltrace.sessions.registry import RECENT_CAP

#: the links a consumer gets carry this type (beside ``consumed`` of ``link_consumed``)
LINK_TYPE = "ray.get"


class _Ref(Protocol):
    """A Ray object ref, as far as the links need one: its binary id."""

    def binary(self) -> bytes: ...


class _HasSpanContext(Protocol):
    def get_span_context(self) -> SpanContext: ...


class Submissions(SpanProcessor):
    """The span of each recent remote call, by the binary id of the refs it returned.

    A span processor of the process's provider: it sees Ray's span of a call being submitted
    (kind ``PRODUCER``) start on the submitting thread; the wrapped ``_remote`` reads it once
    the call returns its refs.  The most recent refs are kept, between ``RECENT_CAP / 2`` and
    ``RECENT_CAP`` of them (two generations; ids only: holding a ref would keep its object
    alive in the object store)."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._lock = threading.Lock()
        self._gens: list[dict[bytes, SpanContext]] = [{}, {}]

    def on_start(self, span: object, parent_context: Context | None = None) -> None:
        if getattr(span, "kind", None) is SpanKind.PRODUCER:
            self._local.span = span

    def submit(self, original: Callable[..., object], *args: object, **kwargs: object) -> object:
        """Call Ray's ``_remote`` and remember the span of the call for the refs it returns."""
        local = self._local
        local.span = None
        out = original(*args, **kwargs)
        span = local.span
        if span is not None:
            local.span = None
            try:
                self._note(out, span.get_span_context())
            except Exception as exc:  # never in the way of the call
                runtime.logger.debug("rltrace.ray: refs of a call not noted: %s", exc)
        return out

    def _note(self, out: object, sc: SpanContext) -> None:
        keys = [r.binary() for r in _refs(out)]
        if not keys or not sc.is_valid:
            return
        with self._lock:
            for key in keys:
                remember(self._gens, key, sc, RECENT_CAP // 2)

    def producer(self, ref: _Ref) -> SpanContext | None:
        """The span of the call that returned ``ref``, if it is among the recent ones."""
        return recent(self._gens, ref.binary())

    def link_consumer(self, object_refs: object) -> int:
        """Link the current span to the calls that produced ``object_refs`` (outside its own
        trace); returns how many links were added."""
        scope = recorder.current_scope()
        target = scope if scope is not None else recorder.current_span()
        if target is None or not target.is_recording():
            return 0
        own = target.get_span_context().trace_id
        links = scope.extras().setdefault("links", []) if scope is not None else []
        known = {_ids(t) for t, _ in links}
        room = _max_links() - len(links)  # beyond the span's link limit they would be cut
        found: list[SpanContext] = []
        for ref in _refs(object_refs):
            if len(found) >= room:
                break
            sc = self.producer(ref)
            if sc is not None and sc.trace_id != own and _ids(sc) not in known:
                known.add(_ids(sc))
                found.append(sc)
        if not found:
            return 0
        if scope is not None:
            links.extend((sc, {"rl.link.type": LINK_TYPE}) for sc in found)
        else:  # a span of another instrumentation (SDK span: links after start are allowed)
            for sc in found:
                target.add_link(sc, {"rl.link.type": LINK_TYPE})
        return len(found)


def _max_links() -> int:
    """The pipeline's link limit per span (``OTEL_SPAN_LINK_COUNT_LIMIT``, the SDK's 128)."""
    p = runtime.get_pipeline()
    return bound(p.builder.limits.max_links) if p is not None else 128


def _ids(target: SpanContext | _HasSpanContext) -> tuple[int, int]:
    sc = target if isinstance(target, SpanContext) else target.get_span_context()
    return sc.trace_id, sc.span_id


def _refs(value: object) -> list[_Ref]:
    """The object refs in what ``_remote`` returned or ``ray.get`` was given (a ref, or a
    list/tuple of refs; anything else has none)."""
    import ray

    if isinstance(value, ray.ObjectRef):
        return [value]
    if isinstance(value, (list, tuple)):
        return [r for r in value if isinstance(r, ray.ObjectRef)]
    return []


def install(submissions: Submissions) -> None:
    """Wrap Ray's ``_remote`` of remote functions and actor methods and replace ``ray.get``
    (once per process; :func:`uninstall` undoes it)."""
    import ray
    from ray.actor import ActorMethod
    from ray.remote_function import RemoteFunction

    for cls in (RemoteFunction, ActorMethod):
        original = cls._remote
        if getattr(original, "_rltrace_original", None) is not None:
            continue

        def _remote(*args: object, _original: Callable[..., object] = original,
                    **kwargs: object) -> object:
            return submissions.submit(_original, *args, **kwargs)

        functools.update_wrapper(_remote, original)
        _remote._rltrace_original = original  # type: ignore[attr-defined]
        cls._remote = _remote  # type: ignore[method-assign]

    get: Callable[..., object] = ray.get
    if getattr(get, "_rltrace_original", None) is None:
        from ray.exceptions import GetTimeoutError

        def link(object_refs: object) -> None:
            try:
                submissions.link_consumer(object_refs)
            except Exception as exc:
                runtime.logger.debug("rltrace.ray: ray.get not linked: %s", exc)

        @functools.wraps(get)
        def ray_get(object_refs: object, *args: object, **kwargs: object) -> object:
            try:
                result = get(object_refs, *args, **kwargs)
            except GetTimeoutError:  # nothing consumed
                raise
            except BaseException:  # a failed call's result is consumed too, as its error
                link(object_refs)
                raise
            link(object_refs)
            return result

        ray_get._rltrace_original = get  # type: ignore[attr-defined]
        setattr(ray, "get", ray_get)  # noqa: B010  (ray.get is overloaded; its replacement is not)


def uninstall() -> None:
    """Put Ray's ``_remote`` methods and ``ray.get`` back."""
    import ray
    from ray.actor import ActorMethod
    from ray.remote_function import RemoteFunction

    for owner, name in ((RemoteFunction, "_remote"), (ActorMethod, "_remote"), (ray, "get")):
        original = getattr(getattr(owner, name), "_rltrace_original", None)
        if original is not None:
            setattr(owner, name, original)
