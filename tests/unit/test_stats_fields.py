"""The stats the core reports (csrc/stats.h: each field once), the stub (r2cc_serve/_C.pyi) and the
dicts the Communicator returns cannot drift apart (loopback only, no root)."""

import ast
import pathlib

import pytest

from r2cc_serve import _C
from tests.comm.harness import run_in_threads

STATS_CLASSES = ["ConnStats", "PeerStats", "Counters"]


def _stub_fields(name: str) -> list[str]:
    stub = ast.parse(pathlib.Path(_C.__file__).with_name("_C.pyi").read_text())
    cls = next(n for n in stub.body if isinstance(n, ast.ClassDef) and n.name == name)
    return [n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and n.target.id != "FIELDS"]


@pytest.mark.parametrize("name", STATS_CLASSES)
def test_stub_declares_the_core_fields_in_order(name):
    cls = getattr(_C, name)
    assert _stub_fields(name) == list(cls.FIELDS)
    assert all(hasattr(cls, field) for field in cls.FIELDS)  # a read-only attribute per field


@pytest.fixture(scope="module")
def pair():
    """Two ranks of one group, in threads of this process, on two loopback rails."""
    import torch
    from torch.distributed import HashStore

    from r2cc_serve import Communicator

    store, comms = HashStore(), {}

    def open_rank(rank):
        comms[rank] = Communicator(rank, 2, store, rails=["127.0.0.1", "127.0.0.2"], group="stats-fields")

    try:
        run_in_threads(open_rank)
        run_in_threads(lambda r: comms[r].all_reduce(torch.ones(1 << 16)))
        yield comms[0]
    finally:
        for c in comms.values():
            c.close()


def test_rail_stats_carry_the_stub_fields_then_address_and_interface(pair):
    rails = pair.rail_stats()
    assert len(rails) == 2
    for rail in rails:
        assert list(rail) == _stub_fields("ConnStats") + ["address", "interface"]
    assert sum(r["bytes_sent"] for r in rails) > 0  # real figures, not defaults


def test_peer_stats_and_counters_carry_the_stub_fields(pair):
    peers = pair.peer_stats()
    assert [list(p) for p in peers] == [_stub_fields("PeerStats")]
    assert list(pair.counters()) == _stub_fields("Counters")


def test_as_dict_matches_the_attributes(pair):
    raw = pair._t.stats()[0]
    assert raw.as_dict() == {field: getattr(raw, field) for field in _C.ConnStats.FIELDS}
    counters = pair._t.counters()
    assert counters.as_dict() == {field: getattr(counters, field) for field in _C.Counters.FIELDS}
