"""The `costmodel` command.

Each subcommand lives in its own module under `costmodel/commands/` and exposes
`register(subparsers)`, which adds its parser and sets `func` to a
`run(args) -> int`. Command modules import only numpy/scipy at top level, so
`costmodel --help` works without torch; GPU work imports torch inside `run`.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import traceback

from costmodel import __version__

# Order is the order `costmodel --help` lists them in.
_COMMAND_MODULES = (
    "presets",
    "flops",
    "schedule",
    "simulate",
    "calibrate",
    "report",
    "validate",
    "correct",
    "bench_schedule",
    "train_demo",
)

# User mistakes and the machine's refusals (a full disk, a missing permission): one line on
# stderr, no traceback.
_USER_ERRORS = (ValueError, RuntimeError, OSError, KeyError)


def build_parser() -> argparse.ArgumentParser:
    return _parsers()[0]


def _parsers() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The `costmodel` parser and each subcommand's, by name."""
    parser = argparse.ArgumentParser(
        prog="costmodel",
        description=(
            "Measure GPU cost curves for variable-length transformer micro-batches and "
            "schedule micro-batches over data-parallel ranks by predicted time."
        ),
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    parser.add_argument("--version", action="version", version=f"costmodel {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(f"costmodel.commands.{name}")
        except ModuleNotFoundError as err:
            if err.name == f"costmodel.commands.{name}":
                continue  # command not built yet in this checkout
            raise
        module.register(subparsers)
    for sub in subparsers.choices.values():  # `costmodel schedule -v` as well as `costmodel -v schedule`
        sub.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                         help="log progress details; with an error (other than bad input), its traceback")
    # No abbreviations: `schedule --cost-model X` would be read as the switch
    # --cost-model-allow-other-shape, and X as a stray argument.
    parser.allow_abbrev = False
    for sub in subparsers.choices.values():
        sub.allow_abbrev = False
    return parser, dict(subparsers.choices)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser, commands = _parsers()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # argparse would show `costmodel`'s usage line; the command's names its flags
        commands.get(args.command or "", parser).error(
            f"unrecognized arguments: {' '.join(unknown)}")
    args.argv = argv  # recorded as provenance by commands that write files
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:  # `costmodel report ... | head`: the reader has what it wanted
        # Python's own flush of stdout at exit would fail again; send it nowhere.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except _USER_ERRORS as err:
        message = err.args[0] if isinstance(err, KeyError) and err.args else err
        if args.verbose and not isinstance(err, ValueError):
            # Anything but bad input (a RuntimeError may be torch's or CUDA's from deep in a
            # GPU path): with -v, where it came from (a GPU session gets one try).
            traceback.print_exc(file=sys.stderr)
        print(f"costmodel {args.command}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"costmodel {args.command}: interrupted", file=sys.stderr)
        return 130
