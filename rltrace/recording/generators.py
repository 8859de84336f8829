"""Driving a (async) generator so that each resumption runs inside a context.

A decorated generator function must not leave its span or stats scope open in the consumer's
code between ``next()`` calls; :func:`drive` / :func:`adrive` re-enter the given context around
every resumption and forward ``send``/``throw``/``close`` faithfully.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Generator
from contextlib import AbstractContextManager
from typing import TypeVar

__all__ = ["adrive", "drive"]

_Y = TypeVar("_Y")
_S = TypeVar("_S")
_R = TypeVar("_R")

Finish = Callable[[BaseException | None], None]
#: what each resumption runs inside (a span made current, a stats scope)
Around = Callable[[], AbstractContextManager[object]]


def drive(gen: Generator[_Y, _S, _R], around: Around,
          finish: Finish | None = None) -> Generator[_Y, _S, _R]:
    """Yield what ``gen`` yields, each resumption of ``gen`` inside ``around()``.

    ``finish(error)`` runs once when ``gen`` is done: exhausted or closed (``None``), or
    raising (the exception, which propagates).
    """
    value: _S | None = None
    pending: BaseException | None = None
    error: BaseException | None = None
    try:
        while True:
            with around():
                try:
                    if pending is not None:
                        exc, pending = pending, None
                        item = gen.throw(exc)
                    else:  # next(gen) is gen.send(None)
                        item = next(gen) if value is None else gen.send(value)
                except StopIteration as stop:
                    result: _R = stop.value  # what ``gen`` returned
                    return result
            try:
                value = yield item
            except GeneratorExit:
                gen.close()
                raise
            except BaseException as exc:
                pending = exc
    except GeneratorExit:
        raise
    except BaseException as exc:
        error = exc
        raise
    finally:
        if finish is not None:
            finish(error)


async def adrive(agen: AsyncGenerator[_Y, _S], around: Around,
                 finish: Finish | None = None) -> AsyncGenerator[_Y, _S]:
    """Async form of :func:`drive`."""
    value: _S | None = None
    pending: BaseException | None = None
    error: BaseException | None = None
    try:
        while True:
            with around():
                try:
                    if pending is not None:
                        exc, pending = pending, None
                        item = await agen.athrow(exc)
                    else:
                        # agen.__anext__() is agen.asend(None)
                        item = await (agen.__anext__() if value is None else agen.asend(value))
                except StopAsyncIteration:
                    return
            try:
                value = yield item
            except GeneratorExit:
                await agen.aclose()
                raise
            except BaseException as exc:
                pending = exc
    except GeneratorExit:
        raise
    except BaseException as exc:
        error = exc
        raise
    finally:
        if finish is not None:
            finish(error)
