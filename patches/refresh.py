"""Re-make a patch in this folder against the installed vLLM (after the pin in r2cc_serve/pins.py moves).

    python3 patches/refresh.py prepare NAME [--also vllm/x.py ...]   # scratch a/ (pristine), b/ (patched)
    ... edit DIR/b/ by hand until it says what NAME.patch said (fix any *.rej hunks) ...
    python3 patches/refresh.py write NAME                            # NAME.patch = its header + diff a/ b/

DIR is /tmp/r2cc-patches/NAME unless --dir is given. `prepare` copies every file the patch touches
(plus --also files) from the installed vLLM into DIR/a and DIR/b and applies the patch to DIR/b with
`git apply --reject`, so the hunks that still fit are in place and the others are left as *.rej files.
`write` keeps the patch's header (the text above its first `--- a/` line) and replaces the rest with
`diff -u` of DIR/a against DIR/b. Nothing here touches the installed vLLM.
tests/test_vllm_patches.py uses the same functions to check every patch.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

PATCHES = Path(__file__).resolve().parent
# Hunk headers name the enclosing def/class, as `git diff` does for Python.
FUNCTION_LINE = r"^ *\(class\|def\|async def\) "


def vllm_root() -> Path | None:
    """The directory holding the installed `vllm` package (site-packages), without importing vLLM."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]).parent


def split(text: str) -> tuple[str, str]:
    """(header, diff body) of a patch: the body starts at its first `--- ` line."""
    m = re.search(r"^--- ", text, flags=re.M)
    if m is None:
        raise ValueError("no `--- a/...` line: not a unified diff")
    return text[: m.start()], text[m.start():]


def touched_files(text: str) -> list[str]:
    """Paths (relative to site-packages) a patch changes, in order; a/ and b/ names must agree."""
    old = re.findall(r"^--- a/(\S+)", text, flags=re.M)
    new = re.findall(r"^\+\+\+ b/(\S+)", text, flags=re.M)
    if not old or old != new:
        raise ValueError(f"file headers must pair `--- a/X` with `+++ b/X`; got {old} and {new}")
    return old


def git_apply(patch: Path, cwd: Path, *extra: str) -> subprocess.CompletedProcess:
    """`git apply -v` in `cwd` as a plain directory: never the enclosing git repository, if any."""
    env = dict(os.environ, GIT_CEILING_DIRECTORIES=str(cwd.resolve().parent))
    return subprocess.run(["git", "apply", "-v", *extra, str(patch)], cwd=cwd, env=env,
                          capture_output=True, text=True)


def copy_pristine(files: list[str], root: Path, into: Path) -> None:
    for f in files:
        (into / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(root / f, into / f)


def render(header: str, a: Path, b: Path, files: list[str]) -> str:
    """The patch text: header, then `diff -u` of each file (a/ and b/ labels, no timestamps)."""
    out = [header]
    for f in files:
        run = subprocess.run(["diff", "-u", "-F", FUNCTION_LINE, "--label", f"a/{f}", "--label", f"b/{f}",
                              str(a / f), str(b / f)], capture_output=True, text=True)
        if run.returncode > 1:
            raise RuntimeError(f"diff {f}: {run.stderr.strip()}")
        out.append(run.stdout)
    return "".join(out)


def _scratch(name: str, given: str | None) -> Path:
    return Path(given) if given else Path("/tmp/r2cc-patches") / name


def prepare(name: str, also: list[str], dir_: str | None) -> int:
    root = vllm_root()
    if root is None:
        print("vLLM is not installed: run scripts/install_vllm.sh", file=sys.stderr)
        return 2
    patch = PATCHES / f"{name}.patch"
    files = touched_files(patch.read_text())
    files += [f for f in also if f not in files]
    scratch = _scratch(name, dir_)
    shutil.rmtree(scratch, ignore_errors=True)
    copy_pristine(files, root, scratch / "a")
    copy_pristine(files, root, scratch / "b")
    run = git_apply(patch, scratch / "b", "--reject")
    print(run.stdout + run.stderr, end="")
    rejects = sorted(str(p.relative_to(scratch)) for p in scratch.rglob("*.rej"))
    print(f"{scratch}/a: vLLM as installed; {scratch}/b: with {patch.name} applied"
          + (f"; hunks to redo by hand: {', '.join(rejects)} (delete each .rej when done)" if rejects else ""))
    return 0


def write(name: str, dir_: str | None) -> int:
    patch = PATCHES / f"{name}.patch"
    scratch = _scratch(name, dir_)
    if any(scratch.rglob("*.rej")):
        print(f"{scratch} still has *.rej files: redo those hunks in b/ and delete them first", file=sys.stderr)
        return 2
    header, body = split(patch.read_text())
    in_b = sorted(str(p.relative_to(scratch / "b")) for p in (scratch / "b").rglob("*") if p.is_file())
    files = [f for f in touched_files(body) if f in in_b] + [f for f in in_b if f not in touched_files(body)]
    patch.write_text(render(header, scratch / "a", scratch / "b", files))
    print(f"wrote {patch}; now run: python3 -m pytest -q tests/test_vllm_patches.py")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="scratch copies of the files NAME.patch touches, with it applied to b/")
    p.add_argument("name")
    p.add_argument("--also", nargs="*", default=[], help="more vLLM files (relative to site-packages) to include")
    p.add_argument("--dir")
    w = sub.add_parser("write", help="rewrite NAME.patch from the scratch a/ and b/")
    w.add_argument("name")
    w.add_argument("--dir")
    args = ap.parse_args(argv)
    return prepare(args.name, args.also, args.dir) if args.cmd == "prepare" else write(args.name, args.dir)


if __name__ == "__main__":
    sys.exit(main())
