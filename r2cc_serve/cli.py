"""`r2cc` command line: one entry point, each subcommand registered by its own module."""

from __future__ import annotations

import argparse
import importlib
import sys

from r2cc_serve.errors import UserError

# (subcommand module, attribute). Each module exposes register(subparsers) and sets
# `func` on its parser; the function returns an exit code.
_SUBCOMMANDS = [
    "r2cc_serve.lab.cli",
    "r2cc_serve.bench.cli",
    "r2cc_serve.model.cli",
    "r2cc_serve.admin.cli",
    "r2cc_serve.serving.cli",
    "r2cc_serve.knobs_cli",
    "r2cc_serve.sched.cli",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="r2cc", description="r2cc-serve: resilient multi-rail collectives")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for modname in _SUBCOMMANDS:
        try:
            mod = importlib.import_module(modname)
        except Exception as exc:  # a missing or broken optional part must not break the others
            print(f"r2cc: subcommands from {modname} unavailable: {exc}", file=sys.stderr)
            continue
        mod.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except UserError as exc:
        print(f"r2cc: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("r2cc: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `r2cc lab status | head`: the reader left, not an error
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
