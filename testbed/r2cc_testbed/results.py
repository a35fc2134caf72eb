"""Where a measuring command writes its results: `--out DIR`, one meaning for every command.

    add_out_argument(p, "serve-bench")        # --out DIR: writes DIR/serve-bench.json
    path = write_result(args.out, "serve-bench", result)

Each file carries how it was made (`run`: the command line, the date, the commit and which C++
core was measured), so a figure quoted from it can be traced and reproduced.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import shlex
import subprocess
import sys

from r2cc_serve.errors import UserError


def add_out_argument(p, command: str, what: str = "the full result as JSON") -> None:
    p.add_argument("--out", metavar="DIR", help=f"results folder: writes DIR/{command}.json ({what}, with the "
                                                "command line, date and commit)")


def check_out(out: str | None, command: str) -> None:
    """A one-line error now, not after the run, for --out given as a file."""
    if out and (out.endswith(".json") or os.path.isfile(out)):
        raise UserError(f"--out {out}: --out is a results folder (this command writes {command}.json in it); "
                        "give a folder, e.g. --out results/")


def write_result(out: str, command: str, result) -> str:
    check_out(out, command)
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, f"{command}.json")
    doc = {"run": run_info(), **(result if isinstance(result, dict) else {"results": result})}
    with open(path, "w") as f:
        json.dump(doc, f, indent=2, default=str)
    return path


def run_info() -> dict:
    """The command line, the date, and which build was measured."""
    return {"command": "r2cc " + shlex.join(sys.argv[1:]),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            **build_info()}


def build_info() -> dict:
    """Which r2cc core was measured: others rebuild it while benchmarks run."""
    from r2cc_testbed import PROJECT_ROOT
    info = {"git_head": None, "csrc_dirty": None, "core_sha256": None}
    try:
        from r2cc_serve import _C
        with open(_C.__file__, "rb") as f:
            info["core_sha256"] = hashlib.sha256(f.read()).hexdigest()[:16]
    except (ImportError, OSError):
        pass
    try:
        git = ["git", "-C", PROJECT_ROOT]
        info["git_head"] = subprocess.run(git + ["rev-parse", "--short", "HEAD"], capture_output=True,
                                          text=True, timeout=10).stdout.strip() or None
        dirty = subprocess.run(git + ["status", "--porcelain", "--", "csrc"], capture_output=True, text=True,
                               timeout=10).stdout.strip()
        info["csrc_dirty"] = bool(dirty) if info["git_head"] else None
    except (OSError, subprocess.SubprocessError):
        pass
    return info


def emit(args, command: str, doc) -> None:
    """--json FILE|- (the report alone) and --out DIR (DIR/<command>.json, with the run's origin)."""
    if getattr(args, "json", None):
        text = json.dumps(doc, indent=2, default=str)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w") as f:
                f.write(text + "\n")
    if getattr(args, "out", None):
        print(f"wrote {write_result(args.out, command, doc)}", file=sys.stderr)
