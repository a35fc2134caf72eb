"""What operators and the health and control planes call on a communicator: rail actions,
fault injectors for tests, stats and state waits. Each is one call into the transport
(``self._t``); ``Communicator`` inherits them, so its file keeps the group and its collectives.
"""

from __future__ import annotations

from r2cc_serve.comm.errors import translate_errors
from r2cc_serve.errors import UserError


class RailOperations:
    """Needs ``_t`` (the transport), ``rank``, ``world_size``, ``rail_ips`` and ``rail_names``."""

    @property
    def num_rails(self) -> int:
        return len(self.rail_ips)

    def drain_rail(self, rail: int, force: bool = True) -> None:
        """No new chunks on `rail` (both directions, all peers); in-flight ones finish.
        force=False: raise LastRailError (changing nothing) when it is some peer's last healthy rail;
        the check and the action are one step, whatever else runs at the same time."""
        with translate_errors():
            self._t.drain_rail(self._check_rail(rail), force)

    def undrain_rail(self, rail: int) -> None:
        self._t.undrain_rail(self._check_rail(rail))

    def failover_rail(self, rail: int, force: bool = True) -> None:
        """Treat `rail` as failed now: its in-flight chunks move to the other rails; kept out until restore_rail.
        force=False: as for drain_rail."""
        with translate_errors():
            self._t.failover_rail(self._check_rail(rail), force)

    def restore_rail(self, rail: int) -> None:
        self._t.restore_rail(self._check_rail(rail))

    def inject_failure(self, peer: int, rail: int, after_chunks: int = 1) -> None:
        """Test fault injector: the connection to `peer` on `rail` fails right after `after_chunks`
        more data chunks were written on it, by its writer thread or by a calling thread (so
        un-acknowledged data is surely in flight)."""
        self._t.inject_failure(self._check_peer(peer), self._check_rail(rail), after_chunks)

    def inject_full_socket(self, peer: int, rail: int) -> None:
        """Test fault injector: the next chunk this rank's calling thread writes itself may go on
        `rail` to `peer` without checking the socket has room for all of it. A chunk larger
        than the socket takes (R2CC_CHUNK_BYTES) then fills it part-way, and the rail's writer
        thread must finish it."""
        self._t.inject_full_socket(self._check_peer(peer), self._check_rail(rail))

    def abort(self, reason: str) -> None:
        self._t.abort(reason)

    def rail_stats(self) -> list[dict]:
        """One dict per (peer, rail) connection of this rank: the core's fields (_C.ConnStats.FIELDS,
        csrc/stats.h), then the rail's address and interface."""
        out = []
        for s in self._t.stats():
            out.append(s.as_dict())
            out[-1]["address"] = self.rail_ips[s.rail]
            out[-1]["interface"] = self.rail_names[s.rail]
        return out

    def peer_stats(self) -> list[dict]:
        """One dict per peer: whether it is stalled (its process silent while its host still
        acknowledges: nothing is failed over for that), for how long, whether a path exists, and whether
        it closed its communicator (an orderly goodbye: its rails went down without a fault), and the
        chunk size its next bulk message gets (sized to its slowest rail, R2CC_CHUNK_BYTES)."""
        return [s.as_dict() for s in self._t.peer_stats()]

    def error_kind(self) -> str:
        """Kind of the group's error ("" while healthy): rails_down, peer_stalled, peer_gone,
        call_mismatch, timeout, closed or aborted."""
        kind = self._t.error_kind()
        return "" if kind == "none" else kind

    def counters(self) -> dict:
        """The transport's totals (_C.Counters.FIELDS): failovers, re-sent chunks, spins, hedges..."""
        return self._t.counters().as_dict()

    def error(self) -> str:
        return self._t.error()

    def state_signature(self) -> str:
        """Text that changes whenever the group's error, a peer's stall or goodbye, or a rail's shown
        state, hold reason or last error does; cheap, for the monitor's check between full samples."""
        return self._t.state_signature()

    def wait_state_change(self, seen: str, poll_s: float, timeout_s: float, watch_path: str = "",
                          watch_since_ns: int = 0) -> str:
        """Block (without the GIL) until state_signature() differs from `seen`, the file watch_path
        was modified at or after watch_since_ns, interrupt_state_wait() is called or timeout_s
        passes; the signature then. The transport's watchdog passes look every poll_s and wake
        this thread only when it has something to return."""
        return self._t.wait_state_change(seen, max(1, round(poll_s * 1000)), max(0, round(timeout_s * 1000)),
                                         watch_path, int(watch_since_ns))

    def interrupt_state_wait(self) -> None:
        self._t.interrupt_state_wait()

    def _check_rank(self, r: int) -> int:
        if not 0 <= r < self.world_size:
            raise UserError(f"rank {r} is outside the group of {self.world_size}")
        return r

    def _check_peer(self, r: int) -> int:
        if self._check_rank(r) == self.rank:
            raise UserError(f"rank {r} cannot send to or receive from itself")
        return r

    def _check_rail(self, rail: int) -> int:
        if not 0 <= rail < self.num_rails:
            raise UserError(f"no rail {rail}: this group has rails 0..{self.num_rails - 1}")
        return rail
