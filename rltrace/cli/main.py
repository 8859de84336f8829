"""The ``rltrace`` command: ``demo``, ``convert``, ``report``, ``top``, ``recover``."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from rltrace.version import __version__

#: events past which ``convert`` splits its output by step range: a file of 2 M events is about
#: 0.7 GB of JSON or 0.4 GB of native trace, which Perfetto's in-browser trace processor loads
#: in under a minute in about 3 GB (benchmarks/bench_convert.py)
DEFAULT_MAX_EVENTS = 2_000_000


def _cmd_convert(args: argparse.Namespace) -> int:
    from rltrace.cli.convert import ConvertError, convert

    if args.max_events < 0:
        print(f"rltrace convert: --max-events must be 0 (one file whatever the size) or a positive "
              f"number of events, got {args.max_events}", file=sys.stderr)
        return 2
    output = args.output if args.output is not None else default_output(args.inputs[0])
    try:
        res = convert(args.inputs, output, progress=args.progress, fmt=args.format,
                      max_events=args.max_events or None)
    except ConvertError as exc:
        print(exc, file=sys.stderr)
        return 2
    native = f", {res.sessions} session(s), {res.flows} arrow(s) to train steps" if res.sessions else ""
    print(f"wrote {res.output if len(res.parts) == 1 else f'{len(res.parts)} files'}: {res.events} events "
          f"from {len(res.files)} file(s), {res.processes} process(es){native}{res.summary()}")
    if len(res.parts) > 1:
        print(f"  the run is over --max-events {args.max_events}: split by step range (a slice is in "
              f"the file of its start; arrows between two files are not drawn):")
        for part in res.parts:
            w = part.window
            steps = (f"steps {w.first_step}-{'' if w.last_step is None else w.last_step}"
                     if w.first_step is not None else "a time range")
            print(f"  {part.path}: {steps}, {part.events} events")
    for msg in res.skipped:
        print(f"  {msg}")
    print("open it at https://ui.perfetto.dev (Open trace file); query it with SQL there: Query (SQL) "
          "in its left bar")
    return 0


def _cmd_diff(args: argparse.Namespace) -> int:
    try:
        from rltrace.analysis import ReportError, diff
    except ImportError as exc:  # the analysis extra is optional
        print(f"rltrace diff needs the analysis extra ({getattr(exc, 'name', None) or exc} missing): "
              f"pip install 'rltrace[analysis]'", file=sys.stderr)
        return 2
    run_b = args.run_b or args.run_a
    if args.run_b is None and (args.steps_a is None or args.steps_b is None):
        print("rltrace diff: give two runs (RUN_A RUN_B), or one run with --steps-a A:B and --steps-b C:D",
              file=sys.stderr)
        return 2
    if args.output is not None and not args.output.endswith((".html", ".json")):
        print(f"rltrace diff: -o {args.output}: write .html or .json", file=sys.stderr)
        return 2
    for flag, steps in (("--steps-a", args.steps_a), ("--steps-b", args.steps_b)):
        bad = steps_problem(steps, flag)
        if bad is not None:
            print(f"rltrace diff: {bad}", file=sys.stderr)
            return 2
    try:  # each side is labelled by its log dir (and step range)
        a = diff.side(args.run_a, args.steps_a, args.run_a)
        b = diff.side(run_b, args.steps_b, run_b)
    except (ReportError, ValueError) as exc:
        print(f"rltrace diff: {str(exc).removeprefix('rltrace report: ')}", file=sys.stderr)
        return 2
    result = diff.compare(a, b)
    print(diff.render_text(result))
    if args.output is not None:
        from pathlib import Path

        import orjson

        from rltrace.logdir.files import write_atomically

        out = Path(args.output)
        data = (diff.render_html(result).encode() if out.suffix == ".html"
                else orjson.dumps(result, option=orjson.OPT_INDENT_2))
        try:
            write_atomically(out, data)  # never through a link planted at its name
        except OSError as exc:
            print(f"rltrace diff: cannot write {out}: {exc.strerror or exc}", file=sys.stderr)
            return 2
        print(f"wrote {out}")
    return 0


def default_output(first_input: str) -> str:
    """Where ``convert`` writes without ``-o``: ``trace.json`` in a log dir given as the input,
    else ``<name>.merged.json`` beside the first input file (or glob's folder)."""
    from pathlib import Path

    p = Path(first_input)
    if p.is_dir():
        return str(p / "trace.json")
    parent = p.parent if p.exists() else Path(first_input.split("*")[0] or ".").parent
    return str(parent / f"{p.name.split('*')[0].split('.')[0] or 'trace'}.merged.json")


def _missing_rich(command: str) -> bool:
    """Say (one line) that ``command`` needs rich, the analysis extra, when it is missing."""
    try:
        import rich  # noqa: F401
    except ImportError:
        pass
    else:
        return False
    print(f"{command} needs rich, which comes with the analysis extra: "
          "pip install 'rltrace[analysis]' (the README's install, '.[dev]', has it)", file=sys.stderr)
    return True


def _cmd_demo(args: argparse.Namespace) -> int:
    from rltrace.cli.demo import DemoOptions, run_demo

    if args.live and _missing_rich("rltrace demo --live"):
        return 2

    opts = DemoOptions(
        fileroot=args.fileroot, experiment_name=args.experiment, trial_name=args.trial,
        ranks=args.ranks, steps=args.steps, tasks_per_step=args.tasks, samples=args.samples,
        seed=args.seed, otlp_endpoint=args.otlp_endpoint, otlp_protocol=args.otlp_protocol,
        live=args.live, time_scale=20.0 if args.live else 1.0,
    )
    return run_demo(opts)


def _cmd_top(args: argparse.Namespace) -> int:
    if _missing_rich("rltrace top"):
        return 2
    from rltrace.cli.top import run_top

    if args.interval <= 0:
        print(f"rltrace top: --interval must be > 0, got {args.interval:g}", file=sys.stderr)
        return 2
    from pathlib import Path

    if not Path(args.logdir).is_dir():
        print(f"rltrace top: {args.logdir} is not a folder; give a run's log dir "
              "{fileroot}/logs/{user}/{experiment}/{trial} (rltrace demo prints it; it exists once "
              "the run has called rltrace.configure) or a folder above it", file=sys.stderr)
        return 2
    return run_top(args.logdir, interval_s=args.interval, once=args.once)


def _cmd_report(args: argparse.Namespace) -> int:
    try:
        from rltrace import analysis
    except ImportError as exc:  # the analysis extra is optional
        msg = str(exc)
        if "rltrace[analysis]" not in msg:
            msg = (f"rltrace report needs the analysis extra ({getattr(exc, 'name', None) or exc} "
                   f"missing): pip install 'rltrace[analysis]'")
        print(msg, file=sys.stderr)
        return 2
    from rich.text import Text

    from rltrace.analysis.report import skipped_text
    from rltrace.cli.console import CliConsole

    bad = report_args_problem(args) or steps_problem(args.steps)
    if bad is not None:
        print(f"rltrace report: {bad}", file=sys.stderr)
        return 2
    try:
        opts = analysis.ReportOptions(
            steps=analysis.StepRange.parse(args.steps), k=args.k, top=args.top,
            step_scope=args.step_scope, rollout_scope=args.rollout_scope,
            train_prefix=args.train_prefix, progress=args.progress)
        rep, files = analysis.report(args.logdir, args.output, args.format, options=opts)
    except analysis.ReportError as exc:
        msg = str(exc)
        print(msg if msg.startswith("rltrace report") else f"rltrace report: {msg}", file=sys.stderr)
        return 2
    out = CliConsole(highlight=False, soft_wrap=True)
    inp = rep["inputs"]
    unread = skipped_text(inp)
    out.print(Text.assemble(("rltrace report", "bold"), f": {inp['sessions']} sessions, {len(inp['ranks'])} "
                            f"rank(s), {len(inp['steps'])} step(s), {inp['trace_events']} trace events",
                            (f", {unread}" if unread else "", "yellow")))
    width = max((len(f["kind"]) for f in rep["findings"]), default=0) + 1  # a space after the longest
    for f in rep["findings"]:
        style = "bold red" if f["kind"] in ("straggler", "phase") else "bold"
        out.print(Text.assemble(("  " + f["kind"].ljust(width), style), f["text"]))
    for msg in inp["skipped"]:
        out.print(Text(f"  {msg}", style="yellow"))
    plots = len(files) - 1
    out.print(Text(f"wrote {files[0]}" + (f" and {plots} plot(s) next to it" if plots else "")))
    return 0


def _cmd_recover(args: argparse.Namespace) -> int:
    """Restore what the rings hold; a summary of what was restored and what was skipped (one
    line each, never a traceback); exit 2 when a ring or entry could not be used."""
    from pathlib import Path

    from rltrace.sessions.flight import recover

    if not Path(args.logdir).is_dir():
        print(f"rltrace recover: {args.logdir} is not a folder; give a run's log dir "
              "{fileroot}/logs/{user}/{experiment}/{trial}", file=sys.stderr)
        return 2
    try:
        back = recover(Path(args.logdir), only_dead=not args.include_running)
    except Exception as exc:  # recover reports what it finds; this is a fault of its own
        print(f"rltrace recover: failed on {args.logdir}: {type(exc).__name__}: {exc}"[:500],
              file=sys.stderr)
        return 1
    for records, n in back.restored:
        print(f"restored {n} session(s) into {records} (marked \"recovered\": true)")
    for line in back.problem_lines():
        print(f"rltrace recover: {line}", file=sys.stderr)
    running = (f"; left {back.running} ring(s) of running processes (--include-running reads them)"
               if back.running and not args.include_running else "")
    if back.problems:
        aside = f", {len(back.damaged)} damaged ring(s) moved aside (*.ring.damaged)" if back.damaged else ""
        print(f"rltrace recover: restored {back.sessions} session(s) from {back.rings} ring(s); "
              f"{len(back.problems)} problem(s){aside}, {back.bad_entries} bad entr(ies) skipped"
              f"{running}", file=sys.stderr)
        return 2
    if not back.restored:
        what = (f"the {back.rings} ring(s) of killed processes hold no session their records "
                "files lack" if back.rings else
                "no flight recorder ring of a killed process is there")
        print(f"nothing to recover in {args.logdir}: {what}{running}")
    elif running:
        print(running[2:])
    return 0


def report_args_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with ``report``'s numeric options (one line naming the fix), or None."""
    if not args.k >= 0:
        return f"-k must be >= 0 (the outlier threshold: median + k * MAD), got {args.k:g}"
    if args.top < 1:
        return f"--top must be at least 1 (slowest sessions to list), got {args.top}"
    return None


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends ``(default: X)`` to an option's help only where the help does not say its default
    itself and there is one to show (not None, not False)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if "default" in text or action.default is None or action.default is False \
                or action.default == argparse.SUPPRESS:
            return text
        return super()._get_help_string(action)


def steps_problem(text: str | None, flag: str = "--steps") -> str | None:
    """What is wrong with a step range ``A:B`` given as ``flag`` (one line naming the fix), or
    None: it must parse, and hold at least one step (B > A)."""
    if text is None:
        return None
    t = text.strip()
    try:
        if ":" not in t:
            int(t)
            return None
        a, b = (int(x) if x.strip() else None for x in t.split(":", 1))
    except ValueError:
        return f"{flag} {text!r}: expected A:B (steps A..B-1), A:, :B or N"
    if a is not None and b is not None and b <= a:
        return (f"{flag} {text!r} is an empty range: A:B means steps A..B-1, so B must be greater "
                f"than A (e.g. {b}:{a + 1 if a >= b else a})")
    return None


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="rltrace", description="OpenTelemetry-native tracing for RL training")
    ap.add_argument("--version", action="version", version=f"rltrace {__version__}")
    sub = ap.add_subparsers(dest="command", required=True)

    c = sub.add_parser("convert", help="merge per-rank trace files into one Perfetto file",
                       formatter_class=HelpFormatter,
                       description="Merge the per-rank trace files of a run (its log dir, files or "
                                   "globs) into one file Perfetto opens: Chrome JSON (.json), or "
                                   "Perfetto's native trace (.pftrace) with task and session tracks, "
                                   "arrows from sessions to the train steps that used them, and "
                                   "counters.  Open it at https://ui.perfetto.dev.")
    c.add_argument("inputs", nargs="+", help="trace files, globs or log dirs")
    c.add_argument("-o", "--output", default=None,
                   help="output file: .json (Chrome JSON) or .pftrace (Perfetto's native protobuf: "
                        "task/session tracks, arrows, counters) (default: trace.json in a log dir "
                        "given first, else <name>.merged.json beside the first file)")
    c.add_argument("--format", choices=("json", "perfetto"), default=None,
                   help="output format (default: by the output's suffix, .pftrace is perfetto)")
    c.add_argument("--max-events", type=int, default=DEFAULT_MAX_EVENTS,
                   help="a run of more events is written as several files, one per range of "
                        "steps, each small enough for Perfetto to load (0: one file)")
    c.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="show a progress bar (default: when stderr is a terminal)")
    c.set_defaults(func=_cmd_convert)

    d = sub.add_parser("demo", help="trace a simulated asynchronous RL run (no GPU, no server)",
                       formatter_class=HelpFormatter,
                       description="Run a simulated asynchronous RL run on the CPU, one process per "
                                   "rank (multi-turn sessions with generate, toolcall, verify and "
                                   "reward phases, a train step, a weight sync), traced end to end: "
                                   "the log dir, a merged Perfetto trace, and a summary of where "
                                   "the time went.  Needs no GPU, no model, no server.")
    d.add_argument("--fileroot", default="./rltrace-demo", help="where logs/ is written")
    d.add_argument("--experiment", default="demo", help="experiment_name: a folder of the log dir")
    d.add_argument("--trial", default="trial0", help="trial_name: a folder of the log dir")
    d.add_argument("--ranks", type=int, default=2, help="rollout/trainer ranks, one process each")
    d.add_argument("--steps", type=int, default=4, help="training steps (rollout, train step, sync)")
    d.add_argument("--tasks", type=int, default=8, help="tasks (prompts) per step")
    d.add_argument("--samples", type=int, default=4, help="sessions (samples) per task")
    d.add_argument("--seed", type=int, default=0, help="random seed of the simulated durations")
    d.add_argument("--otlp-endpoint", default=None, help="also send spans to this OTLP endpoint "
                   "(http://host:4317 for gRPC, http://host:4318 for HTTP)")
    d.add_argument("--otlp-protocol", default=None, choices=["grpc", "http/protobuf", "http"],
                   help="OTLP protocol; http is http/protobuf (default: OTEL_EXPORTER_OTLP_PROTOCOL, "
                        "else grpc)")
    d.add_argument("--live", action="store_true",
                   help="show `rltrace top` on the run while its ranks work (needs rich; "
                        "simulated durations x20 so there is something to watch)")
    d.set_defaults(func=_cmd_demo)

    t = sub.add_parser("top", help="live view of a run in progress: steps, sessions in flight, long tail",
                       formatter_class=HelpFormatter,
                       description="Show a run in progress, across ranks: current step per rank, sessions "
                                   "in flight by phase and their age, the long tail forming, ranks "
                                   "falling behind, acceptance and failure rates.  Reads the live files "
                                   "ranks publish every live_interval_s (session tracing on).")
    t.add_argument("logdir", help="log dir {fileroot}/logs/{user}/{experiment}/{trial} (or a folder above)")
    t.add_argument("--interval", type=float, default=1.0, help="refresh every this many seconds")
    t.add_argument("--once", action="store_true", help="print one frame and exit")
    t.set_defaults(func=_cmd_top)

    v = sub.add_parser("recover", help="restore the sessions a killed run had finalized but not written",
                       formatter_class=HelpFormatter,
                       description="After SIGKILL or an OOM kill, append to each rank's session records "
                                   "the sessions its flight recorder kept that the file lacks, marked "
                                   "\"recovered\": true (the next rltrace.configure on the log dir does "
                                   "the same by itself).")
    v.add_argument("logdir",
                   help="log dir {fileroot}/logs/{user}/{experiment}/{trial} (searched recursively)")
    v.add_argument("--include-running", action="store_true",
                   help="also read the rings of processes still running (their files may lag)")
    v.set_defaults(func=_cmd_recover)

    r = sub.add_parser("report", help="analyse a run: long tail, stragglers, phases, turns, status, summary",
                       formatter_class=HelpFormatter,
                       description="Read every rank's session and trace files in LOGDIR (streaming) "
                                   "and write "
                                   "a report: HTML (one self-contained page, plots also as PNG files next "
                                   "to it), Markdown or JSON.  Needs: pip install 'rltrace[analysis]'.")
    r.add_argument("logdir",
                   help="log dir {fileroot}/logs/{user}/{experiment}/{trial} (searched recursively)")
    r.add_argument("-o", "--output", default=None,
                   help="output file (.html, .md, .json) or directory (default: LOGDIR/report/)")
    r.add_argument("--format", choices=["html", "md", "json"], default=None,
                   help="default: from the output file's suffix, else html")
    r.add_argument("--steps", default=None, metavar="A:B",
                   help="only steps A..B-1 (Python slice: A:B, A:, :B; or N for one step)")
    r.add_argument("-k", type=float, default=3.0, help="outlier threshold: median + k * MAD")
    r.add_argument("--top", type=int, default=10, help="slowest sessions to list")
    r.add_argument("--step-scope", default="train.step", help="scope name of a training step")
    r.add_argument("--rollout-scope", default="train.rollout",
                   help="scope name of a step's rollout (session times are measured from its start)")
    r.add_argument("--train-prefix", default="train.", help="train-side scopes in the phase breakdown")
    r.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="show a progress bar (default: when stderr is a terminal)")
    r.set_defaults(func=_cmd_report)

    df = sub.add_parser("diff", help="what changed between two runs (or two step ranges of one), "
                                     "beyond their own step-to-step noise",
                        formatter_class=HelpFormatter,
                        description="Compare step time and what it is made of (roles, goodput buckets, "
                                    "train scopes, session phases and waits, generate by turn) between "
                                    "two log dirs, or two step ranges of one; name only the differences "
                                    "beyond the runs' own step-to-step noise.  Needs the analysis extra.")
    df.add_argument("run_a", metavar="RUN_A", help="log dir of run A")
    df.add_argument("run_b", metavar="RUN_B", nargs="?", default=None,
                    help="log dir of run B (default: RUN_A, with --steps-a and --steps-b)")
    df.add_argument("--steps-a", default=None, metavar="A:B", help="only these steps of run A")
    df.add_argument("--steps-b", default=None, metavar="A:B", help="only these steps of run B")
    df.add_argument("-o", "--output", default=None, help="also write the diff as .html or .json")
    df.set_defaults(func=_cmd_diff)
    return ap


def parse_args(ap: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """``ap.parse_args``, but an unknown option after a command is reported by that command's
    parser (its usage, and the option it has that is closest), not by the top-level one."""
    args, extra = ap.parse_known_args(argv)
    if extra:
        import difflib

        sub = _subparsers(ap).get(getattr(args, "command", None) or "", ap)
        known = [o for a in sub._actions for o in a.option_strings]
        unknown = [e for e in extra if e.startswith("-")] or extra
        close = difflib.get_close_matches(unknown[0].split("=")[0], known, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        sub.error(f"unrecognized arguments: {' '.join(extra)}{hint}")
    return args


def _subparsers(ap: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in ap._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``rltrace`` console script."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = parse_args(build_parser(), argv)
    try:
        rc = int(args.func(args) or 0)
        sys.stdout.flush()  # what is still buffered meets a closed pipe here, not at exit
        return rc
    except BrokenPipeError:  # the reader went away (``rltrace report ... | head``): not an error
        import os

        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # Python's own flush at exit must not fail again
        return 0

