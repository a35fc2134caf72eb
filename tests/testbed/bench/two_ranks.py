"""Two bench ranks started by hand, as two servers would start them."""

import subprocess


def run_two(commands: list[list[str]], cwd: str, env: dict, timeout: float) -> list[str]:
    """Runs both commands at once; asserts each exited 0 (its output in the message) and returns
    their standard outputs, rank 0's first."""
    procs = [subprocess.Popen(c, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for c in commands]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=timeout))
    finally:
        for p in procs:
            p.kill()
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, out + err
    return [out for out, _ in outs]
