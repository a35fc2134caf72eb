"""`r2cc knobs`: list every R2CC_* setting with its default and current value."""

from __future__ import annotations

import os

from r2cc_serve import envs


def _run(args) -> int:
    for knob in envs.all_knobs():
        cur = os.environ.get(knob.name)
        shown = f"{cur} (set)" if cur else f"{knob.default_value()}"
        print(f"{knob.name:32} {shown:24} {knob.help}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("knobs", help="list R2CC_* settings")
    p.set_defaults(func=_run)
