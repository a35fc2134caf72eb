"""ibv_rc_pingpong over one rail, run inside the guest: the check that a rail moves RDMA traffic.

`python3 -m r2cc_testbed.guest.pingpong RAIL [-n ITERS]` exits 0 when both ends finished. The server
(rank 0's device) must listen before the client dials: under TCG a process takes a second or more
to start, so the client waits for the listening socket rather than for a fixed time.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass

from r2cc_testbed.guest import topology

BASE_PORT = 18515


@dataclass(frozen=True)
class Pingpong:
    server_rc: int | None  # None: still running at the deadline (killed)
    client_rc: int | None
    server_out: str
    client_out: str

    @property
    def ok(self) -> bool:
        return self.server_rc == 0 and self.client_rc == 0


def listening(pid: int, port: int) -> bool:
    """Whether pid's network namespace has a TCP socket listening on port (/proc/PID/net/tcp{,6})."""
    for name in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{name}") as f:
                next(f)
                for line in f:
                    local, state = line.split()[1], line.split()[3]
                    if state == "0A" and local.endswith(f":{port:04X}"):
                        return True
        except (OSError, StopIteration):
            pass
    return False


def run(rail: int, iters: int = 100, size: int = 4096, timeout_s: float = 60.0,
        environ=os.environ) -> Pingpong:
    """Server on rail's rank-0 device, client on its rank-1 device dialing rank 0's address."""
    ends = topology.parse_env(environ)[rail]
    gid, port = environ.get("R2CC_GUEST_GID_INDEX", "1"), BASE_PORT + rail
    common = ["-g", gid, "-p", str(port), "-n", str(iters), "-s", str(size)]
    deadline = time.monotonic() + timeout_s
    server = subprocess.Popen(["ibv_rc_pingpong", "-d", ends["a"]["device"], *common],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        while not listening(server.pid, port) and server.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        client = subprocess.run(["ibv_rc_pingpong", "-d", ends["b"]["device"], *common, ends["a"]["ip"]],
                                capture_output=True, text=True, timeout=max(1.0, deadline - time.monotonic()))
        client_rc, client_out = client.returncode, client.stdout + client.stderr
    except subprocess.TimeoutExpired as exc:
        client_rc, client_out = None, f"client: no end within {timeout_s:.0f} s ({exc.stdout or ''})"
    try:
        server_out, _ = server.communicate(timeout=max(1.0, deadline - time.monotonic()))
        server_rc = server.returncode
    except subprocess.TimeoutExpired:
        server.kill()
        server_out, server_rc = server.communicate()[0] + f"\nserver: no end within {timeout_s:.0f} s", None
    return Pingpong(server_rc, client_rc, server_out, client_out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("rail", type=int)
    p.add_argument("-n", "--iters", type=int, default=100)
    p.add_argument("--timeout", type=float, default=60.0)
    args = p.parse_args(argv)
    result = run(args.rail, iters=args.iters, timeout_s=args.timeout)
    print(f"pingpong rail {args.rail}: server rc={result.server_rc} client rc={result.client_rc}")
    print(result.client_out.strip())
    if not result.ok:
        print(result.server_out.strip())
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
