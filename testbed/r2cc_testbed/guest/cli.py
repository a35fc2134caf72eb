"""`r2cc lab guest build|run|shell`: the emulated RDMA guest from the shell.

Errors the user can fix (not root, no qemu, apt failing) are GuestError (a UserError): one line,
exit code 2. `run` exits with the command's own exit code, or 3 if the guest hung or crashed.
"""

from __future__ import annotations

import argparse
import sys

from r2cc_testbed.guest import topology

HUNG_EXIT = 3


def register(lab_subparsers) -> None:
    guest = lab_subparsers.add_parser(
        "guest", help="emulated RDMA guest (qemu, Soft-RoCE): build it, run a command in it",
        description="A qemu (TCG) VM booting Debian's 6.1 kernel with rdma_rxe, the host's root read-only, "
                    "rails as rxe devices on veth pairs. Slow (emulated): for function and failover, never speed.")
    sub = guest.add_subparsers(dest="guest_command", metavar="GUEST_COMMAND")
    guest.set_defaults(func=lambda _args: (guest.print_help(), 2)[1])

    b = sub.add_parser("build", help="install, download and build what the guest needs (cached; a no-op when done)")
    b.add_argument("--checkout", help="checkout whose csrc/ the guest's core is built from (default: this one)")
    b.set_defaults(func=_build)

    r = sub.add_parser("run", help="boot, run CMD in the checkout, power off; exits with CMD's exit code",
                       description="Runs CMD (after --; its words joined by spaces and run by bash, as ssh does) "
                                   "in the checkout with PYTHONPATH=checkout:checkout/testbed and the rails' map in "
                                   "R2CC_GUEST_* (e.g. R2CC_GUEST_RAILS_A=rxe_a0:1,...). Files CMD writes to "
                                   "$R2CC_GUEST_OUT land in --out on the host.")
    _common(r)
    r.add_argument("--timeout", type=float, default=600.0, help="seconds CMD may run (default 600)")
    r.add_argument("--out", help="host directory for $R2CC_GUEST_OUT (default: a new temporary one)")
    r.add_argument("--quiet", action="store_true", help="print CMD's output at the end, not the live console")
    r.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD...")
    r.set_defaults(func=_run)

    s = sub.add_parser("shell", help="an interactive shell in the guest (Ctrl-D powers off; Ctrl-A x kills qemu)")
    _common(s)
    s.set_defaults(func=_shell)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rails", type=int, default=2, help=f"rails (veth pairs with an rxe device on each end), "
                                                        f"0..{topology.MAX_RAILS} (default 2)")
    p.add_argument("--checkout", help="checkout to run in (default: the one r2cc_serve imports from)")


def _check_rails(n: int) -> None:
    from r2cc_serve.errors import UserError

    if not 0 <= n <= topology.MAX_RAILS:
        raise UserError(f"--rails {n}: use 0..{topology.MAX_RAILS}")


def _build(args) -> int:
    from r2cc_testbed.guest import build

    b = build(args.checkout)
    print(f"guest ready: kernel {b.kernel.version} ({b.kernel.vmlinux})\n  initramfs {b.initramfs}\n"
          f"  core {b.core_so} (from {b.checkout}/csrc)")
    return 0


def _run(args) -> int:
    from r2cc_serve.errors import UserError
    from r2cc_testbed.guest import run

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise UserError("r2cc lab guest run: give a command after --, e.g. r2cc lab guest run -- ibv_devices")
    _check_rails(args.rails)  # before any build
    live = None if args.quiet else (lambda line: print(line, flush=True))
    result = run(" ".join(command), rails=args.rails, timeout_s=args.timeout, out_dir=args.out, on_line=live,
                 checkout=args.checkout)
    if args.quiet:
        sys.stdout.write(result.output)
    print(f"{result.summary()}; outputs in {result.out_dir}", file=sys.stderr)
    return result.rc if result.rc is not None and result.problem is None else HUNG_EXIT


def _shell(args) -> int:
    from r2cc_testbed.guest import shell

    _check_rails(args.rails)
    return shell(args.rails, checkout=args.checkout)
