"""The run on a timeline, as RL people think of it: rank, task (the GRPO group), session, turn
and phase, with arrows from each task to its sessions and from each accepted session to the
train step that consumed it.

* :mod:`.arrows`: the arrows that cross files, planned in a first pass over the run's files;
* :mod:`.native`: Perfetto's native trace (``TracePacket``/``TrackEvent`` protobuf from the
  ``perfetto`` package's own protos; the ``perfetto`` extra), built from :mod:`.sessions` (a
  session's subtree), :mod:`.lanes` (nesting order) and :mod:`.packets` (the protobuf, streamed);
* :mod:`.chrome_tracks`: what Chrome JSON can show of the same (a named track per task and per
  session, flow events), added by ``rltrace convert`` to the merged JSON.

Nothing is imported here: the JSON side works without the ``perfetto`` extra.
"""
