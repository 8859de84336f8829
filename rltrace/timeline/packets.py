"""Writing Perfetto's own protobuf: ``TracePacket``s from the ``perfetto`` package's protos,
streamed to a file in batches.

A Perfetto trace is a ``Trace`` message: a repeated ``packet`` field.  Concatenated ``Trace``
messages are one valid ``Trace``, so packets are written in batches of :data:`BATCH` and memory
stays flat however large the trace.  All packets are one writer sequence whose event names,
categories and argument names are interned (each string written once, in the packet that first
uses it, then referred to by number), as Perfetto's own SDK does: the file is about a third of
what spelled-out strings take.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, BinaryIO

import orjson
from perfetto.protos.perfetto.trace.perfetto_trace_pb2 import (
    Trace,
    TracePacket,
    TrackDescriptor,
    TrackEvent,
)

#: packets per serialized ``Trace`` batch
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
#: the largest integer a debug annotation holds (int64)
_INT_MAX = (1 << 63) - 1


class PacketWriter:
    """Streams ``TracePacket``s to ``fh`` in batches; counts the track events written."""

    def __init__(self, fh: BinaryIO) -> None:
        self.fh = fh
        self.trace = Trace()
        self.pending = 0
        #: track events (slice begins/ends, instants, counter values) written
        self.events = 0
        self.bytes = 0
        self._names: dict[str, int] = {}
        self._categories: dict[str, int] = {}
        self._arg_names: dict[str, int] = {}
        first = self.packet()
        first.sequence_flags = _CLEARED  # the interning tables start empty here

    def packet(self) -> TracePacket:
        """A new packet of the current batch (the previous batch is written first if full)."""
        if self.pending >= BATCH:
            self.flush()
        self.pending += 1
        p = self.trace.packet.add()
        p.trusted_packet_sequence_id = SEQUENCE
        return p

    def track(self, uuid: int, name: str | None = None, parent: int | None = None) -> TrackDescriptor:
        """A ``TrackDescriptor`` packet for ``uuid`` (the caller fills the kind: process, thread,
        counter), its children ordered by their first slice."""
        td = self.packet().track_descriptor
        td.uuid = uuid
        if parent is not None:
            td.parent_uuid = parent
        if name is not None:
            td.name = name
        td.child_ordering = CHRONOLOGICAL
        return td

    def event(self, ts: int, kind: int, track: int, name: str | None = None,
              category: str | None = None) -> TrackEvent:
        """A ``TrackEvent`` packet at ``ts`` (ns) on ``track``."""
        p = self.packet()
        p.timestamp = ts
        p.sequence_flags = _NEEDS_STATE
        te = p.track_event
        te.type = kind
        te.track_uuid = track
        if name is not None:
            iid = self._names.get(name)
            if iid is None:
                iid = self._names[name] = len(self._names) + 1
                p.interned_data.event_names.add(iid=iid, name=name)
            te.name_iid = iid
        if category:
            iid = self._categories.get(category)
            if iid is None:
                iid = self._categories[category] = len(self._categories) + 1
                p.interned_data.event_categories.add(iid=iid, name=category)
            te.category_iids.append(iid)
        self.events += 1
        return te

    def annotate(self, te: TrackEvent, args: Mapping[str, Any] | None,
                 skip: frozenset[str] = frozenset()) -> None:
        """The event's args as debug annotations (what Perfetto shows as the slice's arguments;
        it writes a name's dots as underscores): numbers, booleans and strings as such, anything
        else as its JSON; a None value is left out (Perfetto's importer cannot hold a JSON
        ``null``: it aborts).  ``skip``: names left out."""
        if not args:
            return
        add = te.debug_annotations.add
        names = self._arg_names
        interned = None
        for key, value in args.items():
            if key in skip or value is None:
                continue
            a = add()
            iid = names.get(key)
            if iid is None:
                iid = names[key] = len(names) + 1
                if interned is None:
                    # the packet that holds ``te`` (the last one added)
                    interned = self.trace.packet[-1].interned_data
                interned.debug_annotation_names.add(iid=iid, name=str(key))
            a.name_iid = iid
            t = type(value)
            if t is str:
                a.string_value = value
            elif t is bool:
                a.bool_value = value
            elif t is int and -_INT_MAX <= value <= _INT_MAX:
                a.int_value = value
            elif t is float:
                a.double_value = value
            else:
                try:
                    a.legacy_json_value = orjson.dumps(value, default=str).decode()
                except (TypeError, orjson.JSONEncodeError):
                    a.string_value = repr(value)[:200]

    def counter(self, ts: int, track: int, value: float) -> None:
        """One counter value at ``ts``."""
        te = self.event(ts, COUNTER, track)
        if type(value) is int and -_INT_MAX <= value <= _INT_MAX:
            te.counter_value = value
        else:
            te.double_counter_value = float(value)

    def flush(self) -> None:
        """Write the current batch."""
        if self.pending:
            data = self.trace.SerializeToString()
            self.fh.write(data)
            self.bytes += len(data)
            self.trace = Trace()
            self.pending = 0
