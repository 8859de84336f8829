"""Driving a (async) generator so that each resumption runs inside a context.

A decorated generator function must not leave its span or stats scope open in the consumer's
code between ``next()`` calls; :func:`drive` / :func:`adrive` re-enter the given context around
every resumption and forward ``send``/``throw``/``close`` faithfully.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable, Generator
from contextlib import AbstractContextManager
from typing import Any

__all__ = ["adrive", "drive"]


Finish = Callable[[BaseException | None], None]


def drive(gen: Generator[Any, Any, Any], around: Callable[[], AbstractContextManager[Any]],
          finish: Finish | None = None) -> Generator[Any, Any, Any]:
    """Yield what ``gen`` yields, each resumption of ``gen`` inside ``around()``.

    ``finish(error)`` runs once when ``gen`` is done: exhausted or closed (``None``), or
    raising (the exception, which propagates).
    """
    value: Any = None
    pending: BaseException | None = None
    error: BaseException | None = None
    try:
        while True:
            with around():
                try:
                    if pending is not None:
                        exc, pending = pending, None
                        item = gen.throw(exc)
                    else:
                        item = gen.send(value)
                except StopIteration as stop:
                    return stop.value
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


async def adrive(agen: AsyncGenerator[Any, Any], around: Callable[[], AbstractContextManager[Any]],
                 finish: Finish | None = None) -> AsyncGenerator[Any, Any]:
    """Async form of :func:`drive`."""
    value: Any = None
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
                        item = await agen.asend(value)
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
