"""What a page's prose says, bound to its runs. A study's notes quote figures as Jinja expressions
(``{{ difference('test/acc', '+arm/routing=efficient', '+arm/routing=uniform') }}``), evaluated over the
page's runs with the functions of :class:`Figures`, so that a figure in the prose is the figure of the
tables; and each qualitative claim the notes make is listed under the page's ``claims`` with an expression
that must hold. A rebuild whose runs no longer support a claim fails, naming it::

    page:
      notes: {quick: "Dynamic routing is within {{ difference(m, dyn, uni).magnitude }} points of it."}
      claims:
        quick:
          - claim: No routing algorithm beats uniform coupling
            holds: "significantly_above('test/acc', '+arm/routing=uniform') == []"

Every figure is in the page's display units (accuracies in %, differences in points) and prints as the
page's tables print it; its attributes are numbers for claims and Jinja's filters (``round``, ``abs``).
Expressions run in Jinja's sandbox: they can call the functions below and nothing else.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

from capsexp.errors import CapsexpError, ConfigError
from capsexp.records.metric_names import is_accuracy
from capsexp.results import statistics
from capsexp.results.differences import (
    both_adjusted,
    family,
    find,
    metrics_of,
    places,
    references_of,
    scale,
    test_only,
    verdict,
)
from capsexp.results.runs import Configuration, Run, group
from capsexp.results.study import StudyPage


class ClaimError(CapsexpError):
    """A page's claim that its runs do not support (the page is written, with the claim marked)."""

    exit_code = 1


class MissingFigure(LookupError):
    """A quoted figure of a configuration or metric these runs do not have."""


class UntestedQuote(ValueError):
    """Notes that print a p-value the page does not test: the notes are wrong, whatever the runs."""


def p_text(p: float | None) -> str:
    """A p-value as the page's tables print it."""
    if p is None:
        return ""
    if math.isnan(p):
        return "n/a (no spread)"
    return "< 0.001" if p < 0.001 else f"{p:.3f}"


@dataclass(frozen=True)
class Spread:
    """A configuration's figure over its runs: prints ``mean ± std`` (the mean alone for one run)."""

    mean: float
    std: float | None
    n: int
    low: float | None = None
    high: float | None = None

    def __str__(self) -> str:
        return f"{self.mean:.2f}" if self.std is None else f"{self.mean:.2f} ± {self.std:.2f}"

    @property
    def mean_text(self) -> str:
        return f"{self.mean:.2f}"


@dataclass(frozen=True)
class Gap:
    """A configuration minus a reference, in points: prints signed (``+1.29``); ``magnitude`` unsigned;
    ``low`` and ``high`` its 95% interval (``interval``: as the tables print it); ``p`` the p-value as
    the page's family adjusts it (None: not one of the page's tests), ``p_text`` as the tables print it;
    ``tested`` whether the runs were enough to test it (:data:`~capsexp.results.statistics.MIN_RUNS_TO_TEST`)."""

    points: float
    low: float | None
    high: float | None
    p: float | None
    significant: bool
    tested: bool = False
    places: int = 2  # decimals it prints with: hundredths of a point, thousandths of a score

    def __str__(self) -> str:
        return f"{self.points:+.{self.places}f}"

    @property
    def magnitude(self) -> str:
        return f"{abs(self.points):.{self.places}f}"

    @property
    def interval(self) -> str:
        return "" if self.low is None else f"[{self.low:+.{self.places}f}, {self.high:+.{self.places}f}]"

    @property
    def p_text(self) -> str:
        if self.p is None:
            raise UntestedQuote(
                f"the notes print the p-value of a difference ({self}) that is none of the page's tests: "
                "quote its interval instead"
            )
        return p_text(self.p)


