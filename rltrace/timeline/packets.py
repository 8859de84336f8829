"""Writing Perfetto's own protobuf: ``TracePacket``s built with the ``perfetto`` package's message
classes, serialized by protobuf and streamed to a file in batches.

A Perfetto trace is a ``Trace`` message: a repeated ``packet`` field.  Concatenated ``Trace``
messages are one valid ``Trace``, so each packet is serialized as a one-packet ``Trace`` and the
serialized packets are written in batches of :data:`BATCH`: memory stays flat however large the
trace.  All packets are one writer sequence whose event names, categories and argument names are
interned (each string written once, in the packet that first uses it, then referred to by
number), as Perfetto's own SDK does: the file is about a third of what spelled-out strings take.
Names used once (a task's or a session's slice) are written in the event itself, so the
interning tables hold only names that repeat.

Track events are built in messages kept for the writer's life rather than one new message per
packet, which costs a fraction as much: a slice's end and a counter value, the commonest packets,
differ from the last of their kind only in their timestamp (and, now and then, their track) and
are changed in place; any other event's message is cleared and filled.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import BinaryIO

import orjson
from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import (
    DebugAnnotation,
    Trace,
    TracePacket,
    TrackDescriptor,
    TrackEvent,
)

#: packets per written batch
BATCH = 4096
#: one writer sequence for the whole file
SEQUENCE = 1
SLICE_BEGIN = TrackEvent.TYPE_SLICE_BEGIN
SLICE_END = TrackEvent.TYPE_SLICE_END
INSTANT = TrackEvent.TYPE_INSTANT
COUNTER = TrackEvent.TYPE_COUNTER
CHRONOLOGICAL = TrackDescriptor.CHRONOLOGICAL
_CLEARED = TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
_NEEDS_STATE = TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
#: the largest integer a debug annotation or a counter holds (int64)
_INT_MAX = (1 << 63) - 1
#: flow ids are ``fixed64``: a negative one as its two's complement
_U64 = (1 << 64) - 1


def _clean(s: str) -> str:
    """``s`` with each lone surrogate (which UTF-8 cannot hold) as the replacement character."""
    return s.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _one_event(kind: int) -> tuple[Trace, TracePacket, TrackEvent]:
    """A one-packet ``Trace`` holding a track event of ``kind``, to be changed in place and
    serialized for each packet of that kind."""
    trace = Trace()
    p = trace.packet.add(trusted_packet_sequence_id=SEQUENCE, sequence_flags=_NEEDS_STATE)
    te = p.track_event
    te.type = kind
    return trace, p, te


def _set_value(a: DebugAnnotation, value: object) -> None:
    """A debug annotation's value: strings, booleans, 64-bit integers and floats as such,
    anything else as its JSON (its repr when it has none)."""
    if type(value) is str:
        try:
            a.string_value = value
        except UnicodeEncodeError:
            a.string_value = _clean(value)
    elif type(value) is bool:
        a.bool_value = value
    elif type(value) is int and -_INT_MAX <= value <= _INT_MAX:
        a.int_value = value
    elif type(value) is float:
        a.double_value = value
    else:
        try:
            a.legacy_json_value = orjson.dumps(value, default=str).decode()
        except (TypeError, orjson.JSONEncodeError):
            a.string_value = repr(value)[:200]


class PacketWriter:
    """Streams ``TracePacket``s to ``fh`` in batches; counts the track events written."""

    def __init__(self, fh: BinaryIO) -> None:
        self.fh = fh
        #: serialized packets of the current batch (each a one-packet ``Trace``)
        self._batch: list[bytes] = []
        #: track events (slice begins/ends, instants, counter values) written
        self.events = 0
        self.bytes = 0
        self._names: dict[str, int] = {}
        self._categories: dict[str, int] = {}
        self._arg_names: dict[str, int] = {}
        #: a slice's end and an integer counter value, kept and changed in place (the
        #: commonest packets: only their timestamp and track change)
        self._end, self._end_packet, self._end_event = _one_event(SLICE_END)
        self._count, self._count_packet, self._count_event = _one_event(COUNTER)
        #: any other track event: cleared and filled for each (``_interned``: its packet holds
        #: interned strings, cleared with it)
        self._event, self._event_packet, self._event_event = _one_event(INSTANT)
        self._interned = False
        first = Trace()
        first.packet.add(trusted_packet_sequence_id=SEQUENCE, sequence_flags=_CLEARED)
        self._put(first)  # the interning tables start empty here

    @property
    def pending(self) -> int:
        """Packets of the current batch, not yet written."""
        return len(self._batch)

    def _put(self, trace: Trace) -> None:
        """A one-packet ``Trace`` into the batch (written once the batch is full)."""
        batch = self._batch
        batch.append(trace.SerializeToString())
        if len(batch) >= BATCH:
            self.flush()

    # -- track descriptors -------------------------------------------------------------------------
    def _descriptor(self, uuid: int) -> tuple[Trace, TrackDescriptor]:
        """A new packet's ``TrackDescriptor`` for ``uuid``, its children ordered by their first
        slice."""
        trace = Trace()
        td = trace.packet.add(trusted_packet_sequence_id=SEQUENCE).track_descriptor
        td.uuid = uuid
        td.child_ordering = CHRONOLOGICAL
        return trace, td

    def track(self, uuid: int, name: str | None = None, parent: int | None = None,
              counter: bool = False) -> None:
        """A ``TrackDescriptor`` for ``uuid`` named ``name`` under ``parent`` (a counter track
        with ``counter``)."""
        trace, td = self._descriptor(uuid)
        if name is not None:
            try:
                td.name = name
            except UnicodeEncodeError:
                td.name = _clean(name)
        if parent is not None:
            td.parent_uuid = parent
        if counter:
            td.counter.SetInParent()
        self._put(trace)

    def process_track(self, uuid: int, pid: int, name: str, order: int | None = None) -> None:
        """A process's ``TrackDescriptor``; ``order``: its place among its siblings (its rank)."""
        trace, td = self._descriptor(uuid)
        td.process.pid = pid
        td.process.process_name = _clean(name)
        if order is not None:
            td.sibling_order_rank = order
        self._put(trace)

    def thread_track(self, uuid: int, pid: int, tid: int, name: str) -> None:
        """A thread's ``TrackDescriptor``."""
        trace, td = self._descriptor(uuid)
        td.thread.pid = pid
        td.thread.tid = tid
        td.thread.thread_name = _clean(name)
        self._put(trace)

    # -- track events ------------------------------------------------------------------------------
    def end(self, ts: int, track: int) -> None:
        """A slice's end at ``ts`` on ``track``."""
        te = self._end_event
        if te.track_uuid != track:
            te.track_uuid = track
        self._end_packet.timestamp = ts
        self.events += 1
        batch = self._batch
        batch.append(self._end.SerializeToString())
        if len(batch) >= BATCH:
            self.flush()

    def event(self, ts: int, kind: int, track: int, name: str | None = None,
              category: str | None = None, args: Mapping[str, object] | None = None,
              skip: frozenset[str] = frozenset(), *, flows: Iterable[int] = (),
              ends: Iterable[int] = (), once: bool = False) -> None:
        """A ``TrackEvent`` at ``ts`` (ns) on ``track``: its ``args`` as debug annotations (see
        :meth:`annotate`; ``skip``: names left out), the arrows it starts (``flows``) and
        those it ends (``ends``).  ``once``: a name no other event uses, written in the event
        rather than interned."""
        trace, p, te = self._event, self._event_packet, self._event_event
        te.Clear()
        if self._interned:
            p.ClearField("interned_data")
            self._interned = False
        p.timestamp = ts
        te.type = kind
        te.track_uuid = track
        if name is not None:
            if once:
                try:
                    te.name = name
                except UnicodeEncodeError:
                    te.name = _clean(name)
            else:
                iid = self._names.get(name)
                if iid is None:
                    iid = self._names[name] = len(self._names) + 1
                    self._interned = True
                    p.interned_data.event_names.add(iid=iid, name=_clean(name))
                te.name_iid = iid
        if category:
            cid = self._categories.get(category)
            if cid is None:
                cid = self._categories[category] = len(self._categories) + 1
                self._interned = True
                p.interned_data.event_categories.add(iid=cid, name=_clean(category))
            te.category_iids.append(cid)
        if args:
            self.annotate(te, p, args, skip)
        if flows:
            te.flow_ids.extend([f & _U64 for f in flows])
        if ends:
            te.terminating_flow_ids.extend([f & _U64 for f in ends])
        self.events += 1
        self._put(trace)

    def annotate(self, te: TrackEvent, packet: TracePacket, args: Mapping[str, object],
                 skip: frozenset[str] = frozenset()) -> None:
        """The event's args as debug annotations (what Perfetto shows as the slice's arguments;
        it writes a name's dots as underscores): numbers, booleans and strings as such, anything
        else as its JSON; a None value is left out (Perfetto's importer cannot hold a JSON
        ``null``: it aborts).  ``skip``: names left out; names not seen before are interned in
        ``packet`` (the event's)."""
        add = te.debug_annotations.add
        names = self._arg_names
        for key, value in args.items():
            if value is None or key in skip:
                continue
            iid = names.get(key)
            if iid is None:
                iid = names[key] = len(names) + 1
                self._interned = True
                packet.interned_data.debug_annotation_names.add(iid=iid, name=_clean(str(key)))
            a = add()
            a.name_iid = iid
            if type(value) is int and -_INT_MAX <= value <= _INT_MAX:  # ids, counts: the commonest
                a.int_value = value
            elif type(value) is str and value.isascii():
                a.string_value = value
            else:
                _set_value(a, value)

    def counter(self, ts: int, track: int, value: float) -> None:
        """One counter value at ``ts``."""
        trace, p, te = self._count, self._count_packet, self._count_event
        if te.track_uuid != track:
            te.track_uuid = track
        p.timestamp = ts
        if type(value) is int and -_INT_MAX <= value <= _INT_MAX:
            te.counter_value = value
        else:
            te.double_counter_value = float(value)
        self.events += 1
        self._put(trace)

    def counters(self, track: int, samples: Iterable[tuple[int, int]]) -> None:
        """Integer counter values on one ``track``, as (ts, value) in time order (what
        :meth:`counter` writes for each)."""
        trace, p, te = self._count, self._count_packet, self._count_event
        te.track_uuid = track
        batch = self._batch
        for ts, value in samples:
            if not -_INT_MAX <= value <= _INT_MAX:
                self.counter(ts, track, value)
                continue
            p.timestamp = ts
            te.counter_value = value
            batch.append(trace.SerializeToString())
            self.events += 1
            if len(batch) >= BATCH:
                self.flush()
                batch = self._batch

    def flush(self) -> None:
        """Write the current batch."""
        if self._batch:
            data = b"".join(self._batch)
            self._batch = []
            self.fh.write(data)
            self.bytes += len(data)
