"""How the ranks of a group meet through a torch.distributed Store before they connect.

Keys under r2cc/<group>/: `secret` (rank 0: the group's handshake key) and `addr/<rank>` (each
rank: [ip, port] per rail). A rank that cannot join says so under its own keys (give_up), so the
others raise at once with its reason instead of waiting for the store's timeout.
"""

from __future__ import annotations

import contextlib
import json
import os

from r2cc_serve.errors import PeerGaveUpError, UserError

_GIVE_UP = "gave_up"  # addr/<rank> = {"gave_up": why}; the secret is then "00" * 32


def _as_str(v) -> str:
    return v.decode() if isinstance(v, (bytes, bytearray)) else str(v)


class Rendezvous:
    def __init__(self, store, group: str, rank: int, world_size: int):
        self.store, self.group, self.rank, self.world_size = store, group, rank, world_size
        self.prefix = f"r2cc/{group}/"

    def secret(self) -> bytes:
        """The group's secret: rank 0 makes it, the others wait for it."""
        key = self.prefix + "secret"
        if self.rank == 0:
            self.store.set(key, os.urandom(32).hex())
        return bytes.fromhex(_as_str(self.store.get(key)))

    def publish(self, addrs: list[tuple[str, int]]) -> None:
        self.store.set(self.prefix + f"addr/{self.rank}", json.dumps([[ip, port] for ip, port in addrs]))

    def peers(self, num_rails: int) -> list[list[tuple[str, int]]]:
        """Every rank's rail addresses, in rank order (waits for each). Raises PeerGaveUpError
        for a rank that could not join, UserError for one with another number of rails."""
        out = []
        for peer in range(self.world_size):
            entry = json.loads(_as_str(self.store.get(self.prefix + f"addr/{peer}")))
            if isinstance(entry, dict) and _GIVE_UP in entry:
                raise PeerGaveUpError(f"r2cc: rank {peer} could not join group {self.group!r}: {entry[_GIVE_UP]}. "
                                      f"Fix that rank (its log has the details) and start the group again.")
            if len(entry) != num_rails:
                raise UserError(f"rank {peer} has {len(entry)} rails but rank {self.rank} has {num_rails}; "
                                "give every rank the same number of rails")
            out.append([(ip, int(port)) for ip, port in entry])
        return out

    def give_up(self, why: str) -> None:
        """Best effort: tell the other ranks this one will not join, under whichever of its keys
        it has not written yet (they are read once)."""
        with contextlib.suppress(Exception):
            if self.rank == 0 and not self.store.check([self.prefix + "secret"]):
                self.store.set(self.prefix + "secret", "00" * 32)
            if not self.store.check([self.prefix + f"addr/{self.rank}"]):
                self.store.set(self.prefix + f"addr/{self.rank}", json.dumps({_GIVE_UP: why}))
