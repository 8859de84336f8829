"""The ``rltrace`` command: ``demo``, ``convert``, ``report``, ``top``, ``recover``."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from ..version import __version__

#: events past which ``convert`` splits its output by step range: a file of 2 M events is about
#: 0.7 GB of JSON or 0.4 GB of native trace, which Perfetto's in-browser trace processor loads
#: in under a minute in about 3 GB (benchmarks/bench_convert.py)
DEFAULT_MAX_EVENTS = 2_000_000


def _cmd_convert(args: argparse.Namespace) -> int:
    from .convert import ConvertError, convert

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
    print(f"open it at https://ui.perfetto.dev (Open trace file), or query it with SQL in "
          f"Perfetto's trace_processor: trace_processor {res.output}")
    return 0


def _cmd_diff(args: argparse.Namespace) -> int:
    try:
        from ..analysis import ReportError, diff
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
    try:
        a = diff.side(args.run_a, args.steps_a, "A")
        b = diff.side(run_b, args.steps_b, "B")
    except (ReportError, ValueError) as exc:
        print(f"rltrace diff: {exc}", file=sys.stderr)
        return 2
    result = diff.compare(a, b)
    print(diff.render_text(result))
    if args.output is not None:
        from pathlib import Path

        import orjson

        out = Path(args.output)
        data = (diff.render_html(result).encode() if out.suffix == ".html"
                else orjson.dumps(result, option=orjson.OPT_INDENT_2))
        try:
            out.write_bytes(data)
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
    from .demo import DemoOptions, run_demo

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
    from .top import run_top

    if args.interval <= 0:
        print(f"rltrace top: --interval must be > 0, got {args.interval:g}", file=sys.stderr)
        return 2
    from pathlib import Path

    if args.once and not Path(args.logdir).is_dir():  # (live, it waits for the run to start)
        print(f"rltrace top: {args.logdir} is not a folder; give a run's log dir "
              "{fileroot}/logs/{user}/{experiment}/{trial} (rltrace demo prints it) or a folder "
              "above it", file=sys.stderr)
        return 2
    return run_top(args.logdir, interval_s=args.interval, once=args.once)


def _cmd_report(args: argparse.Namespace) -> int:
    try:
        from .. import analysis
    except ImportError as exc:  # the analysis extra is optional
        msg = str(exc)
        if "rltrace[analysis]" not in msg:
            msg = (f"rltrace report needs the analysis extra ({getattr(exc, 'name', None) or exc} "
                   f"missing): pip install 'rltrace[analysis]'")
        print(msg, file=sys.stderr)
        return 2
    from rich.console import Console
    from rich.text import Text

    from ..analysis.report import skipped_text

    bad = report_args_problem(args)
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
        print(exc, file=sys.stderr)
        return 2
    out = Console(highlight=False, soft_wrap=True)
    inp = rep["inputs"]
    unread = skipped_text(inp)
    out.print(Text.assemble(("rltrace report", "bold"), f": {inp['sessions']} sessions, {len(inp['ranks'])} "
                            f"rank(s), {len(inp['steps'])} step(s), {inp['trace_events']} trace events",
                            (f", {unread}" if unread else "", "yellow")))
    for f in rep["findings"]:
        out.print(Text.assemble(("  " + f["kind"].ljust(10), "bold red" if f["kind"] in ("straggler", "phase")
                                 else "bold"), f["text"]))
    for msg in inp["skipped"]:
        out.print(Text(f"  {msg}", style="yellow"))
    plots = len(files) - 1
    out.print(Text(f"wrote {files[0]}" + (f" and {plots} plot(s) next to it" if plots else "")))
    return 0


def _cmd_recover(args: argparse.Namespace) -> int:
    from pathlib import Path

    from ..flight import recover

    if not Path(args.logdir).is_dir():
        print(f"rltrace recover: {args.logdir} is not a folder; give a run's log dir "
              "{fileroot}/logs/{user}/{experiment}/{trial}", file=sys.stderr)
        return 2
    back = recover(Path(args.logdir), only_dead=not args.include_running)
    for records, n in back:
        print(f"restored {n} session(s) into {records} (marked \"recovered\": true)")
    if not back:
        print(f"nothing to recover in {args.logdir}: no flight recorder ring of a killed process "
              "holds a session its records file lacks")
    return 0


def report_args_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with ``report``'s numeric options (one line naming the fix), or None."""
    if not args.k >= 0:
        return f"-k must be >= 0 (the outlier threshold: median + k * MAD), got {args.k:g}"
    if args.top < 1:
        return f"--top must be at least 1 (slowest sessions to list), got {args.top}"
    return None


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="rltrace", description="OpenTelemetry-native tracing for RL training")
    ap.add_argument("--version", action="version", version=f"rltrace {__version__}")
    sub = ap.add_subparsers(dest="command", required=True)

    c = sub.add_parser("convert", help="merge per-rank trace files into one Perfetto file",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
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
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
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
    d.add_argument("--otlp-protocol", default=None, choices=["grpc", "http/protobuf"],
                   help="OTLP protocol (unset: OTEL_EXPORTER_OTLP_PROTOCOL, else grpc)")
    d.add_argument("--live", action="store_true",
                   help="show `rltrace top` on the run while its ranks work (needs rich; "
                        "simulated durations x20 so there is something to watch)")
    d.set_defaults(func=_cmd_demo)

    t = sub.add_parser("top", help="live view of a run in progress: steps, sessions in flight, long tail",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter,
                       description="Show a run in progress, across ranks: current step per rank, sessions "
                                   "in flight by phase and their age, the long tail forming, ranks "
                                   "falling behind, acceptance and failure rates.  Reads the live files "
                                   "ranks publish every live_interval_s (session tracing on).")
    t.add_argument("logdir", help="log dir {fileroot}/logs/{user}/{experiment}/{trial} (or a folder above)")
    t.add_argument("--interval", type=float, default=1.0, help="refresh every this many seconds")
    t.add_argument("--once", action="store_true", help="print one frame and exit")
    t.set_defaults(func=_cmd_top)

    v = sub.add_parser("recover", help="restore the sessions a killed run had finalized but not written",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter,
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
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter,
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
                        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
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


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``rltrace`` console script."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:  # the reader went away (``rltrace report ... | head``): not an error
        import os

        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # Python's own flush at exit must not fail again
        return 0

