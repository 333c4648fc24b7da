"""The precision equivalence study's page: per model, the paired differences bf16-mixed minus float32 in test
accuracy and presence gap, each against the equivalence margin, and what ``trainer.precision=auto``
chooses from them (:data:`capsexp.config.precision.BF16_MODELS`)."""

from __future__ import annotations

import functools
import math
import statistics as stats
from dataclasses import dataclass
from pathlib import Path

from capsexp.config.precision import BF16, BF16_MODELS, FLOAT32, routing_of
from capsexp.records.metric_names import PRESENCE_GAP, TEST_ACC
from capsexp.results.plots import _pyplot, saved
from capsexp.results.runs import Run
from capsexp.results.statistics import SIGNIFICANCE, Equivalence, equivalence, holm_adjusted
from capsexp.results.study import StudyPage

ARM = "arm/precision_equivalence"  # the sweep's net arms: conf/arm/precision_equivalence/<net>.yaml
PRECISION = "trainer.precision"
# The equivalence margin, in points (hundredths) of each metric: what the study's hypotheses declare.
MARGIN_POINTS = 0.3
METRICS = {TEST_ACC: "test accuracy", PRESENCE_GAP: "presence gap"}
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
        """The page's one rule: two one-sided t-tests, each at 5%, Holm-adjusted over the page's tests."""
        return self.p_holm < SIGNIFICANCE

    @property
    def identical(self) -> bool:
        """bf16 changed nothing: every seed's difference 0 (a net that computes in float32 under autocast)."""
        return self.test.mean == self.test.low == self.test.high == 0


@functools.cache
def model_of(arm: str) -> tuple[str, str | None]:
    """The model config an arm trains (``model=<name>``) and its routing (``model.net.routing``'s
    ``_target_``, None for a net without one), as the arm's config composes them."""
    from capsexp.config.hydra_setup import compose

    cfg = compose([f"+{ARM}={arm}"], with_hydra=True)
    return str(cfg.hydra.runtime.choices["model"]), routing_of(cfg.model)


def _shown(arm: str) -> str:
    model, routing = model_of(arm)
    return f"model={model}" + (f" ({routing.rpartition('.')[2]})" if routing else "")


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
    # Rows whose bf16 runs are their float32 runs test nothing: they stay out of the family.
    adjusted = holm_adjusted([math.nan if row.identical else row.test.p for row in found])
    return [Row(r.arm, r.metric, r.float32, r.bf16, r.test, p) for r, p in zip(found, adjusted, strict=True)]


def backed_models(runs: list[Run]) -> dict[str, str | None]:
    """model config: routing, for the arms the page backs in bf16 (every row inside the margin) and whose
    bf16 runs differ from float32's (where they do not, bf16 has nothing to give)."""
    verdicts: dict[str, list[Row]] = {}
    for row in rows(runs):
        verdicts.setdefault(row.arm, []).append(row)
    return dict(
        model_of(arm)
        for arm, found in verdicts.items()
        if all(r.backed for r in found) and not all(r.identical for r in found)
    )


