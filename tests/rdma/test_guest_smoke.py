"""The emulated RDMA guest boots with two rails and they carry RDMA: four rxe devices, ports
ACTIVE, the portable core imports, an RC pingpong over rail 0 passes. One boot."""

from __future__ import annotations

import re

import pytest

from r2cc_testbed import guest

pytestmark = [pytest.mark.rdma, pytest.mark.slow]

CHECKS = r"""
ibv_devices
for d in /sys/class/infiniband/*; do echo "port ${d##*/} $(cat $d/ports/1/state)"; done
python3 -c 'import r2cc_serve._C as c; print("core", c.__file__)'
python3 -m r2cc_testbed.guest.pingpong 0 -n 200
"""


def test_two_rails_have_four_active_devices_the_core_imports_and_rail0_pingpongs(guest_build, tmp_path):
    result = guest.run(CHECKS, rails=2, timeout_s=300, out_dir=str(tmp_path), build=guest_build, on_line=print)
    print(result.summary())
    assert result.ok, f"{result.summary()}\n{result.output[-3000:]}"
    out = result.output
    assert sorted(re.findall(r"^\s+(rxe_[ab]\d)\s", out, re.M)) == ["rxe_a0", "rxe_a1", "rxe_b0", "rxe_b1"]
    assert sorted(re.findall(r"^port (\S+) 4: ACTIVE$", out, re.M)) == ["rxe_a0", "rxe_a1", "rxe_b0", "rxe_b1"]
    assert re.search(r"^core .*_C\..*\.so$", out, re.M)
    assert "pingpong rail 0: server rc=0 client rc=0" in out