class Figures:
    """The functions a page's expressions call, over its runs (test-only configurations left out, as
    the comparisons leave them out)."""

    def __init__(self, runs: list[Run], page: StudyPage, extra: dict | None = None) -> None:
        self.runs = runs
        self.configurations = [c for c in group(runs) if not test_only(c)]
        self.page = page
        self._family: list | None = None
        self.references = references_of(self.configurations, page) if self.configurations else []
        self.extra = extra or {}

    def configuration(self, key: str) -> Configuration:
        """The configuration labelled ``key``, else the one whose overrides include every override of it."""
        found = find(self.configurations, key)
        if found is None:
            raise MissingFigure(f"no configuration {key!r} among these runs")
        return found

    def summary(self, metric: str, key: str) -> Spread:
        """The final ``metric`` of ``key``'s runs (a scalar's last value), mean ± std."""
        values = [value for _, value in self.configuration(key).values(metric)]
        if not values:
            raise MissingFigure(f"{key!r} logged no {metric}")
        factor = scale(metric) if is_accuracy(metric) else 1.0  # accuracies in %, other scalars as logged
        found = statistics.summarise([factor * v for v in values], (0.0, factor) if is_accuracy(metric) else None)
        return Spread(found.mean, found.std, found.n, found.low, found.high)

    def family(self) -> list:
        """The page's comparisons as its tables give them (:func:`~capsexp.results.differences.family`)."""
        if self._family is None:
            headline = self.page.headline_metric(metrics_of(self.runs))
            metrics = [headline, *(m for m in self.page.metrics if m != headline)]
            self._family = family(self.configurations, metrics, self.page)
        return self._family

    def difference(self, metric: str, key: str, reference: str) -> Gap:
        """``key`` minus ``reference`` in ``metric``: the page's test of it where it has one (a declared
        hypothesis, or a row of the table's family), else the difference and its interval alone."""
        arm, base = self.configuration(key), self.configuration(reference)
        rows = [r for r in self.family() if r.metric == metric and r.configuration is arm and r.reference is base]
        row = next((r for r in rows if r.hypothesis is not None), rows[0] if rows else None)
        found = row.difference if row is not None else statistics.difference(arm.values(metric), base.values(metric))
        if found is None or not arm.values(metric) or not base.values(metric):
            raise MissingFigure(f"{metric} not logged by both {key!r} and {reference!r}")
        factor = scale(metric)
        in_family = row is not None and row.p_holm is not None
        return Gap(
            factor * found.mean,
            None if found.low is None else factor * found.low,
            None if found.high is None else factor * found.high,
            row.p_holm if in_family else None,
            row.significant if in_family else False,
            found.tested,
            places(factor),
        )

    def _declared(self, name: str):
        if not any(h.name == name for h in self.page.hypotheses):
            raise ConfigError(
                f"no declared hypothesis {name!r} (the page has {[h.name for h in self.page.hypotheses]})"
            )
        rows = [r for r in self.family() if r.hypothesis is not None]
        found = next((r for r in rows if r.hypothesis.name == name and r.difference is not None), None)
        if found is None:
            raise MissingFigure(f"the runs of declared hypothesis {name!r}")
        return found, rows

    def supported(self, name: str) -> bool:
        """Whether the runs support the declared hypothesis ``name`` (its test, Holm over the hypotheses; never
        where they cannot answer it: not judged)."""
        row = self._declared(name)[0]
        return row.significant and not row.not_judged

    def verdict(self, name: str) -> str:
        """The declared hypothesis ``name``'s verdict as the page's table gives it."""
        row, rows = self._declared(name)
        return verdict(row, both_adjusted(rows)[id(row)][1], bool(self.page.exploratory))

    def significantly_above(self, metric: str, reference: str) -> list[str]:
        """The configurations significantly above ``reference`` among the page's tests of ``metric``."""
        base = self.configuration(reference)
        return [
            r.configuration.label
            for r in self.family()
            if r.metric == metric
            and r.reference is base
            and r.significant
            and not r.not_judged
            and r.difference.mean > 0
        ]

    def most_variable(self, metric: str) -> str:
        """The configuration whose runs' ``metric`` has the largest std."""
        spreads = {
            c.label: s.std for c in self.configurations if (s := c.summary(metric)) is not None and s.std is not None
        }
        if not spreads:
            raise MissingFigure(f"no configuration has two runs of {metric}")
        return max(spreads, key=spreads.get)

    def last(self, tag: str, key: str) -> Spread:
        """The last logged value of any scalar ``tag`` (a routing measure, a presence score), mean ± std
        over ``key``'s runs, as logged (no scaling)."""
        values = [v for run in self.configuration(key).runs if (v := run.final(tag)) is not None]
        if not values:
            raise MissingFigure(f"{key!r} logged no {tag}")
        found = statistics.summarise(values, (0.0, 1.0) if is_accuracy(tag) else None)
        return Spread(found.mean, found.std, found.n, found.low, found.high)

    def after(self, tag: str, key: str, steps: int) -> Spread:
        """``tag`` as logged after ``steps`` training steps (at step ``steps - 1``: Lightning counts from 0),
        mean ± std over ``key``'s runs, as logged."""
        values = [v for run in self.configuration(key).runs for s, v in run.scalars.get(tag, []) if s == steps - 1]
        if not values:
            raise MissingFigure(f"{key!r} logged no {tag} after {steps} steps")
        found = statistics.summarise(values, (0.0, 1.0) if is_accuracy(tag) else None)
        return Spread(found.mean, found.std, found.n, found.low, found.high)

    def last_step(self, tag: str, key: str) -> int:
        """The step at which ``key``'s first run last logged ``tag``."""
        series = self.configuration(key).runs[0].scalars.get(tag)
        if not series:
            raise MissingFigure(f"{key!r} logged no {tag}")
        return series[-1].step

    def setting(self, key: str):
        """A value the experiment config sets (``budgets.full.threshold``): a setting the notes name, bound
        to the config instead of copied from it."""
        from omegaconf import OmegaConf

        from capsexp.locations import experiment_config, experiment_file

        found = (
            OmegaConf.select(experiment_config(experiment_file(self.page.experiment)), key)
            if self.page.experiment
            else None
        )
        if found is None:
            raise ConfigError(f"the notes quote setting {key!r}, which {self.page.source} lacks")
        return found

    def minutes(self, key: str) -> list[float]:
        """Each of ``key``'s runs' time in minutes, as the page's header counts run time (first to last
        logged scalar in each of its processes), in the runs' order."""
        found = [run.seconds / 60 for run in self.configuration(key).runs if run.seconds is not None]
        if not found:
            raise MissingFigure(f"{key!r} has no run with a logged time")
        return found

    def namespace(self) -> dict:
        return {
            "minutes": self.minutes,
            "setting": self.setting,
            "summary": self.summary,
            "difference": self.difference,
            "supported": self.supported,
            "verdict": self.verdict,
            "significantly_above": self.significantly_above,
            "most_variable": self.most_variable,
            "last": self.last,
            "after": self.after,
            "last_step": self.last_step,
            "configurations": [c.label for c in self.configurations],
            **self.extra,
        }