def _listed(models: dict[str, str | None]) -> str:
    """``capsnet (UniformRouting), capsnet_small (DynamicRouting)``: model configs with their routing."""
    return ", ".join(f"{m} ({(r or 'no routing').rpartition('.')[2]})" for m, r in sorted(models.items()))


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
        f"Differences bf16-mixed minus float32 in points (hundredths), against the margin ±{MARGIN_POINTS:g}. "
        f"The rule: a row is equivalent where two one-sided t-tests of its paired differences, each at "
        f"{SIGNIFICANCE:g} (the mean below +{MARGIN_POINTS:g}, and above -{MARGIN_POINTS:g}), give a p (the larger "
        f"of the two) below {SIGNIFICANCE:g} after Holm's adjustment over the page's "
        f"{sum(not r.identical for r in found)} tests (a net whose bf16 runs are its float32 runs is not tested); "
        "a net is backed in bf16 where every one of its rows is. The 95% interval of the mean difference "
        "(Student t over the seeds) shows its size; it does not decide.",
        *(["", f"Read as exploratory: {page.exploratory}."] if page.exploratory else []),
        "",
        "| arm | model | metric | seeds | float32 | bf16-mixed | difference [95% interval] | TOST p | Holm "
        "| equivalent |",
        "| --- | --- | --- | ---: | ---: | ---: | --- | ---: | ---: | --- |",
    ]
    for row in found:
        test = row.test
        lines.append(
            f"| {row.arm} | {_shown(row.arm)} | {METRICS[row.metric]} | {test.n} "
            f"| {row.float32:.2f} | {row.bf16:.2f} | {test.mean:+.2f} [{test.low:+.2f}, {test.high:+.2f}] "
            + (
                "| identical, not tested | | |"
                if row.identical
                else f"| {_p(test.p)} | {_p(row.p_holm)} | {'yes' if row.backed else 'no'} |"
            )
        )
    backed = backed_models(runs)
    verdicts = []
    for arm in arms(runs):
        mine = [r for r in found if r.arm == arm]
        if all(r.identical for r in mine):
            verdict = "float32: its bf16 runs are its float32 runs (it computes in float32 under autocast)"
        elif all(r.backed for r in mine):
            verdict = "bf16-mixed (exploratory)" if page.exploratory else "**bf16-mixed**"
        else:
            verdict = "float32: " + ", ".join(METRICS[r.metric] for r in mine if not r.backed) + " not shown equivalent"
        verdicts.append(f"| {_shown(arm)} | {verdict} |")
    auto = _listed(BF16_MODELS)
    agreeing = (
        f"; these runs back {_listed(backed)}"
        if backed and all(BF16_MODELS.get(m, "") == r for m, r in backed.items())
        else ""
    )
    lines += [
        "",
        "| model | what `trainer.precision=auto` trains it in, from these runs |",
        "| --- | --- |",
        *verdicts,
        "",
        f"`trainer.precision=auto` trains in bf16-mixed, where bf16 is native, the models of `BF16_MODELS` in "
        f"`src/capsexp/config/precision.py`: {auto or 'none'}{agreeing}. "
        "Speed: [bench_step.md](../bench_step.md) (these runs shared the machine with other work, so their "
        "times are not compared here).",
    ]
    return "\n".join(lines) + "\n"


def equivalence_figure(runs: list[Run], page: StudyPage, output: Path) -> Path | None:
    """``equivalence.png``: per metric a panel, per arm a row: each seed's difference (dots), the mean and its
    95% interval (bar), the margin shaded, coloured by the page's rule."""
    found = rows(runs)
    if not found:
        return None
    plt = _pyplot()
    metrics = [m for m in METRICS if any(r.metric == m for r in found)]
    names = arms(runs)
    figure, axes_row = plt.subplots(
        1,
        len(metrics),
        figsize=(5.2 * len(metrics), 0.7 * len(names) + 2.4),
        squeeze=False,
        sharey=True,
        layout="constrained",  # room for the wrapped title and the legend below the axes' labels
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
        unit = "points" if metric == TEST_ACC else "hundredths of a score"
        axes.set_xlabel(f"bf16-mixed minus float32, {METRICS[metric]} ({unit})")
        axes.grid(axis="x", alpha=0.3)
    handles, labels = axes_row[0][0].get_legend_handles_labels()
    figure.legend(handles, labels, fontsize="small", loc="outside lower center", ncol=2)
    title = (
        f"Mean paired difference and its 95% interval (blue: equivalent within ±{MARGIN_POINTS:g} by the "
        "page's rule, two one-sided tests at 5% each, Holm; red: not), each seed a dot"
    )
    return saved(figure, output / FIGURE, title)


def figures(runs: list[Run], page: StudyPage) -> dict:
    """What the page's claims check: ``backed()``, the models (with their routing) the runs back in bf16, and
    ``auto()``, those ``trainer.precision=auto`` trains in bf16 (:data:`~capsexp.config.precision.BF16_MODELS`);
    what its notes quote: ``margin`` and ``equivalence_of(arm, metric)``, a row's paired differences."""

    def equivalence_of(arm: str, metric: str) -> Equivalence:
        """An arm's paired differences in ``metric`` as the page's table gives them (points)."""
        found = next((row for row in rows(runs) if row.arm == arm and row.metric == metric), None)
        if found is None:
            raise KeyError(f"no row of {arm} in {metric}")
        return found.test

    return {
        "backed": lambda: backed_models(runs),
        "auto": lambda: BF16_MODELS,
        "margin": MARGIN_POINTS,
        "equivalence_of": equivalence_of,
    }
