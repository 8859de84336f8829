"""The native trace's packets (:class:`rltrace.timeline.packets.PacketWriter`), read back with the
``perfetto`` package's message classes: each call's packet holds exactly the fields it should
(the writer keeps its commonest messages and changes them in place, so nothing of one packet may
leak into the next), with its arguments converted, its strings interned or not, as specified."""

from __future__ import annotations

import io
from typing import Any

import pytest
from conftest import need

from rltrace.timeline.packets import BATCH, INSTANT, SLICE_BEGIN, SLICE_END, PacketWriter

pb = need("perfetto.protos.perfetto.trace.perfetto_trace_pb2",
          "the native trace needs the perfetto package: pip install 'rltrace[perfetto]'")

TS = 1_795_800_003_713_515_123
TRACK = (1 << 64) - 5  # a uuid with the top bit set
SKIP = frozenset({"rank"})


def _parse(buf: io.BytesIO) -> list[Any]:
    return list(pb.Trace.FromString(buf.getvalue()).packet)


def _expected_first() -> Any:
    p = pb.TracePacket(trusted_packet_sequence_id=1)
    p.sequence_flags = pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED
    return p


def _event(ts: int, kind: int, track: int) -> Any:
    p = pb.TracePacket(timestamp=ts, trusted_packet_sequence_id=1)
    p.sequence_flags = pb.TracePacket.SEQ_NEEDS_INCREMENTAL_STATE
    p.track_event.type = kind
    p.track_event.track_uuid = track
    return p


@pytest.mark.parametrize("ts", [0, 5, (1 << 21) - 1, 1 << 21, TS, (1 << 63) - 1],
                         ids=["zero", "small", "below-2ms", "at-2ms", "now", "int64-max"])
def test_a_slice_end_reads_back_with_its_exact_timestamp_and_track(ts: int) -> None:
    buf = io.BytesIO()
    w = PacketWriter(buf)
    w.end(ts, TRACK)
    w.end(ts + 1, TRACK)  # the same track: only the timestamp changes
    w.end(ts + (1 << 22), 7)  # another track, another 2 ms
    w.flush()
    assert _parse(buf) == [_expected_first(), _event(ts, SLICE_END, TRACK),
                           _event(ts + 1, SLICE_END, TRACK), _event(ts + (1 << 22), SLICE_END, 7)]
    assert w.events == 3


def test_every_kind_of_argument_reads_back_as_the_message_classes_would_write_it() -> None:
    args: dict[str, object] = {
        "text": "accepted", "accented": "ckpt-é", "surrogate": "a\udc80b", "long": "x" * 300,
        "yes": True, "no": False, "small": 3, "big": 1 << 40, "negative": -7,
        "int64-min+1": -((1 << 63) - 1), "too-big": 1 << 63, "ratio": 0.25, "list": [2, 3],
        "nothing": None, "rank": 0,
    }
    buf = io.BytesIO()
    w = PacketWriter(buf)
    w.event(TS, SLICE_BEGIN, TRACK, "generate", "compute", args, SKIP, flows=[11, (1 << 64) - 1],
            ends=[12])
    w.event(TS + 5, INSTANT, TRACK, "generate", "compute", {"text": "accepted"})  # all interned
    w.event(TS + 6, SLICE_BEGIN, TRACK, "session 7 · accepted", "rl.session", once=True)
    w.flush()
    got = _parse(buf)

    first = _event(TS, SLICE_BEGIN, TRACK)
    te = first.track_event
    te.name_iid = 1
    te.category_iids.append(1)
    te.flow_ids.extend([11, (1 << 64) - 1])
    te.terminating_flow_ids.append(12)
    first.interned_data.event_names.add(iid=1, name="generate")
    first.interned_data.event_categories.add(iid=1, name="compute")
    values: list[tuple[str, str, object]] = [
        ("text", "string_value", "accepted"), ("accented", "string_value", "ckpt-é"),
        ("surrogate", "string_value", "a\ufffdb"), ("long", "string_value", "x" * 300),
        ("yes", "bool_value", True), ("no", "bool_value", False), ("small", "int_value", 3),
        ("big", "int_value", 1 << 40), ("negative", "int_value", -7),
        ("int64-min+1", "int_value", -((1 << 63) - 1)),
        ("too-big", "legacy_json_value", str(1 << 63)), ("ratio", "double_value", 0.25),
        ("list", "legacy_json_value", "[2,3]"),
    ]
    for iid, (name, field, value) in enumerate(values, 1):
        first.interned_data.debug_annotation_names.add(iid=iid, name=name)
        a = te.debug_annotations.add(name_iid=iid)
        setattr(a, field, value)

    second = _event(TS + 5, INSTANT, TRACK)
    second.track_event.name_iid = 1
    second.track_event.category_iids.append(1)
    second.track_event.debug_annotations.add(name_iid=1, string_value="accepted")

    third = _event(TS + 6, SLICE_BEGIN, TRACK)
    third.track_event.name = "session 7 · accepted"  # used once: not interned
    third.track_event.category_iids.append(2)
    third.interned_data.event_categories.add(iid=2, name="rl.session")

    assert got == [_expected_first(), first, second, third]


