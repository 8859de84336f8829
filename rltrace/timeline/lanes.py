"""Slices of one track written in nesting order although they arrive in end order.

rltrace's Chrome files hold each scope when it ended, so a parent follows its children.  Perfetto
orders a track's events by timestamp only, keeping the file's order for equal timestamps: a
parent written after a child that started in the same nanosecond would become the child's
child.  A :class:`Lane` therefore rebuilds the tree (events arrive in post-order: the roots
seen so far sit on a stack, and an event takes the trailing roots it contains as its children)
and writes a root's whole tree, parents first, once no later event can contain it: when the
file ends, or when more than :data:`MAX_ROOTS` roots wait (the oldest is written then, which
bounds memory; a parent that later arrives with the very same start as that root is then
drawn beside it instead of around it).
"""

from __future__ import annotations

from collections.abc import Callable

#: roots a lane holds before writing the oldest
MAX_ROOTS = 4096


class Node:
    """A slice (or an instant, ``end is None``) and its children."""

    __slots__ = ("args", "category", "children", "end", "flows_end", "name", "start")

    def __init__(self, start: int, end: int | None, name: str, category: str | None,
                 args: dict[str, object] | None, flows_end: list[int] | None = None) -> None:
        self.start = start
        self.end = end
        self.name = name
        self.category = category
        self.args = args
        self.children: list[Node] | None = None
        #: flow ids this event terminates (an instant that consumed sessions)
        self.flows_end = flows_end

    @property
    def stop(self) -> int:
        return self.start if self.end is None else self.end


Emit = Callable[[Node], None]


class Lane:
    """One track's pending roots (see the module docstring)."""

    __slots__ = ("emit", "roots")

    def __init__(self, emit: Emit) -> None:
        self.roots: list[Node] = []
        #: writes one root's tree (parents before children, children by start)
        self.emit = emit

    def add(self, node: Node) -> None:
        """Take ``node`` (arriving after every event that ended before it)."""
        roots = self.roots
        start, stop = node.start, node.stop
        if node.end is not None:
            taken = 0
            for child in reversed(roots):
                if child.start >= start and child.stop <= stop:
                    taken += 1
                else:
                    break
            if taken:
                node.children = roots[-taken:]
                del roots[-taken:]
        roots.append(node)
        if len(roots) > MAX_ROOTS:
            self.emit(roots.pop(0))

    def place(self, node: Node) -> None:
        """Add ``node`` inside the pending root that contains it (an instant the converter adds
        at a time of its choosing, not in end order), else as a root of its own."""
        for root in reversed(self.roots):
            if root.end is not None and root.start <= node.start and node.stop <= root.end:
                if root.children is None:
                    root.children = []
                root.children.append(node)
                return
        self.add(node)

    def close(self) -> None:
        """Write every pending root (the file ended)."""
        roots, self.roots = self.roots, []
        for root in roots:
            self.emit(root)


def preorder(node: Node, visit: Callable[[Node, bool], None]) -> None:
    """``visit(n, True)`` before ``n``'s children (sorted by start, longer first), ``visit(n,
    False)`` after them."""
    visit(node, True)
    kids = node.children
    if kids:
        if len(kids) > 1:
            kids.sort(key=lambda k: (k.start, -k.stop))
        for k in kids:
            preorder(k, visit)
    visit(node, False)
