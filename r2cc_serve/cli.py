"""`r2cc` command line: one entry point, each subcommand registered by its own module."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys

from r2cc_serve.util import command

# Each module exposes register(subparsers) and sets `func` on its parser; the function
# returns an exit code. The runtime's commands first, then the test bed's (a package of its own,
# r2cc-testbed, that a serving host need not install: its commands then say how to get it).
_SUBCOMMANDS = [
    "r2cc_serve.admin.cli",
    "r2cc_serve.knobs_cli",
    "r2cc_serve.sched.cli",
    "r2cc_serve.doctor.cli",
]
_TESTBED = "r2cc_testbed"
_TESTBED_SUBCOMMANDS = [
    "r2cc_testbed.lab.cli",
    "r2cc_testbed.bench.cli",
    "r2cc_testbed.model.cli",
    "r2cc_testbed.serving.cli",
    "r2cc_testbed.loadtest.cli",
    "r2cc_testbed.observe.run",
]
# What the test bed adds, for the help of an install without it.
_TESTBED_COMMANDS = {
    "lab": "network-namespace fault lab", "bench": "benchmark r2cc, gloo and Open MPI collectives",
    "model": "test models for serving", "demo": "vLLM TP=2 on two lab hosts; a rail dies mid-stream",
    "serve-bench": "decode tokens/s: r2cc vs vLLM's default backend", "serve-prefill": "long-prompt prefill",
    "serve-outage": "every rail of a host down", "loadtest": "load tests under scheduled faults",
    "observe": "Prometheus with r2cc's alert rules on a live deployment",
}
TESTBED_MISSING = ("r2cc {command}: part of r2cc's test bed (the r2cc-testbed package), which is not installed here. "
                   "A serving host does not need it; to measure or demo, install it from a checkout: "
                   "`pip install ./testbed` (scripts/setup.sh does).")


def version_text() -> str:
    """What `r2cc --version` prints: the package, its C++ core's wire protocol, and the vLLM it
    integrates with. Reads metadata only: imports neither torch nor vLLM."""
    from importlib import metadata

    import r2cc_serve
    from r2cc_serve import pins

    try:
        version = metadata.version("r2cc-serve")
    except metadata.PackageNotFoundError:  # run from a checkout that was never installed
        version = r2cc_serve.__version__
    try:
        from r2cc_serve import _C

        name = os.path.basename(_C.__file__)  # _C.<python ABI tag>.so
        core = f"wire protocol {_C.PROTOCOL_VERSION}, built for {name.split('.')[1] if name.count('.') == 2 else name}"
    except ImportError as exc:
        core = f"not built ({exc})"
    try:
        installed = f"installed: {metadata.version('vllm')}"
    except metadata.PackageNotFoundError:
        installed = "not installed"
    return (f"r2cc-serve {version}\n"
            f"C++ core: {core}\n"
            f"vLLM: integrates with {pins.VLLM_VERSION} ({installed})")


class _Version(argparse.Action):
    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, help="print the version of r2cc-serve, its C++ core "
                         "and the vLLM it integrates with, and exit")

    def __call__(self, parser, namespace, values, option_string=None):
        print(version_text())
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="r2cc", description="r2cc-serve: resilient multi-rail collectives")
    parser.add_argument("--version", action=_Version)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    have_testbed = importlib.util.find_spec(_TESTBED) is not None
    for modname in _SUBCOMMANDS + (_TESTBED_SUBCOMMANDS if have_testbed else []):
        try:
            mod = importlib.import_module(modname)
        except Exception as exc:  # a missing or broken optional part must not break the others
            print(f"r2cc: subcommands from {modname} unavailable: {exc}", file=sys.stderr)
            continue
        added = mod.register(sub)
        if modname == "r2cc_serve.admin.cli":
            _add_admin_tools(added)
        elif modname == "r2cc_serve.doctor.cli":
            _add_doctor_lab(added)
    if not have_testbed:
        for name, what in _TESTBED_COMMANDS.items():
            # No options of its own (an unused prefix character): whatever follows, the answer is the same.
            p = sub.add_parser(name, help=f"{what} (needs the test bed: pip install ./testbed)", add_help=False,
                               prefix_chars="\0")
            p.add_argument("args", nargs="*")
            p.set_defaults(func=_testbed_missing(name))
    return parser


def _testbed_missing(command: str):
    def run(args) -> int:
        print(TESTBED_MISSING.format(command=command), file=sys.stderr)
        return 2
    return run


def _add_admin_tools(tools) -> None:
    """`r2cc admin probe-latency` measures the admin API under a vLLM load: a test bed tool."""
    if importlib.util.find_spec(_TESTBED) is None:
        return
    try:
        admin_latency = importlib.import_module("r2cc_testbed.serving.admin_latency")
    except Exception as exc:  # noqa: BLE001 - as above: the rest of the CLI must still work
        print(f"r2cc: `r2cc admin probe-latency` unavailable: {exc}", file=sys.stderr)
        return
    admin_latency.register(tools)


def _add_doctor_lab(doctor) -> None:
    """`r2cc doctor --lab` runs the doctor in every lab host: a test bed tool, handed in from here
    so that the doctor itself never imports the lab."""
    if importlib.util.find_spec(_TESTBED) is None:
        return
    try:
        lab = importlib.import_module("r2cc_testbed.doctor_lab")
    except Exception as exc:  # noqa: BLE001 - as above: `r2cc doctor` must still work
        print(f"r2cc: `r2cc doctor --lab` unavailable: {exc}", file=sys.stderr)
        return
    doctor.set_defaults(lab_func=lab.run)


def main(argv: list[str] | None = None) -> int:
    command.unwind_on_sigterm()
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return command.run(args)


if __name__ == "__main__":
    sys.exit(main())
