"""The ``rltrace`` command: ``demo``, ``convert``."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from .version import __version__


def _cmd_convert(args: argparse.Namespace) -> int:
    from .convert import ConvertError, convert

    try:
        res = convert(args.inputs, args.output, progress=args.progress)
    except ConvertError as exc:
        print(exc, file=sys.stderr)
        return 2
    print(f"wrote {res.output}: {res.events} events from {len(res.files)} file(s), "
          f"{res.processes} process(es)")
    for msg in res.skipped:
        print(f"  skipped {msg}")
    print(f"open it at https://ui.perfetto.dev (Open trace file) or check it with "
          f"perfetto_check.py {res.output}")
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import DemoOptions, run_demo

    opts = DemoOptions(
        fileroot=args.fileroot, experiment_name=args.experiment, trial_name=args.trial,
        ranks=args.ranks, steps=args.steps, tasks_per_step=args.tasks, samples=args.samples,
        seed=args.seed, otlp_endpoint=args.otlp_endpoint, otlp_protocol=args.otlp_protocol,
    )
    return run_demo(opts)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="rltrace", description="OpenTelemetry-native tracing for RL training")
    ap.add_argument("--version", action="version", version=f"rltrace {__version__}")
    sub = ap.add_subparsers(dest="command", required=True)

    c = sub.add_parser("convert", help="merge per-rank trace files into one Perfetto file")
    c.add_argument("inputs", nargs="+", help="trace files, globs or log dirs")
    c.add_argument("-o", "--output", required=True, help="output .json file")
    c.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="show a progress bar (default: when stderr is a terminal)")
    c.set_defaults(func=_cmd_convert)

    d = sub.add_parser("demo", help="trace a simulated asynchronous RL run (no GPU, no server)")
    d.add_argument("--fileroot", default="./rltrace-demo", help="where logs/ is written")
    d.add_argument("--experiment", default="demo")
    d.add_argument("--trial", default="trial0")
    d.add_argument("--ranks", type=int, default=2, help="rollout/trainer ranks, one process each")
    d.add_argument("--steps", type=int, default=4)
    d.add_argument("--tasks", type=int, default=8, help="tasks (prompts) per step")
    d.add_argument("--samples", type=int, default=4, help="sessions (samples) per task")
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--otlp-endpoint", default=None, help="also send spans to this OTLP endpoint")
    d.add_argument("--otlp-protocol", default=None, choices=["grpc", "http/protobuf"])
    d.set_defaults(func=_cmd_demo)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``rltrace`` console script."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
