"""`python -m r2cc_serve.doctor ARGS` is `r2cc doctor ARGS` without loading r2cc's other
subcommands (numpy, the schedules, the test bed): it starts in a third of the time, which
counts on a node being checked and in `r2cc doctor --lab`, which starts one in every lab host."""

from __future__ import annotations

import argparse
import sys

from r2cc_serve.doctor.cli import register
from r2cc_serve.util import command


def main(argv: list[str] | None = None) -> int:
    command.unwind_on_sigterm()
    parser = argparse.ArgumentParser(prog="python -m r2cc_serve.doctor")
    register(parser.add_subparsers())
    return command.run(parser.parse_args(["doctor", *(sys.argv[1:] if argv is None else argv)]))


if __name__ == "__main__":
    sys.exit(main())