def _environment():
    from jinja2 import StrictUndefined
    from jinja2.sandbox import SandboxedEnvironment

    return SandboxedEnvironment(undefined=StrictUndefined, keep_trailing_newline=True)


@dataclass(frozen=True)
class BoundNotes:
    """A page's notes with their figures filled in, and the claims its runs do not support."""

    text: str
    failed: list[str]


# A result's figure written into the notes by hand: a decimal percentage, points or nats, or a p-value. Any
# such figure must come from a template over the runs (it would not follow them when they change).
HANDWRITTEN_FIGURE = re.compile(r"(?<![\w.])(?:\d+\.\d+ ?(?:%|points?|nats)|p \d?\.\d+)")


# A sentence (of the notes, or a config comment) that names a paper's or another project's figure.
A_PAPER = re.compile(r"\bpaper\b|\breports?\b|et al\.|\bTable \d")


def handwritten_figures(notes: str) -> list[str]:
    """The result figures of ``notes`` outside its Jinja expressions and statements, in sentences that name
    no paper."""
    prose = " ".join(re.sub(r"{{.*?}}|{%.*?%}|{#.*?#}", " ", notes, flags=re.S).split())
    found = []
    for sentence in re.split(r"(?<=\.)\s+(?=[A-Z(`])", prose):
        if not A_PAPER.search(sentence):
            found += [figure.group(0) for figure in HANDWRITTEN_FIGURE.finditer(sentence)]
    return found


