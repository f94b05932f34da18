"""The run report's two plots (accuracy vs TTEOA with the Pareto front and both intervals; evidence recall vs
compression) and the Pareto front they ring. `report.write_report` calls them; matplotlib loads on first use."""
from __future__ import annotations

import statistics
from pathlib import Path

from .metrics import bootstrap_median_ci


def pareto_front(points: dict[str, tuple[float, float]]) -> list[str]:
    """Labels not dominated in (lower time, higher accuracy), sorted by time."""
    front = [a for a, (ta, qa) in points.items()
             if not any((tb <= ta and qb >= qa) and (tb < ta or qb > qa) for b, (tb, qb) in points.items() if b != a)]
    return sorted(front, key=lambda a: points[a][0])


def _plain_log_axis(axis) -> None:
    """Log axis ticks as plain numbers (0.5, 1, 2, 5 — never "2×10⁰")."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def plot_accuracy(path: Path, records: list[dict], summary: dict[str, dict],
                  points: dict[str, tuple[float, float]], front: list[str], title: str) -> None:
    """Writes the accuracy vs median TTEOA plot (95% CIs on both axes, the Pareto front ringed) to `path`."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for lab, (t, q) in points.items():
        _, tlo, thi = bootstrap_median_ci([r["tteoa"] for r in records if r["protocol"] == lab and r.get("tteoa")])
        _, qlo, qhi = summary[lab]["accuracy"]
        ax.errorbar(t, q, xerr=[[t - tlo], [thi - t]], yerr=[[q - qlo], [qhi - q]], fmt="o", ms=6, capsize=3,
                    zorder=3)
        ax.annotate(lab, (t, q), textcoords="offset points", xytext=(5, 5), fontsize=7)
    if front:  # a staircase through the front's points, each ringed: visible even when one protocol is the front
        ax.plot([points[a][0] for a in front], [points[a][1] for a in front], "k--", lw=1, drawstyle="steps-post",
                marker="o", ms=12, mfc="none", mec="k", zorder=2, label="Pareto front")
        ax.legend(fontsize=8)
    ax.set(xscale="log", xlabel="median TTEOA (s, log); bars: 95% CIs", ylabel="accuracy", ylim=(-0.05, 1.05),
           title=title)
    _plain_log_axis(ax.xaxis)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _recall_by_ratio(records: list[dict], label: str) -> dict[float, list[float]]:
    """compression ratio (rounded to 0.1) -> the evidence recalls of `label`'s records at that ratio."""
    by_ratio: dict[float, list[float]] = {}
    for r in records:
        if r["protocol"] == label and r.get("evidence_recall") is not None and r.get("compression_ratio"):
            by_ratio.setdefault(round(r["compression_ratio"], 1), []).append(r["evidence_recall"])
    return by_ratio


def plot_recall(path: Path, records: list[dict], summary: dict[str, dict], title: str) -> None:
    """Writes the evidence recall vs compression plot, one line per protocol that reports kept positions, to
    `path`."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.2))
    have_recall = False
    for lab in summary:
        by_ratio = _recall_by_ratio(records, lab)
        if by_ratio:
            have_recall = True
            xs = sorted(by_ratio)
            ax.plot(xs, [statistics.mean(by_ratio[x]) for x in xs], "o-", label=lab)
    ax.set(xscale="log", xlabel="compression of the documents (tokens ÷ tokens sent, log)",
           ylabel="evidence recall", ylim=(-0.05, 1.05), title=title)
    _plain_log_axis(ax.xaxis)
    if have_recall:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no protocol in this run reports kept positions", ha="center", transform=ax.transAxes)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
