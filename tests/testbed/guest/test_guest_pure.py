"""The guest's pure parts: qemu's command line, the kernel package and image, the initramfs's
module order, the rails' names and env, the job files, the in-guest pytest's junit."""

from __future__ import annotations

import gzip
import lzma
import os
import shlex

import pytest

from r2cc_testbed.guest import apt, initramfs, job, kernel, pytest_job, qemu, topology


def test_qemu_runs_tcg_with_the_host_root_read_only_and_the_share_writable():
    argv = qemu.argv("/usr/bin/qemu-system-x86_64", "/c/vmlinux", "/c/initramfs.gz", "/tmp/out")
    text = " ".join(argv)
    for words in ("-accel tcg,thread=multi", "-cpu max", "-smp 2", "-m 4096", "-nographic", "-no-reboot",
                  "-nic none", "-kernel /c/vmlinux", "-initrd /c/initramfs.gz"):
        assert words in text
    shares = [argv[i + 1] for i, a in enumerate(argv) if a == "-virtfs"]
    assert shares[0].startswith("local,path=/,mount_tag=hostroot,") and "readonly=on" in shares[0]
    assert shares[1].startswith("local,path=/tmp/out,mount_tag=r2ccout,") and "readonly" not in shares[1]
    assert "console=ttyS0" in argv[argv.index("-append") + 1] and qemu.SHELL_FLAG not in text


def test_qemu_doubles_commas_in_the_share_path_and_marks_a_shell():
    argv = qemu.argv("q", "v", "i", "/tmp/a,b", shell=True)
    assert "local,path=/tmp/a,,b,mount_tag=r2ccout" in " ".join(argv)
    assert argv[-1].endswith(qemu.SHELL_FLAG)


def test_the_kernel_package_is_what_the_meta_package_depends_on():
    out = "linux-image-amd64\n  Depends: linux-image-6.1.0-56-amd64\n  Depends: other\n"
    assert apt.parse_kernel_depends(out) == "linux-image-6.1.0-56-amd64"
    assert apt.parse_kernel_depends("linux-image-amd64\n") is None
    assert kernel.version_of("linux-image-6.1.0-56-amd64") == "6.1.0-56-amd64"


@pytest.mark.parametrize("compress", [lzma.compress, gzip.compress])
def test_vmlinux_is_the_compressed_payload_of_the_bzimage(compress):
    elf = b"\x7fELF" + bytes(range(256)) * 40
    image = b"setup code" * 50 + compress(elf) + b"trailing"
    assert kernel.decompress_bzimage(image) == elf


def test_a_bzimage_without_a_payload_is_refused():
    with pytest.raises(apt.GuestError, match="no xz or gzip payload"):
        kernel.decompress_bzimage(b"nothing here")


def test_initramfs_modules_load_after_their_dependencies():
    dep = ("kernel/fs/9p/9p.ko: kernel/net/9p/9pnet.ko kernel/fs/fscache/fscache.ko kernel/fs/netfs/netfs.ko\n"
           "kernel/net/9p/9pnet_virtio.ko: kernel/net/9p/9pnet.ko kernel/drivers/virtio/virtio_ring.ko\n"
           "kernel/net/9p/9pnet.ko:\n"
           "kernel/drivers/virtio/virtio_pci.ko: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko\n"
           "kernel/fs/overlayfs/overlay.ko:\n")
    order = [os.path.basename(p) for p in initramfs.load_order(dep)]
    assert order == ["virtio_ring.ko", "virtio.ko", "virtio_pci.ko", "9pnet.ko", "9pnet_virtio.ko",
                     "netfs.ko", "fscache.ko", "9p.ko", "overlay.ko"]


def test_rails_are_named_and_addressed_per_end():
    r = topology.rails(3)[2]
    assert (r.netdev("a"), r.netdev("b"), r.device("a"), r.device("b")) == ("va2", "vb2", "rxe_a2", "rxe_b2")
    assert (r.ip("a"), r.ip("b")) == ("10.77.2.1", "10.77.2.2")
    with pytest.raises(ValueError):
        topology.rails(topology.MAX_RAILS + 1)


def test_the_rails_env_encodes_and_parses_back():
    env = topology.env(2)
    assert env == {"R2CC_GUEST_RAILS": "2",
                   "R2CC_GUEST_RAILS_A": "rxe_a0:1,rxe_a1:1", "R2CC_GUEST_RAILS_B": "rxe_b0:1,rxe_b1:1",
                   "R2CC_GUEST_IPS_A": "10.77.0.1,10.77.1.1", "R2CC_GUEST_IPS_B": "10.77.0.2,10.77.1.2",
                   "R2CC_GUEST_NETDEVS_A": "va0,va1", "R2CC_GUEST_NETDEVS_B": "vb0,vb1"}
    rails = topology.parse_env(env)
    assert rails[1]["b"] == {"device": "rxe_b1", "port": "1", "ip": "10.77.1.2", "netdev": "vb1"}
    assert topology.parse_env(topology.env(0)) == []


def test_each_end_routes_its_peer_over_its_own_veth_before_the_local_table():
    lines = topology.ip_batch(1)
    assert lines[:2] == ["rule add pref 200 lookup local", "rule del pref 0"]
    assert "route add 10.77.0.2/32 dev va0 table 100" in lines
    assert "rule add pref 100 from 10.77.0.1 iif lo lookup 100" in lines
    assert "route add 10.77.0.1/32 dev vb0 table 101" in lines
    assert topology.rdma_batch(1) == ["link add rxe_a0 type rxe netdev va0", "link add rxe_b0 type rxe netdev vb0"]
    assert topology.setup_script(0) == "true\n"
    assert "R2CC_GUEST_GID_INDEX" in topology.setup_script(1)


def test_a_command_is_a_shell_string_or_a_quoted_argv():
    assert job.command_text("a; b") == "a; b"
    assert job.command_text(["echo", "a b", "$X"]) == "echo 'a b' '$X'"
    assert shlex.split(job.env_file({"K": "a b'c"}).split("=", 1)[1]) == ["a b'c"]


def test_the_in_guest_pytest_writes_junit_to_the_share_without_the_host_s_addopts():
    argv = shlex.split(pytest_job.command(["tests/x.py"], ["-k", "y"]))
    assert argv[:3] == ["python3", "-m", "pytest"] and "addopts=-ra" in argv
    assert f"--junitxml={job.GUEST_OUT}/junit.xml" in argv and argv[-3:] == ["-k", "y", "tests/x.py"]


def test_junit_cases_carry_their_outcome():
    xml = """<testsuites><testsuite>
      <testcase classname="tests.m" name="test_ok" time="1"/>
      <testcase classname="tests.m" name="test_bad"><failure message="assert 1 == 2">tb</failure></testcase>
      <testcase classname="tests.m" name="test_skip"><skipped message="no rails"/></testcase>
      <testcase classname="tests.m" name="test_err"><error message="fixture">tb</error></testcase>
    </testsuite></testsuites>"""
    cases = pytest_job.parse_junit(xml)
    assert [(c.name, c.outcome) for c in cases] == [("tests.m.test_ok", "passed"), ("tests.m.test_bad", "failed"),
                                                     ("tests.m.test_skip", "skipped"), ("tests.m.test_err", "error")]
    assert cases[1].message == "assert 1 == 2"
