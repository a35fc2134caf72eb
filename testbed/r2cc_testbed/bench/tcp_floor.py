"""The bench's `tcp-floor` backend: the plainest correct all_reduce over the same rails.

A ring (reduce-scatter, then all-gather) whose every step is striped over all rails, run by
one thread on non-blocking sockets: no acks, no chunk protocol, no failover, no second copy
of anything. It is not a library to serve with (one dead rail stalls it until its timeout);
it answers "what does moving and summing these bytes cost on this box at all?", so r2cc's and
Open MPI's CPU per byte can be read against a floor measured in the same run.

Each rank dials the next rank of the ring once per rail and accepts the previous rank's
connection on its own listener per rail; addresses go through the bench's store.
"""

from __future__ import annotations

import json
import selectors
import socket
import time

import numpy as np
import torch

STORE_KEY = "tcp-floor/addrs/{}"


class FloorError(RuntimeError):
    pass


class TcpRing:
    """Ring all_reduce of float32 tensors over one send and one receive socket per rail."""

    def __init__(self, rank: int, world: int, store, rail_ips: list[str], timeout_s: float):
        self.rank, self.world, self.timeout_s = rank, world, float(timeout_s)
        self.rails = len(rail_ips)
        self._tmp = np.empty(0, dtype=np.float32)
        self.send_socks: list[socket.socket] = []
        self.recv_socks: list[socket.socket] = []
        if world == 1:
            return
        listeners = []
        try:
            for ip in rail_ips:
                ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                ls.bind((ip, 0))
                ls.listen(4)
                listeners.append(ls)
            store.set(STORE_KEY.format(rank), json.dumps([ls.getsockname() for ls in listeners]))
            nxt = (rank + 1) % world
            # store.get waits for the key up to the store's own timeout
            peer = json.loads(store.get(STORE_KEY.format(nxt)))
            for k, (ip, port) in enumerate(peer):
                s = socket.create_connection((ip, port), timeout=self.timeout_s, source_address=(rail_ips[k], 0))
                self.send_socks.append(s)
            for k, ls in enumerate(listeners):
                ls.settimeout(self.timeout_s)
                try:
                    s, _ = ls.accept()
                except socket.timeout:
                    raise FloorError(f"tcp-floor rank {rank}: rank {(rank - 1) % world} did not connect on rail{k} "
                                     f"within {self.timeout_s:g} s") from None
                self.recv_socks.append(s)
        except BaseException:
            self.close()
            raise
        finally:
            for ls in listeners:
                ls.close()
        for s in self.send_socks + self.recv_socks:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.setblocking(False)
        self._sel = selectors.DefaultSelector()

    def all_reduce(self, t: torch.Tensor) -> None:
        """Sums t over the ranks in place (ring order: float results within a tolerance)."""
        n = self.world
        if n == 1:
            return
        a = t.numpy().reshape(-1)
        if self._tmp.size < a.size:
            self._tmp = np.empty(a.size, dtype=np.float32)
        bounds = [a.size * i // n for i in range(n + 1)]
        seg = lambda i: slice(bounds[i % n], bounds[i % n + 1])  # noqa: E731
        deadline = time.monotonic() + self.timeout_s
        r = self.rank
        for step in range(n - 1):  # reduce-scatter: after it, segment r+1 holds the full sum
            out, inn = seg(r - step), seg(r - step - 1)
            tmp = self._tmp[inn]
            acc = a[inn]
            self._exchange(a[out], tmp, deadline, lambda lo, hi, tmp=tmp, acc=acc: np.add(
                acc[lo:hi], tmp[lo:hi], out=acc[lo:hi]))
        for step in range(n - 1):  # all-gather: pass the summed segments on
            self._exchange(a[seg(r + 1 - step)], a[seg(r - step)], deadline, None)

    def _exchange(self, send: np.ndarray, recv: np.ndarray, deadline: float, on_piece) -> None:
        """Sends `send` to the next rank and receives `recv` from the previous one, rail k
        carrying the k-th share of the elements; on_piece(lo, hi) runs as each share lands."""
        R = self.rails
        sb, rb = send.view(np.uint8), recv.view(np.uint8)
        work = {}  # socket -> [memoryview of what is left, (lo, hi) elements or None]
        for k in range(R):
            lo, hi = send.size * k // R, send.size * (k + 1) // R
            if hi > lo:
                work[self.send_socks[k]] = [memoryview(sb[4 * lo:4 * hi]), None, k]
            lo, hi = recv.size * k // R, recv.size * (k + 1) // R
            if hi > lo:
                work[self.recv_socks[k]] = [memoryview(rb[4 * lo:4 * hi]), (lo, hi), k]
        sel = self._sel
        for s, w in list(work.items()):  # try at once: small shares need no select at all
            if self._progress(s, w, on_piece):
                del work[s]
            else:
                sel.register(s, selectors.EVENT_READ if w[1] else selectors.EVENT_WRITE, w)
        try:
            while work:
                left = deadline - time.monotonic()
                if left <= 0:
                    k = next(iter(work.values()))[2]
                    raise FloorError(f"tcp-floor rank {self.rank}: all_reduce did not finish within "
                                     f"{self.timeout_s:g} s (rail{k} stalled; the floor has no failover)")
                for key, _ in sel.select(min(left, 1.0)):
                    s, w = key.fileobj, key.data
                    if self._progress(s, w, on_piece):
                        sel.unregister(s)
                        del work[s]
        finally:
            for s in work:
                sel.unregister(s)

    def _progress(self, s: socket.socket, w: list, on_piece) -> bool:
        """Moves what the socket takes now; True when this share is complete."""
        mv, piece, k = w
        try:
            while len(mv):
                got = s.recv_into(mv) if piece else s.send(mv)
                if piece and got == 0:
                    raise FloorError(f"tcp-floor rank {self.rank}: rank {(self.rank - 1) % self.world} "
                                     f"closed rail{k}")
                mv = mv[got:]
        except BlockingIOError:
            w[0] = mv
            return False
        if piece and on_piece:
            on_piece(*piece)
        return True

    def close(self) -> None:
        for s in self.send_socks + self.recv_socks:
            s.close()
        self.send_socks, self.recv_socks = [], []
