"""PNG figures of a benchmark result: throughput bars and attention cost versus length.

Matplotlib with the Agg backend (no display needed). Each function returns the path written, or
None when the result holds nothing to draw.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attnlab.bench.tables import threads


def _plt():
    import matplotlib  # heavy: only when drawing

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # heavy: only when drawing

    return plt


def throughput_bars(result: dict[str, Any], path: Path) -> Path | None:
    """One panel per comparison (lm shapes, seq2seq, generate contexts): tokens/s per contender."""
    suites = result.get("suites", {})
    panels = []
    for shape in suites.get("lm", {}).get("shapes", []):
        panels.append((f"LM train, {shape['shape']['name']}", shape["contenders"]))
    if suites.get("seq2seq", {}).get("status") == "ok":
        panels.append(("seq2seq train (target tokens)", suites["seq2seq"]["contenders"]))
    for row in suites.get("generate", {}).get("runs", []):
        title = f"generate, {row['model']['name']}, context {row['context']}"
        panels.append((title, row["contenders"]))
    panels = [(t, [c for c in cs if c.get("status") == "ok"]) for t, cs in panels]
    panels = [(t, cs) for t, cs in panels if cs]
    if not panels:
        return None
    plt = _plt()
    cols = min(len(panels), 4)
    nrows = -(-len(panels) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(3.2 * cols, 3.4 * nrows), squeeze=False)
    for ax in axes.flat[len(panels) :]:
        ax.set_visible(False)
    for ax, (title, contenders) in zip(axes.flat, panels):
        names = [c["name"] for c in contenders]
        speeds = [c["tokens_per_s"] for c in contenders]
        colors = ["tab:orange" if n == "attnlab" else "tab:gray" for n in names]
        bars = ax.bar(range(len(names)), speeds, color=colors)
        ours = dict(zip(names, speeds)).get("attnlab")
        if ours:  # label each rival with attnlab's speed-up over it
            labels = ["" if n == "attnlab" else f"{ours / v:.2f}x" for n, v in zip(names, speeds)]
            ax.bar_label(bars, labels, fontsize=7)
        ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
        ax.set_title(title, fontsize=9)
        ax.set_ylabel("tokens / s (median)", fontsize=8)
    fig.suptitle(f"attnlab bench, {threads(result['machine']['threads'])}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def attention_scaling(result: dict[str, Any], path: Path) -> Path | None:
    """Time and extra memory of each attention path versus N (log-log), with N^2 and N guides."""
    suite = result.get("suites", {}).get("attention", {})
    rows = suite.get("lengths", [])
    if suite.get("status") != "ok" or not rows:
        return None
    plt = _plt()
    fig, (ax_t, ax_m) = plt.subplots(1, 2, figsize=(9, 3.6))
    for p, marker in (("explicit", "o"), ("fused", "s")):
        pts = [(r["n"], r[p]) for r in rows if r.get(p, {}).get("status") == "ok"]
        if not pts:
            continue
        ns = [n for n, _ in pts]
        ax_t.plot(ns, [c["seconds"] for _, c in pts], marker=marker, label=p)
        mem = [(n, c["extra_bytes"] / 2**20) for n, c in pts if c.get("extra_bytes")]
        if mem:
            ax_m.plot([m[0] for m in mem], [m[1] for m in mem], marker=marker, label=p)
    ns = [r["n"] for r in rows]
    for ax, unit in ((ax_t, "s"), (ax_m, "MiB")):
        lines = [line.get_ydata() for line in ax.get_lines()]
        if not lines:
            continue
        y0 = max(y[0] for y in lines)
        ax.plot(ns, [y0 * (n / ns[0]) ** 2 for n in ns], "k:", label="~ N^2")
        ax.plot(ns, [y0 * (n / ns[0]) for n in ns], "k--", label="~ N", alpha=0.5)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length N")
        ax.set_ylabel(unit)
        ax.legend(fontsize=8)
    fits = suite.get("fits", {})
    ax_t.set_title(
        "time, fwd+bwd: "
        + ", ".join(
            f"{p} N^{fits[p]['time_exponent']:.2f}" for p in fits if fits[p]["time_exponent"]
        ),
        fontsize=9,
    )
    ax_m.set_title(
        "extra memory: "
        + ", ".join(
            f"{p} N^{fits[p]['memory_exponent']:.2f}" for p in fits if fits[p]["memory_exponent"]
        ),
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def make_plots(result: dict[str, Any], out_dir: Path) -> list[Path]:
    """Write every figure that has data into ``out_dir``; return their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    made = [
        throughput_bars(result, out_dir / "throughput.png"),
        attention_scaling(result, out_dir / "attention_scaling.png"),
    ]
    return [p for p in made if p is not None]
