"""The Grafana dashboard (configs/grafana/r2cc.json) without Grafana: every panel's queries run
against a Prometheus server, and the panels drawn with matplotlib from what came back.

    check(prom, start, end)          -> {panel title: [problem, ...]}: queries that fail or return nothing
    render(prom, start, end, path)   -> a PNG of every panel, legends from the panels' own formats
"""

from __future__ import annotations

import json
import os
import re

from r2cc_serve.errors import UserError

DASHBOARD = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))),
                         "configs", "grafana", "r2cc.json")


def panels(path: str = DASHBOARD) -> list[dict]:
    try:
        with open(path) as f:
            return json.load(f)["panels"]
    except (OSError, ValueError, KeyError) as exc:
        raise UserError(f"cannot read the dashboard {path}: {exc}") from None


def _legend(fmt: str, labels: dict) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt) or str(labels)


def series(prom, panel: dict, start: float, end: float) -> list[tuple[str, list[float], list[float]]]:
    """(legend, times relative to start, values) of every series every target of the panel returns."""
    out = []
    for target in panel["targets"]:
        for s in prom.query_range(target["expr"], start, end):
            ts = [float(t) - start for t, _ in s["values"]]
            vs = [float(v) for _, v in s["values"]]
            out.append((_legend(target.get("legendFormat", ""), s["metric"]), ts, vs))
    return out


def check(prom, start: float, end: float, path: str = DASHBOARD) -> dict[str, list[str]]:
    """Per panel, the problems of its queries: an error from Prometheus, or no series at all."""
    problems = {}
    for p in panels(path):
        mine = []
        for target in p["targets"]:
            try:
                if not prom.query_range(target["expr"], start, end):
                    mine.append(f"{target['expr']}: no series")
            except UserError as exc:
                mine.append(str(exc))
        problems[p["title"]] = mine
    return problems


def render(prom, start: float, end: float, out_png: str, path: str = DASHBOARD, marks: dict | None = None) -> str:
    """Draw every panel as a line chart in the dashboard's 2-column grid; marks: {label: time}
    drawn as vertical lines (e.g. when a fault was injected)."""
    try:
        import matplotlib
    except ImportError:
        raise UserError("the dashboard picture needs matplotlib: pip install matplotlib") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ps = panels(path)
    rows = (len(ps) + 1) // 2
    fig, axes = plt.subplots(rows, 2, figsize=(14, 3.1 * rows), squeeze=False)
    for ax, p in zip(axes.flat, ps):
        for legend, ts, vs in series(prom, p, start, end):
            ax.plot(ts, vs, label=legend, lw=1.2, drawstyle="steps-post" if p["type"] == "state-timeline" else "default")
        for label, t in (marks or {}).items():
            ax.axvline(t - start, color="grey", ls="--", lw=0.8)
            ax.annotate(label, xy=(t - start, 1), xycoords=("data", "axes fraction"), fontsize=7, va="top")
        unit = p["fieldConfig"]["defaults"].get("unit", "")
        ax.set_title(p["title"] + (f" [{unit}]" if unit not in ("", "none") else ""), fontsize=9)
        ax.tick_params(labelsize=7)
        if ax.lines:
            ax.legend(fontsize=6, loc="upper left", ncol=2)
    for ax in axes.flat[len(ps):]:
        ax.axis("off")
    for ax in axes[-1]:
        ax.set_xlabel("seconds", fontsize=8)
    fig.suptitle("r2cc rails dashboard (configs/grafana/r2cc.json), drawn from Prometheus", fontsize=11)
    fig.tight_layout()
    fig.savefig(out_png, dpi=90)
    plt.close(fig)
    return out_png
