"""`python -m r2cc_serve.doctor ARGS` is `r2cc doctor ARGS` without loading r2cc's other
subcommands (numpy, the schedules, the test bed): it starts in a third of the time, which
counts on a node being checked and in `r2cc doctor --lab`, which starts one in every lab host."""

from __future__ import annotations

import argparse
import signal
import sys

from r2cc_serve.doctor.cli import register
from r2cc_serve.errors import UserError


def _interrupt(signum, frame):
    raise KeyboardInterrupt  # SIGTERM unwinds like Ctrl-C: a responder closes its sockets


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _interrupt)
    parser = argparse.ArgumentParser(prog="python -m r2cc_serve.doctor")
    register(parser.add_subparsers())
    args = parser.parse_args(["doctor", *(sys.argv[1:] if argv is None else argv)])
    try:
        return int(args.func(args) or 0)
    except UserError as exc:
        print(f"r2cc: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
