"""docs/deploy.md, run as written: two lab hosts stand in for two servers.

The blocks marked `<!-- deploy-test: NAME -->` in the doc are read from the file (never retyped
here). Each node runs one bash script: the doc's settings block with this lab's values put in
(every variable of that block must get one: a variable added to the doc without a value here
fails the test, naming it), then the doc's environment block and the node's start command,
verbatim. The node runs inside its lab host's network namespace with its own /dev/shm and an
environment of PATH, HOME and TMPDIR only: no R2CC_NETNS, nothing from the test bed's
deployment code. Then a rail of host 0 goes down for 4 s while 4 streams decode: no request
fails, the tokens equal the reference of vLLM's default backend, the admin API counts the
failover and shows the rail up again."""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time

import httpx
import pytest

from r2cc_testbed.serving.load import compare, run_load
from r2cc_testbed.serving.procs import PRIVATE_SHM, Proc, stop_all
from tests.comm.harness import free_port
from tests.e2e.conftest import LOAD, SERVE_ARGS

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOC = os.path.join(ROOT, "docs", "deploy.md")
BLOCK = re.compile(r"<!-- deploy-test: (\w+) -->\s*\n```bash\n(.*?)\n```", re.S)
SETTING = re.compile(r"^([A-Z_]+)=(\"[^\"]*\"|\S+)(\s+#.*)?$")
FAULT_RAIL = 1
STARTUP_TIMEOUT_S = 600.0


def doc_blocks(path: str = DOC) -> dict[str, str]:
    """The doc's marked bash blocks by name."""
    with open(path) as f:
        blocks = {name: body for name, body in BLOCK.findall(f.read())}
    missing = {"settings", "environment", "node0", "worker"} - set(blocks)
    assert not missing, f"{path} lost its marked blocks {sorted(missing)}"
    return blocks


def with_values(settings: str, values: dict[str, str]) -> str:
    """The settings block with each NAME=value line's value replaced by values[NAME]."""
    out, named = [], set()
    for line in settings.splitlines():
        m = SETTING.match(line)
        if m:
            name = m.group(1)
            assert name in values, f"docs/deploy.md sets {name}, which this test gives no lab value"
            named.add(name)
            line = f"{name}={shlex.quote(values[name])}{m.group(3) or ''}"
        out.append(line)
    assert named == set(values), f"values for settings the doc no longer has: {sorted(set(values) - named)}"
    return "\n".join(out) + "\n"


def test_settings_are_replaced_line_by_line():
    blocks = doc_blocks()
    names = [m.group(1) for line in blocks["settings"].splitlines() if (m := SETTING.match(line))]
    assert "NODE_RANK" in names and "RAILS" in names, names
    got = with_values(blocks["settings"], {n: f"v {n}" for n in names})
    assert f"RAILS='v RAILS'" in got and "# this node's rail NICs" in got, got
    with pytest.raises(AssertionError, match="gives no lab value"):
        with_values(blocks["settings"], {n: "x" for n in names[1:]})


def _node_values(lab, node: int, model_dir: str, port: int, token_file: str, deployment: str) -> dict[str, str]:
    return {
        "NODE_RANK": str(node), "NNODES": "2", "MASTER_ADDR": lab.mgmt_ip(0),
        "MGMT_IF": lab.mgmt_ifname, "MGMT_IP": lab.mgmt_ip(node),
        "RAILS": ",".join(lab.rail_ifname(k) for k in range(lab.rails)),
        "MODEL": model_dir, "MODEL_NAME": "tiny", "TP": "2",
        # The reference's flags (float32: batch-invariant greedy tokens; eager: no compile wait).
        "VLLM_ARGS": " ".join(SERVE_ARGS + ("--enforce-eager", "--seed", "0")),
        "API_PORT": str(port), "DEPLOYMENT": deployment, "ADMIN_TOKEN_FILE": token_file,
        # A 2-core box: 1 GiB of KV cache, one thread per worker, no pinning (docs/vllm.md).
        "KV_CACHE_GIB": "1", "THREADS_PER_WORKER": "1", "CPU_BIND": "nobind",
    }


def _bare_env(tmpdir: str) -> dict[str, str]:
    """What a login shell on a server has: a PATH to the installed tools, HOME, TMPDIR (each
    server's own /tmp); nothing of this test's environment."""
    bin_dir = os.path.dirname(shutil.which("vllm") or sys.executable)
    return {"PATH": f"{bin_dir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": os.environ.get("HOME", "/root"), "TMPDIR": tmpdir, "LANG": "C.UTF-8"}


def _installed_is_this_checkout(env) -> str | None:
    """Where `python -c 'import r2cc_serve'` resolves under the bare environment, if not here."""
    out = subprocess.run(["python3", "-c", "import r2cc_serve, os; print(os.path.dirname(r2cc_serve.__file__))"],
                         env=env, capture_output=True, text=True, timeout=60, cwd="/")
    where = out.stdout.strip()
    return None if where == os.path.join(ROOT, "r2cc_serve") else (where or out.stderr.strip()[-300:])


