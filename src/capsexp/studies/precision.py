"""The precision equivalence study's page: per net, the paired differences bf16-mixed minus float32 in test
accuracy and presence gap, each against the equivalence margin, and what ``trainer.precision=auto``
chooses from them (:data:`capsexp.config.precision.BF16_NETS`)."""

from __future__ import annotations

import functools
import statistics as stats
from dataclasses import dataclass
from pathlib import Path

from capsexp.config.precision import BF16, BF16_NETS, FLOAT32
from capsexp.results.metric_names import PRESENCE_GAP, TEST_ACC
from capsexp.results.plots import DPI, _pyplot
from capsexp.results.runs import Run
from capsexp.results.statistics import SIGNIFICANCE, Equivalence, equivalence, holm_adjusted
from capsexp.results.study import StudyPage

ARM = "arm/precision_equivalence"  # the sweep's net arms: conf/arm/precision_equivalence/<net>.yaml
PRECISION = "trainer.precision"
# The equivalence margin, in points (hundredths) of each metric: what the study's hypotheses declare.
MARGIN_POINTS = 0.3
METRICS = {TEST_ACC: "test accuracy", PRESENCE_GAP: "presence gap"}
TIME = "perf/train_epoch_s"
FIGURE = "equivalence.png"


@dataclass(frozen=True)
class Row:
    arm: str
    metric: str
    float32: float  # means over the paired seeds, in points
    bf16: float
    test: Equivalence  # of the differences, in points
    p_holm: float = float("nan")

    @property
    def backed(self) -> bool:
        return self.test.inside and self.p_holm < SIGNIFICANCE


@functools.cache
def net_of(arm: str) -> str:
    """The net class an arm trains (its ``model.net._target_``), as the arm's config composes it."""
    from capsexp.config.hydra_setup import compose

    return str(compose([f"+{ARM}={arm}"]).model.net._target_)


def _paired(runs: list[Run], arm: str, tag: str) -> dict[int, tuple[float, float]]:
    """seed: (float32's final value, bf16's) over the seeds that ran in both precisions."""
    by_precision: dict[str, dict[int, float]] = {FLOAT32: {}, BF16: {}}
    for run in runs:
        value, precision = run.final(tag), run.choice(PRECISION)
        if run.choice(ARM) == arm and precision in by_precision and value is not None and run.seed is not None:
            by_precision[precision][run.seed] = value
    seeds = sorted(set(by_precision[FLOAT32]) & set(by_precision[BF16]))
    return {seed: (by_precision[FLOAT32][seed], by_precision[BF16][seed]) for seed in seeds}


def arms(runs: list[Run]) -> list[str]:
    """The nets' arms, in the order the runs first show them."""
    return list(dict.fromkeys(arm for run in runs if (arm := run.choice(ARM)) is not None))


def rows(runs: list[Run]) -> list[Row]:
    """Every net and metric with two seeds or more in both precisions; the TOST p-values Holm-adjusted
    together (the page's one family)."""
    found = []
    for arm in arms(runs):
        for metric in METRICS:
            pairs = _paired(runs, arm, metric)
            if len(pairs) < 2:
                continue
            differences = [100 * (bf16 - float32) for float32, bf16 in pairs.values()]
            found.append(
                Row(
                    arm,
                    metric,
                    100 * stats.fmean(f for f, _ in pairs.values()),
                    100 * stats.fmean(b for _, b in pairs.values()),
                    equivalence(differences, MARGIN_POINTS),
                )
            )
    adjusted = holm_adjusted([row.test.p for row in found])
    return [Row(r.arm, r.metric, r.float32, r.bf16, r.test, p) for r, p in zip(found, adjusted, strict=True)]


def backed_nets(runs: list[Run]) -> frozenset[str]:
    """The net classes whose every arm and metric the page backs in bf16."""
    verdicts: dict[str, bool] = {}
    for row in rows(runs):
        net = net_of(row.arm)
        verdicts[net] = verdicts.get(net, True) and row.backed
    return frozenset(net for net, backed in verdicts.items() if backed)


def time_ratio(runs: list[Run], arm: str) -> float | None:
    """The median over seeds of bf16's training time over float32's (the epoch's, without validation)."""
    pairs = _paired(runs, arm, TIME)
    return stats.median(bf16 / float32 for float32, bf16 in pairs.values()) if pairs else None


def _p(p: float) -> str:
    return "< 0.001" if p < 0.001 else f"{p:.3f}"


