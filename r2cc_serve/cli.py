"""`r2cc` command line: one entry point, each subcommand registered by its own module."""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from r2cc_serve.util import command

# Each module exposes register(subparsers) and sets `func` on its parser; the function
# returns an exit code. The runtime's commands first, then the test bed's.
_SUBCOMMANDS = [
    "r2cc_serve.admin.cli",
    "r2cc_serve.knobs_cli",
    "r2cc_serve.sched.cli",
    "r2cc_serve.doctor.cli",
    "r2cc_serve.testbed.lab.cli",
    "r2cc_serve.testbed.bench.cli",
    "r2cc_serve.testbed.model.cli",
    "r2cc_serve.testbed.serving.cli",
    "r2cc_serve.testbed.loadtest.cli",
    "r2cc_serve.testbed.observe.run",
]


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
    for modname in _SUBCOMMANDS:
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
    return parser


def _add_admin_tools(tools) -> None:
    """`r2cc admin probe-latency` measures the admin API under a vLLM load: a test bed tool."""
    try:
        from r2cc_serve.testbed.serving import admin_latency
    except Exception as exc:  # noqa: BLE001 - as above: the rest of the CLI must still work
        print(f"r2cc: `r2cc admin probe-latency` unavailable: {exc}", file=sys.stderr)
        return
    admin_latency.register(tools)


def _add_doctor_lab(doctor) -> None:
    """`r2cc doctor --lab` runs the doctor in every lab host: a test bed tool, handed in from here
    so that the doctor itself never imports the lab."""
    try:
        from r2cc_serve.doctor import lab
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