@pytest.fixture(scope="module")
def doc_deployment(lab, model_dir, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("deploy-doc")
    token = "doc-admin-" + os.urandom(8).hex()
    token_file = run_dir / "admin-token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    deployment = f"r2cc-doctest-{os.getpid()}"
    port = free_port()
    blocks = doc_blocks()
    env0 = _bare_env(str(run_dir))
    elsewhere = _installed_is_this_checkout(env0)
    if elsewhere:
        pytest.fail(f"the installed r2cc_serve is not this checkout's ({elsewhere}): run scripts/setup.sh here",
                    pytrace=False)
    procs = []
    t0 = time.monotonic()
    try:
        for node in (1, 0):  # the order does not matter (the doc says so): workers first
            values = _node_values(lab, node, model_dir, port, str(token_file), deployment)
            script = "\n".join([with_values(blocks["settings"], values), blocks["environment"],
                                blocks["node0" if node == 0 else "worker"]]) + "\n"
            path = run_dir / f"serve-node{node}.sh"
            path.write_text(script)
            tmp = run_dir / f"tmp{node}"
            tmp.mkdir()
            argv = ["ip", "netns", "exec", lab.host_ns(node)] + PRIVATE_SHM + ["bash", str(path)]
            procs.append(Proc(f"node{node}", argv, _bare_env(str(tmp)), str(run_dir / f"node{node}.log")))
        url = f"http://{lab.mgmt_ip(0)}:{port}"
        _wait_healthy(url, procs)
        first = run_load(url, "tiny", dataclasses.replace(LOAD, prompts=LOAD.prompts[:1], concurrency=1))
        assert not first.failed, first.summary()
        first_answer_s = time.monotonic() - t0
        print(f"deploy.md: first answer {first_answer_s:.0f} s after the first command")
        yield {"url": url, "token": token, "procs": procs, "first_answer_s": first_answer_s}
    finally:
        left = stop_all(procs)
        for d in (f"/run/r2cc/{deployment}", f"/var/lib/r2cc/{deployment}"):
            shutil.rmtree(d, ignore_errors=True)
        assert not left, f"still running after the deployment stopped: {left}"


def _wait_healthy(url: str, procs) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    with httpx.Client(timeout=3.0, trust_env=False) as client:
        while True:
            for p in procs:
                assert p.alive(), f"{p.name} exited ({p.returncode}) before serving:\n{p.tail(40)}"
            try:
                if client.get(url + "/health").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"{url} not healthy in {STARTUP_TIMEOUT_S:.0f} s:\n{procs[-1].tail(40)}"
            time.sleep(1.0)


def _rails(dep) -> list[dict]:
    r = httpx.get(dep["url"] + "/r2cc/v1/rails", headers={"Authorization": f"Bearer {dep['token']}"},
                  timeout=10, trust_env=False)
    assert r.status_code == 200, r.text
    return r.json()["rails"]


@pytest.mark.slow  # its own two-node deployment (~1 min): outside the default run, in CI (-m ci)
@pytest.mark.ci
def test_the_doc_serves_and_survives_a_rail_down_mid_stream(doc_deployment, lab, reference):
    dep = doc_deployment
    # Only the doc's commands ran: each node's rails are its own host's NICs, no netns knob.
    for p in dep["procs"]:
        with open(f"/proc/{p.pid}/environ", "rb") as f:
            names = {kv.split(b"=", 1)[0].decode() for kv in f.read().split(b"\0") if kv}
        assert "R2CC_NETNS" not in names and "R2CC_RAILS" in names, sorted(names)
    before = {(r["host"], r["rail"]): r["failovers"] for r in _rails(dep)}
    spec = dataclasses.replace(LOAD, duration_s=9)
    out = {}
    loader = threading.Thread(target=lambda: out.update(run=run_load(dep["url"], "tiny", spec)))
    loader.start()
    time.sleep(2)
    lab.fault(0, FAULT_RAIL, "down")
    try:
        time.sleep(4)
    finally:
        lab.fault(0, FAULT_RAIL, "up")
    loader.join(timeout=spec.deadline_s + 30)
    run = out["run"]
    assert not run.failed, run.summary()
    assert compare(reference, run) == []
    deadline = time.monotonic() + 60
    while True:
        rails = _rails(dep)
        states = {(r["host"], r["rail"]): r["state"] for r in rails}
        if all(s == "up" for s in states.values()) or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert all(s == "up" for s in states.values()), states
    failovers = {(r["host"], r["rail"]): r["failovers"] - before.get((r["host"], r["rail"]), 0) for r in rails}
    assert any(n > 0 for (host, rail), n in failovers.items() if rail == FAULT_RAIL), failovers
    print(f"deploy.md: rail {FAULT_RAIL} of host 0 down 4 s mid-stream: {run.summary()}")