def equivalence_section(runs: list[Run], page: StudyPage, output: Path) -> str:
    """The table of the paired differences and the verdict per net."""
    found = rows(runs)
    if not found:
        return ""
    lines = [
        "## bf16-mixed against float32, paired by seed",
        "",
        f"Differences bf16-mixed minus float32 in points (hundredths), against the margin ±{MARGIN_POINTS:g}: "
        "the 95% interval of the mean difference (Student t over the seeds) and the p-value of two one-sided "
        f"tests, then Holm-adjusted over the page's {len(found)} tests. A net is backed in bf16 where every one "
        f"of its rows has its interval inside the margin and an adjusted p below {SIGNIFICANCE:g}.",
        "",
        "| arm | net | metric | seeds | float32 | bf16-mixed | difference [95% interval] | TOST p | Holm | inside |",
        "| --- | --- | --- | ---: | ---: | ---: | --- | ---: | ---: | --- |",
    ]
    for row in found:
        test = row.test
        lines.append(
            f"| {row.arm} | {net_of(row.arm).rpartition('.')[2]} | {METRICS[row.metric]} | {test.n} "
            f"| {row.float32:.2f} | {row.bf16:.2f} | {test.mean:+.2f} [{test.low:+.2f}, {test.high:+.2f}] "
            f"| {_p(test.p)} | {_p(row.p_holm)} | {'yes' if row.backed else 'no'} |"
        )
    backed = backed_nets(runs)
    lines += ["", "| arm | training time, bf16-mixed over float32 (median over seeds) |", "| --- | ---: |"]
    for arm in arms(runs):
        ratio = time_ratio(runs, arm)
        lines.append(f"| {arm} | {'n/a' if ratio is None else f'{ratio:.2f}x'} |")
    names = ", ".join(sorted(n.rpartition(".")[2] for n in backed)) or "none"
    kept = sorted({net_of(arm) for arm in arms(runs)} - backed)
    lines += [
        "",
        f"Backed in bf16 by these runs: **{names}**; "
        + (
            f"float32 under `auto`: {', '.join(n.rpartition('.')[2] for n in kept)}."
            if kept
            else "no net keeps float32."
        )
        + " `trainer.precision=auto` trains in bf16-mixed the nets of `BF16_NETS` in `capsexp/config/precision.py` "
        f"(today: {', '.join(sorted(n.rpartition('.')[2] for n in BF16_NETS)) or 'none'}), where bf16 is native.",
    ]
    return "\n".join(lines) + "\n"


def equivalence_figure(runs: list[Run], page: StudyPage, output: Path) -> Path | None:
    """``equivalence.png``: per metric a panel, per arm a row: each seed's difference (dots), the mean and its
    95% interval (bar), the margin shaded."""
    found = rows(runs)
    if not found:
        return None
    plt = _pyplot()
    metrics = [m for m in METRICS if any(r.metric == m for r in found)]
    names = arms(runs)
    figure, axes_row = plt.subplots(
        1, len(metrics), figsize=(5.2 * len(metrics), 0.7 * len(names) + 1.8), squeeze=False
    )
    for axes, metric in zip(axes_row[0], metrics, strict=True):
        axes.axvspan(-MARGIN_POINTS, MARGIN_POINTS, color="C2", alpha=0.15, linewidth=0, label="equivalence margin")
        axes.axvline(0, color="0.4", linewidth=0.8)
        for y, arm in enumerate(names):
            row = next((r for r in found if r.arm == arm and r.metric == metric), None)
            if row is None:
                continue
            pairs = _paired(runs, arm, metric)
            seeds = [100 * (b - f) for f, b in pairs.values()]
            axes.plot(
                seeds, [y + 0.18] * len(seeds), "o", color="0.5", markersize=4, label="a seed" if y == 0 else None
            )
            colour = "C0" if row.backed else "C3"
            axes.errorbar(
                row.test.mean,
                y,
                xerr=[[row.test.mean - row.test.low], [row.test.high - row.test.mean]],
                fmt="s",
                color=colour,
                capsize=4,
                label=None,
            )
        axes.set_yticks(range(len(names)), names)
        axes.set_ylim(len(names) - 0.5, -0.6)
        axes.set_xlabel(f"bf16-mixed minus float32, {METRICS[metric]} (points)")
        axes.grid(axis="x", alpha=0.3)
    axes_row[0][0].legend(fontsize="small", loc="lower left")
    figure.suptitle(
        f"Mean paired difference and its 95% interval (blue: inside ±{MARGIN_POINTS:g}, red: not), each seed a dot",
        fontsize="medium",
    )
    path = output / FIGURE
    figure.savefig(path, dpi=DPI, bbox_inches="tight")
    plt.close(figure)
    return path


def figures(runs: list[Run], page: StudyPage) -> dict:
    """What the page's claims check: ``backed()``, the net classes the runs back in bf16, and ``auto()``,
    those ``trainer.precision=auto`` trains in bf16 (:data:`~capsexp.config.precision.BF16_NETS`)."""
    return {"backed": lambda: backed_nets(runs), "auto": lambda: BF16_NETS}
