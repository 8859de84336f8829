"""Reading files other processes wrote, typed, in bounded memory, never raising on their data.

``rltrace report``, ``rltrace top`` and ``rltrace convert`` read files written by training
processes that may have crashed, been killed mid-line, run another version, or been edited by
hand.  Every record is checked here, in one place per record kind, before any reader uses it:

* :mod:`.lines`: lines of at most ``LINE_CAP`` bytes (a longer line is read in chunks and
  discarded, so memory never grows with it);
* :mod:`.fields`: typed checks of single values (numbers finite and in range, strings capped
  at ``MAX_TEXT`` characters with a ``…(+N chars)`` marker), raising :class:`~.fields.Bad`;
* :mod:`.session_record` (``sessions-r*.jsonl``), :mod:`.trace_event` (``traces-r*.jsonl``)
  and :mod:`.live_state` (``live-r*.json``): one check per record kind.  A record that cannot
  be used is refused with the reason; a malformed optional field is removed (or, for a list
  item, the item) and noted, and the rest of the record is kept.

Callers count both: records (lines) skipped and fields ignored, and show the counts.
"""

from __future__ import annotations

from rltrace.readers.fields import MAX_TEXT, Bad, cap_text
from rltrace.readers.lines import LINE_CAP, Oversize, iter_lines
from rltrace.readers.live_state import check_live_state
from rltrace.readers.session_record import check_session_record
from rltrace.readers.trace_event import check_trace_event

__all__ = ["LINE_CAP", "MAX_TEXT", "Bad", "Oversize", "cap_text", "check_live_state",
           "check_session_record", "check_trace_event", "iter_lines"]
