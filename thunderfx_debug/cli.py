"""`thunderfx-debug`: the command line. It reads dumps (never importing thunder, except `demo` and `bench`) and
reports user mistakes as one clear line on stderr with exit status 2, not as a traceback."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from thunderfx_debug.config import ConfigError
from thunderfx_debug.records import DumpError


class UsageError(Exception):
    """A mistake of the command's user: printed as one line, exit status 2."""


def _cmd_demo(args: argparse.Namespace) -> int:
    from thunderfx_debug.demo import run_demo

    run_demo(steps=args.steps, dump_dir=args.dir, device=args.device, progress=not args.no_progress)
    return 0


def _cmd_summary(args: argparse.Namespace) -> int:
    from thunderfx_debug.dump import load_report

    print(load_report(args.dir), end="")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="thunderfx-debug",
        description="Reports of ThunderFX training runs recorded by thunderfx_debug.ReportingBackend.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = commands.add_parser("demo", help="train a small GPT-style model under ReportingBackend and print the summary")
    demo.add_argument("--steps", type=_positive_int, default=30, help="training steps (default: 30)")
    demo.add_argument("--dir", default="thunderfx_debug_demo", help="dump directory (default: ./thunderfx_debug_demo)")
    demo.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda if available, else cpu")
    demo.add_argument("--no-progress", action="store_true", help="no progress bar")
    demo.set_defaults(run=_cmd_demo)

    summary = commands.add_parser("summary", help="print the summary of a dump")
    summary.add_argument("dir", help="a dump directory (THUNDERFX_DEBUG_DIR of a run) or one of its rank dirs")
    summary.set_defaults(run=_cmd_summary)
    return parser


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (UsageError, DumpError, ConfigError) as e:
        print(f"thunderfx-debug {args.command}: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
