"""RDMA rail names and `r2cc doctor --rdma`, over a made-up sysfs tree (no RDMA device needed).

The transport side (a verbs rail moving bytes, failing over) runs in the emulated guest:
tests/rdma/. Here: which spec is an RDMA rail, what address it resolves to, and the errors."""

from __future__ import annotations

import pytest

from r2cc_serve.comm import rdma_devices
from r2cc_serve.comm.rail_names import resolve_rail_kinds, transport_names
from r2cc_serve.doctor import rdma as doctor_rdma
from r2cc_serve.errors import UserError

ZERO = "0000:0000:0000:0000:0000:0000:0000:0000"


def _port(root, device, port, state, gids):
    base = root / device / "ports" / str(port)
    (base / "gids").mkdir(parents=True)
    (base / "gid_attrs" / "types").mkdir(parents=True)
    (base / "gid_attrs" / "ndevs").mkdir(parents=True)
    (base / "state").write_text(state + "\n")
    (base / "link_layer").write_text("Ethernet\n")
    for i, (gid, kind, ndev) in enumerate(gids + [(ZERO, "", "")]):
        (base / "gids" / str(i)).write_text(gid + "\n")
        (base / "gid_attrs" / "types" / str(i)).write_text(kind + "\n")
        (base / "gid_attrs" / "ndevs" / str(i)).write_text(ndev + "\n")


@pytest.fixture
def sysfs(tmp_path, monkeypatch):
    _port(tmp_path, "rxe0", 1, "4: ACTIVE", [("fe80:0000:0000:0000:0001:02ff:fe03:0405", "RoCE v2", "eth1"),
                                             ("0000:0000:0000:0000:0000:ffff:0a4d:0001", "RoCE v1", "eth1"),
                                             ("0000:0000:0000:0000:0000:ffff:0a4d:0001", "RoCE v2", "eth1")])
    _port(tmp_path, "rxe1", 1, "1: DOWN", [("0000:0000:0000:0000:0000:ffff:0a4d:0101", "RoCE v2", "eth2")])
    _port(tmp_path, "mlx5_0", 1, "4: ACTIVE", [("fe80:0000:0000:0000:0001:02ff:fe03:0406", "RoCE v2", "eth3")])
    monkeypatch.setattr(rdma_devices, "SYSFS", str(tmp_path))
    monkeypatch.setattr(rdma_devices, "port_attrs", lambda device, port: {})
    return tmp_path


def test_a_device_port_resolves_to_its_roce_v2_ipv4_address(sysfs):
    got = resolve_rail_kinds(["rxe0:1", "rdma:10.0.0.9", "127.0.0.1"], None)
    assert got == [("10.77.0.1", "rdma"), ("10.0.0.9", "rdma"), ("127.0.0.1", "tcp")]
    assert transport_names(got) == ["rdma:10.77.0.1", "rdma:10.0.0.9", "127.0.0.1"]


def test_a_port_without_an_ipv4_gid_is_refused_with_the_fix(sysfs):
    with pytest.raises(UserError, match=r"'mlx5_0:1'.*no RoCE v2 GID with an IPv4 address.*ip addr|IPv4 address"):
        resolve_rail_kinds(["mlx5_0:1"], None)


def test_an_unknown_device_port_names_the_ports_there_are(sysfs):
    with pytest.raises(UserError, match=r"'rxe9:1': no RDMA device port of that name "
                                        r"\(RDMA ports: mlx5_0:1, rxe0:1, rxe1:1\)"):
        resolve_rail_kinds(["rxe9:1"], None)


def test_the_same_address_twice_is_refused(sysfs):
    with pytest.raises(UserError, match="distinct"):
        resolve_rail_kinds(["rxe0:1", "rdma:10.77.0.1"], None)


def test_doctor_lists_ports_and_flags_a_down_rail(sysfs, capsys):
    rc = doctor_rdma.run(["rxe0:1", "rxe1:1", "mlx5_0:1", "eth0"], as_json=False)
    out = capsys.readouterr().out
    assert rc == 1
    assert "gid[2] RoCE v2  10.77.0.1       on eth1   <- rail address" in out, out
    assert "PROBLEM rail rxe1:1: port is DOWN" in out, out
    assert "PROBLEM rail mlx5_0:1: no RoCE v2 GID with an IPv4 address" in out, out
    assert "eth0" not in out.split("PROBLEM", 1)[1]  # TCP rails are not its business


def test_doctor_is_clean_for_healthy_rails_and_says_so_without_devices(sysfs, monkeypatch, capsys):
    assert doctor_rdma.run(["rxe0:1"], as_json=True) == 0
    monkeypatch.setattr(rdma_devices, "SYSFS", str(sysfs / "none"))
    assert doctor_rdma.run([], as_json=False) == 1
    assert "no RDMA device on this host" in capsys.readouterr().out


def test_a_verbs_rail_without_a_device_fails_the_group_with_what_to_check():
    # This host has no RDMA device (CI machines have none): the transport says so at once.
    import torch  # noqa: F401 - the communicator's tensors

    from r2cc_serve import _C
    from r2cc_serve.comm.errors import translate_errors
    from r2cc_serve.errors import R2CCError

    with pytest.raises(R2CCError, match=r"rail rdma:127\.0\.0\.1: .*(no RDMA device|cannot load libibverbs)"):
        with translate_errors():
            _C.Transport(0, 2, ["rdma:127.0.0.1"], "", b"k" * 16, 1, _C.TransportOptions())
