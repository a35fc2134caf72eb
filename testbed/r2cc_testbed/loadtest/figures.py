"""PNG figures of one scenario (matplotlib, headless). Fault windows are shaded at the times the
faults really took effect (the fault daemon's records), labelled with what happened.

    tokens.png   generated tokens/s over time, every backend on one axis: a stall shows at a glance
    latency.png  per request: send time vs E2EL and TTFT; failed requests marked
    itl.png      every inter-token gap at the time it ended
    rails.png    per-rail throughput over time (r2cc's counters, or host 0's interfaces)
Faulted rounds are in colour, fault-free rounds grey behind them.
"""

from __future__ import annotations

import os

from r2cc_serve.errors import UserError
from r2cc_testbed.loadtest.analysis import fault_windows, pairs_of, rail_rates, rounds_of
from r2cc_testbed.loadtest.rounds import Round

COLOURS = {"r2cc": "tab:blue", "default": "tab:red", "default-rails": "tab:purple", "default-mptcp": "tab:orange"}


def _plt():
    try:
        import matplotlib
    except ImportError:
        raise UserError("figures need matplotlib: pip install matplotlib (the `bench` extra)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def render(result: dict, out_dir: str) -> list[str]:
    """Write the figures of one scenario's result into out_dir; returns their file names."""
    plt = _plt()
    backends = [(name, rounds_of(entry)) for name, entry in result["backends"].items() if entry.get("rounds")]
    if not backends:
        return []
    lab_rails = result["scenario"]["rails"]
    name = result["scenario"]["name"]
    written = []
    for fname, draw in (("tokens.png", _tokens), ("latency.png", _latency), ("itl.png", _itl), ("rails.png", _rails)):
        fig = draw(plt, name, backends, lab_rails)
        fig.savefig(os.path.join(out_dir, fname), dpi=110, bbox_inches="tight")
        plt.close(fig)
        written.append(fname)
    return written


def _first_faulted(rounds: list[Round]) -> Round | None:
    pairs = pairs_of(rounds)
    return pairs[0][1] if pairs else next((r for r in rounds if r.plan["kind"] == "fault"), None)


def _shade(ax, rnd: Round | None, lab_rails: int) -> None:
    if rnd is None:
        return
    for n, w in enumerate(fault_windows(rnd, lab_rails)):
        ax.axvspan(w["from_s"], max(w["to_s"], w["from_s"] + 0.1), color="orange", alpha=0.18, lw=0)
        ax.annotate(w["label"], xy=(w["from_s"], 1 - 0.07 * (n % 4)), xycoords=("data", "axes fraction"),
                    fontsize=7, va="top", ha="left", color="saddlebrown")


def _tokens(plt, name, backends, lab_rails):
    fig, ax = plt.subplots(figsize=(10, 3.6))
    for backend, rounds in backends:
        rnd = _first_faulted(rounds)
        if rnd is None:
            continue
        pts = _token_rate(rnd.metrics)
        ax.plot([t for t, _ in pts], [v for _, v in pts], color=COLOURS.get(backend), label=f"{backend} (faulted round)")
        for f in rnd.failures:
            ax.axvline(f["t"], color=COLOURS.get(backend), ls=":", lw=1)
            ax.annotate(f"{backend}: {f['what'][:50]}", xy=(f["t"], 0.5), xycoords=("data", "axes fraction"),
                        fontsize=7, rotation=90, va="center", color=COLOURS.get(backend))
    _shade(ax, _first_faulted(backends[0][1]), lab_rails)
    ax.set_title(f"{name}: generated tokens per second (vLLM /metrics, 0.5 s samples)", fontsize=11)
    ax.set_xlim(left=-1.0)
    ax.set_xlabel("seconds into the round")
    ax.set_ylabel("tokens/s")
    ax.legend(loc="lower right", fontsize=8)
    return fig


def _token_rate(samples: list[dict]) -> list[tuple[float, float]]:
    pts, prev = [], None
    for s in samples:
        if s.get("tokens") is None:
            continue
        if prev is not None and s["t"] > prev["t"]:
            pts.append((s["t"], (s["tokens"] - prev["tokens"]) / (s["t"] - prev["t"])))
        prev = s
    return pts


def _per_backend(plt, title: str, backends, draw, xlabel: str = "seconds into the round"):
    """One row per backend, drawn by draw(ax, backend, rounds)."""
    fig, axes = plt.subplots(len(backends), 1, figsize=(10, 3.2 * len(backends)), squeeze=False, sharex=True)
    fig.suptitle(title, fontsize=11)
    for ax, (backend, rounds) in zip((a[0] for a in axes), backends):
        draw(ax, backend, rounds)
        ax.set_xlim(left=-1.0)  # samples before t0 cover only the client's own start-up
    axes[-1][0].set_xlabel(xlabel)
    return fig


def _latency(plt, name, backends, lab_rails):
    def draw(ax, backend, rounds):
        top = max([r.e2el_s for rnd in rounds for r in rnd.requests if r.ok] + [1.0]) * 1.05
        for rnd in rounds:
            faulted = rnd.plan["kind"] == "fault"
            ok = [r for r in rnd.requests if r.ok]
            ax.scatter([r.sent_s for r in ok], [r.e2el_s for r in ok], s=9, zorder=3 if faulted else 2,
                       color="tab:blue" if faulted else "0.75", label="E2EL" if faulted else None)
            ax.scatter([r.sent_s for r in ok], [r.ttft_s for r in ok], s=6, marker="^", zorder=3 if faulted else 2,
                       color="tab:green" if faulted else "0.85", label="TTFT" if faulted else None)
            bad = [r for r in rnd.requests if not r.ok]
            ax.scatter([r.sent_s for r in bad], [top] * len(bad), marker="x", color="red" if faulted else "0.5",
                       s=25, zorder=4, label="failed" if faulted and bad else None)
        _shade(ax, _first_faulted(rounds), lab_rails)
        _legend_once(ax)
        ax.set_ylabel(f"{backend}: seconds")

    return _per_backend(plt, f"{name}: latency per request by send time (faulted rounds in colour, fault-free grey; "
                             "x = failed)", backends, draw, "send time, seconds into the round")


def _itl(plt, name, backends, lab_rails):
    def draw(ax, backend, rounds):
        for rnd in rounds:
            faulted = rnd.plan["kind"] == "fault"
            xs = [t for r in rnd.requests for t in r.token_times_s()]
            ys = [g * 1000 for r in rnd.requests for g in r.itls_s]
            ax.scatter(xs, ys, s=3, color=COLOURS.get(backend) if faulted else "0.8", zorder=3 if faulted else 2)
        _shade(ax, _first_faulted(rounds), lab_rails)
        ax.set_yscale("log")
        ax.set_ylabel(f"{backend}: ITL, ms")

    return _per_backend(plt, f"{name}: inter-token latency over time (faulted in colour, fault-free grey)",
                        backends, draw)


def _rails(plt, name, backends, lab_rails):
    def draw(ax, backend, rounds):
        rnd = _first_faulted(rounds) or rounds[0]
        source, rates = ("r2cc_rail_sent_bytes (both hosts)", rail_rates(rnd.metrics, "rail_sent"))
        if not rates:
            source, rates = ("host 0 interface rx+tx", rail_rates(rnd.nics, "rails"))
        for k in sorted(rates):
            label = f"rail{k}" if k < lab_rails else f"rail{k} (fallback)"
            ax.plot([t for t, _ in rates[k]], [v / 1e6 for _, v in rates[k]], label=label, lw=1.2)
        _shade(ax, rnd if rnd.plan["kind"] == "fault" else None, lab_rails)
        ax.set_ylabel(f"{backend}: MB/s")
        ax.set_title(source, fontsize=8, loc="right")
        ax.legend(loc="upper right", fontsize=7, ncol=5)

    return _per_backend(plt, f"{name}: per-rail throughput in the first faulted round", backends, draw)


def _legend_once(ax) -> None:
    handles, labels = ax.get_legend_handles_labels()
    unique = dict(zip(labels, handles))  # one entry per label, however many rounds drew it
    if unique:
        ax.legend(list(unique.values()), list(unique), loc="upper right", fontsize=7)