def test_track_descriptors_and_counters_read_back_as_the_message_classes_would_write_them() -> None:
    buf = io.BytesIO()
    w = PacketWriter(buf)
    w.process_track(100, 1, "[actor] Rank 3 · host", order=3)
    w.thread_track(101, 1, 1000, "thread 5")
    w.track(102, "task 4 · step 2", 100)
    w.track(103, "sessions in flight", 100, counter=True)
    w.counter(TS, 103, 5)
    w.counter(TS + 1, 103, -2)
    w.counter(TS + 2, 103, 2.5)
    w.counter(TS + 3, 103, 1 << 64)  # past int64: a double
    w.flush()

    def descriptor(uuid: int) -> Any:
        p = pb.TracePacket(trusted_packet_sequence_id=1)
        p.track_descriptor.uuid = uuid
        p.track_descriptor.child_ordering = pb.TrackDescriptor.CHRONOLOGICAL
        return p

    proc = descriptor(100)
    proc.track_descriptor.process.pid = 1
    proc.track_descriptor.process.process_name = "[actor] Rank 3 · host"
    proc.track_descriptor.sibling_order_rank = 3
    thread = descriptor(101)
    thread.track_descriptor.thread.pid = 1
    thread.track_descriptor.thread.tid = 1000
    thread.track_descriptor.thread.thread_name = "thread 5"
    task = descriptor(102)
    task.track_descriptor.name = "task 4 · step 2"
    task.track_descriptor.parent_uuid = 100
    counter = descriptor(103)
    counter.track_descriptor.name = "sessions in flight"
    counter.track_descriptor.parent_uuid = 100
    counter.track_descriptor.counter.SetInParent()
    samples = []
    for i, (field, value) in enumerate([("counter_value", 5), ("counter_value", -2),
                                        ("double_counter_value", 2.5),
                                        ("double_counter_value", float(1 << 64))]):
        p = _event(TS + i, pb.TrackEvent.TYPE_COUNTER, 103)
        setattr(p.track_event, field, value)
        samples.append(p)
    assert _parse(buf) == [_expected_first(), proc, thread, task, counter, *samples]
    assert w.events == 4


def test_a_run_of_counter_values_reads_back_as_the_same_values_written_one_by_one() -> None:
    samples = [(5, 1), (TS, 2), (TS + 1, -3), (TS + (1 << 22), 200), (TS + (1 << 23), 1 << 63),
               (TS + (1 << 23) + 1, 0)]
    one, bulk = io.BytesIO(), io.BytesIO()
    w1, w2 = PacketWriter(one), PacketWriter(bulk)
    for ts, value in samples:
        w1.counter(ts, TRACK, value)
    w2.counters(TRACK, samples)
    w1.flush()
    w2.flush()
    assert _parse(bulk) == _parse(one) and len(_parse(one)) == len(samples) + 1
    assert w2.events == w1.events == len(samples)


def test_packets_are_written_in_whole_batches_and_the_rest_on_flush() -> None:
    buf = io.BytesIO()
    w = PacketWriter(buf)
    for i in range(BATCH):  # with the first packet: one more than a batch
        w.end(TS + i, TRACK)
    written = buf.getvalue()
    assert len(pb.Trace.FromString(written).packet) == BATCH and w.pending == 1
    w.flush()
    assert len(_parse(buf)) == BATCH + 1 and w.pending == 0 and w.bytes == len(buf.getvalue())


def test_names_with_a_lone_surrogate_are_written_with_the_replacement_character() -> None:
    buf = io.BytesIO()
    w = PacketWriter(buf)
    w.thread_track(101, 1, 1000, "thread \udc80")
    w.track(102, "task \udc80", 100)
    w.event(TS, INSTANT, 102, "mark \udc80", "cat \udc80", {"key \udc80": 1})
    w.event(TS + 1, INSTANT, 102, "once \udc80", once=True)
    w.flush()
    thread, task, mark, once = _parse(buf)[1:]
    assert thread.track_descriptor.thread.thread_name == "thread \ufffd"
    assert task.track_descriptor.name == "task \ufffd"
    assert mark.interned_data.event_names[0].name == "mark \ufffd"
    assert mark.interned_data.event_categories[0].name == "cat \ufffd"
    assert mark.interned_data.debug_annotation_names[0].name == "key \ufffd"
    assert once.track_event.name == "once \ufffd" and not once.HasField("interned_data")