def bind(page: StudyPage, runs: list[Run], source: str) -> BoundNotes:
    """Fill the notes' figures from ``runs`` and check the page's claims. ``source`` names where the
    page is declared, for errors. Runs that lack a quoted configuration or metric (a user's part of the
    study) get a line saying so in place of the notes, and no claim is checked."""
    from jinja2 import TemplateError

    written = handwritten_figures(page.notes)
    if written:
        raise ConfigError(
            f"{source}: the notes give {', '.join(repr(w) for w in written)} by hand: quote the runs' figure "
            "with a template ({{ summary(...) }}, {{ difference(...) }}) so that it follows them"
        )
    figures = Figures(runs, page, _extra_functions(page, runs))
    environment = _environment()
    namespace = figures.namespace()
    try:
        text = reflow(environment.from_string(page.notes).render(namespace)) if page.notes else ""
        failed = []
        for claim in page.claims:
            try:
                holds = environment.compile_expression(claim.holds)(namespace)
            except TemplateError as error:
                raise ConfigError(
                    f"{source}: claim {claim.claim!r}: its expression does not evaluate ({error})"
                ) from error
            if not holds:
                failed.append(claim.claim)
    except MissingFigure as missing:
        return BoundNotes(
            f"The study's notes quote figures of its committed runs that these runs do not have ({missing}): "
            "they are left out.",
            [],
        )
    except (TemplateError, UntestedQuote) as error:
        raise ConfigError(f"{source}: the page's notes do not render ({error})") from error
    return BoundNotes(text, failed)


NOTES_WIDTH = 100  # rendered notes are wrapped to this width, as the notes in the configs are


def reflow(text: str) -> str:
    """The rendered notes' paragraphs and list items wrapped again, since the figures filled in changed
    the lines' lengths (Markdown reads them the same; the raw page stays readable)."""
    import textwrap

    blocks: list[list[str]] = []
    for line in text.strip("\n").split("\n"):
        if not line.strip():
            blocks.append([])
        elif line.startswith("- ") or not blocks or not blocks[-1]:
            blocks.append([line.strip()])
        else:
            blocks[-1].append(line.strip())
    out = []
    for block in blocks:
        if not block:
            out.append("")
            continue
        words = " ".join(block).replace(" ± ", "\xa0±\xa0")  # a figure and its spread stay on one line
        item = words.startswith("- ")
        out.append(
            textwrap.fill(
                words,
                NOTES_WIDTH,
                subsequent_indent="  " if item else "",
                break_long_words=False,
                break_on_hyphens=False,
            )
        )
    return "\n".join(out).replace("\xa0", " ")


def _extra_functions(page: StudyPage, runs: list[Run]) -> dict:
    """The page's own figure functions (``page.functions``: ``module.function`` taking the runs and the
    page and returning a dict of functions), for figures only a study's section computes."""
    import importlib

    found = {}
    for name in page.functions:
        module, _, function = name.rpartition(".")
        try:
            found.update(getattr(importlib.import_module(module), function)(runs, page))
        except (ImportError, AttributeError, ValueError) as error:
            raise ConfigError(f"page.functions: {name} is no function ({error})") from error
    return found


def unsupported_block(failed: list[str]) -> str:
    """The warning a page opens with when its runs do not support some of its claims."""
    if not failed:
        return ""
    return (
        "**These runs do not support the notes' claims:** "
        + "; ".join(f'"{claim}"' for claim in failed)
        + ". The notes below were written for the study's committed runs.\n"
    )


def render_over_page(folder: Path, template: str) -> str:
    """``template`` rendered over the runs kept on the results page ``folder``, with the functions of
    :class:`Figures`: how a docs page's quote of a results page is checked (tests/test_docs.py)."""
    from capsexp.results.runs import KEPT_RUNS, find_runs, label_configurations
    from capsexp.results.study import page_for

    runs = find_runs(folder / KEPT_RUNS)
    label_configurations(runs)
    page = page_for(runs)
    figures = Figures(runs, page, _extra_functions(page, runs))
    return _environment().from_string(template).render(figures.namespace())
