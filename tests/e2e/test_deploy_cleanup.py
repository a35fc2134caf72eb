"""deploy.py cleans up on error, Ctrl-C and a node dying, shown with a fake `vllm` (seconds, not minutes).

The fake starts a child that ignores SIGTERM (like a stuck worker), writes a vllm_dist_* file
into /dev/shm and serves /health; the real thing is in the other e2e tests.
"""

from __future__ import annotations

import os
import socket
import stat

import pytest

from r2cc_testbed.serving.deploy import DeployError, single_instance
from r2cc_testbed.serving.procs import session_pids

NEEDS = "root"  # no vLLM: a fake one; root for the private /dev/shm mount

FAKE_VLLM = r'''#!/usr/bin/env python3
import http.server, os, subprocess, sys
port = int(sys.argv[sys.argv.index("--port") + 1])
print("distributed_init_method=file:///nowhere/vllm_dist_0f0f0f0f", flush=True)
open("/dev/shm/vllm_dist_0f0f0f0f-fake", "w").write("x")
subprocess.Popen([sys.executable, "-c",
                  "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
if os.environ.get("FAKE_VLLM_DIE"):
    print("fatal: fake engine could not start", flush=True)
    sys.exit(3)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers()
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
'''


class FakeLab:
    prefix, hosts, rails, mgmt_ifname = "r2ccfake", 2, 4, "mgmt0"

    def rail_ifname(self, k):
        return f"rail{k}"


@pytest.fixture
def fake_vllm(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    exe = bin_dir / "vllm"
    exe.write_text(FAKE_VLLM)
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return exe


def _assert_clean(dep):
    assert [session_pids(p.sid) for p in dep.procs] == [[]]
    assert not os.path.exists(dep.run_dir)
    assert not os.path.exists("/dev/shm/vllm_dist_0f0f0f0f-fake")  # it lived in the node's private tmpfs
    assert dep.dist_ids == {"0f0f0f0f"}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("exc", [RuntimeError, KeyboardInterrupt])
def test_everything_stopped_and_removed_on_error_or_ctrl_c(fake_vllm, tmp_path, exc):
    with pytest.raises(exc):
        with single_instance(FakeLab(), "/no/model", port=18391, warmup=False, log_dir=str(tmp_path / "logs"),
                             startup_timeout_s=60) as dep:
            assert len(session_pids(dep.procs[0].sid)) >= 2  # server + the SIGTERM-ignoring child
            raise exc()
    _assert_clean(dep)


@pytest.mark.timeout(120)
def test_a_dying_node_is_reported_with_its_log(fake_vllm, monkeypatch, tmp_path):
    monkeypatch.setenv("FAKE_VLLM_DIE", "1")
    with pytest.raises(DeployError, match="fatal: fake engine could not start") as info:
        with single_instance(FakeLab(), "/no/model", port=18392, warmup=False, startup_timeout_s=60,
                             log_dir=str(tmp_path / "logs")):
            pass
    assert "exited with code 3" in str(info.value)
    assert "vllm-node0.log" in str(info.value)  # says where the whole log is


@pytest.mark.timeout(60)
def test_a_taken_port_is_a_clear_error_not_someone_elses_server(fake_vllm, tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(DeployError, match=f"port {port} on 127.0.0.1 is taken"):
            with single_instance(FakeLab(), "/no/model", port=port, warmup=False, startup_timeout_s=30,
                                 log_dir=str(tmp_path / "logs")):
                pass
