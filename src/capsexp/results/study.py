"""What an experiment config (``conf/experiment/<name>.yaml``) says about its results page, under its
``page`` key: the title, the notes per budget, the headline metric and the reference configuration,
the paper's figures to show beside ours, the figures its budgets gave here (the reproduction check),
and the functions that add what a table cannot show. A comparison of runs made with
``experiment=<name>`` reads it from there; every key is optional.

    page:
      title: Rotation robustness
      metric: test/acc                 # the metric compared across configurations (default below); a list
                                       # compares each (the first is the headline)
      reference: model=lenet5          # the configuration the others are compared with (default: the first);
                                       # a list compares them with each
      notes: {quick: "...", full: "..."}
      paper:                           # shown beside ours
        source: Sabour et al. 2017, Table 1
        metric: test error (%)         # what the paper's figures are
        error: true                    # they are errors in %: ours shown as errors beside them
        figures: {model.net.routing.iterations=1 model.net.reconstruction=false: 0.34 ± 0.032}
      expected:                        # what each budget gave on this project's machine
        quick:
          source: experiments/results/rotation_robustness_quick   # the page whose runs gave them
          tolerance: 0.01                # for a figure of one run: no spread to derive one from
          figures: {model=lenet5: 0.95, model=capsnet: {mean: 0.97, std: 0.002, runs: 3}}
      sections: [capsexp.studies.sabour2017.reconstructions]      # functions (runs, page, folder) -> Markdown
      claims:                          # what the notes claim, checked against the runs at every rebuild
        quick:
          - claim: CapsNet beats LeNet5 at every angle up to 45 degrees
            holds: "difference('test/acc_rot45', 'model=capsnet', 'model=lenet5').points > 0"
      functions: [capsexp.studies.routing.figures]        # more figures the notes and claims may quote
      answer: capsexp.studies.verdict.verdict_grid  # (runs, page, folder) -> Markdown under the first figure
      lead_figure: capsexp.studies.engagement.engagement_figure  # (runs, page, folder) -> the page's first
                                       # figure, when its answer is not the headline metric's comparison
      differences: false               # no "against the reference" section: the page's sections compare
      exploratory: "after seeds 1-3 were seen"  # the hypotheses read as exploratory, and why
      verdicts:                        # or: another page's hypotheses asked of each routing (a family each)
        hypotheses_of: routing_verdict
        routings: [dynamic, em]
      hypotheses:                      # the confirmatory tests, declared before the runs (one family)
        - name: dynamic routing and affine generalisation
          metric: test/acc_affine_mnist
          arm: +arm/routing_engagement=dynamic
          reference: +arm/routing_engagement=uniform
          smallest_effect: 0.5         # the smallest difference that matters, in the page's units
          direction: two-sided         # or greater / less: the arm above / below the reference
          test: t                      # the test Holm's method adjusts: t, or permutation
          margin: 0.5                  # optional: "no difference" claimed by two one-sided tests within
                                       # +-margin (page units), Holm over the hypotheses with one

The notes are Jinja templates: ``{{ summary('test/acc', 'model=capsnet') }}`` quotes a figure of the runs
(:mod:`capsexp.results.claims`).

A configuration matches a paper figure's key when its overrides include every override of the key; an
expected figure's key is the whole of a job's choices (its seed aside), and checks only runs made so.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from omegaconf import OmegaConf

from capsexp.errors import ConfigError
from capsexp.locations import CONFIG_DIR, experiment_config, experiment_file, shown
from capsexp.overrides import key as override_key
from capsexp.records.metric_names import TEST_ACC, VAL_ACC, VAL_ACC_BEST
from capsexp.results.runs import mixed_provenance
from capsexp.results.statistics import reproduction_tolerance

# The budget of a run without study=...: the one conf/config.yaml sets.
DEFAULT_BUDGET = str(OmegaConf.load(CONFIG_DIR / "config.yaml").study)


@dataclass(frozen=True)
class PaperFigures:
    source: str
    metric: str
    error: bool
    figures: dict[str, str]


@dataclass(frozen=True)
class ExpectedFigure:
    """A figure a budget gave: the mean over ``runs`` seeds with their ``std``, or (``std`` None) the
    value of one run with the budget's ``tolerance``."""

    mean: float
    runs: int = 1
    std: float | None = None
    tolerance: float | None = None

    def tolerance_for(self, rerun: int) -> float:
        """How far a mean over ``rerun`` seeds may fall from this one
        (:func:`~capsexp.results.statistics.reproduction_tolerance`; the budget's for a figure of one run)."""
        if self.std is None:
            return self.tolerance
        return reproduction_tolerance(self.std, self.runs, rerun)


@dataclass(frozen=True)
class Expected:
    figures: dict[str, ExpectedFigure]  # configuration key -> what it gave
    source: str | None = None  # the results folder (from the project's root) whose runs gave the figures


def _expected(node: dict) -> Expected:
    """A budget's ``expected`` node: each figure the mean, std and number of runs its page gave, or a
    number, the figure of one run, checked within the budget's ``tolerance``; ``source``, the results
    folder whose runs gave them (its own runs are no check of them)."""
    figures = {}
    for key, figure in node["figures"].items():
        if isinstance(figure, dict):
            figures[key] = ExpectedFigure(float(figure["mean"]), int(figure["runs"]), float(figure["std"]))
            figures[key].tolerance_for(figures[key].runs)  # a spread of one run is refused here
        elif node.get("tolerance") is None:
            raise ValueError(f"expected figure {key!r} is of one run, and the budget gives no tolerance for it")
        else:
            figures[key] = ExpectedFigure(float(figure), tolerance=float(node["tolerance"]))
    return Expected(figures, node.get("source"))


@dataclass(frozen=True)
class Claim:
    """A qualitative claim of the notes, and the expression over the runs that must hold for it
    (:mod:`capsexp.results.claims`)."""

    claim: str
    holds: str


HYPOTHESIS_TESTS = ("t", "permutation")  # a declared hypothesis's test: the t-test or the exact permutation test


@dataclass(frozen=True)
class Hypothesis:
    """A confirmatory comparison declared in the experiment config before its runs: ``arm`` minus
    ``reference`` in ``metric``, tested in ``direction`` (:data:`~capsexp.results.statistics.ALTERNATIVES`)
    by ``test``; ``smallest_effect`` is the smallest difference that matters, in the page's units (points
    of accuracy, a scalar as logged). ``margin`` (same units): where given, a difference the test does not
    find may be shown equivalent to none, within +-margin, by two one-sided tests; the verdict is then
    supported, equivalent, or cannot tell at this power."""

    name: str
    metric: str
    arm: str
    reference: str
    smallest_effect: float
    direction: str = "two-sided"
    test: str = "t"
    margin: float | None = None
    family: str = ""  # Holm's adjustment is within a family: the page's one, or each routing's of its verdicts
    # Why the runs cannot answer it, whatever their test gives (set by the page, not the config): the arms
    # differ in more than the hypothesis is about (capsexp.config.verdict_arms.second_change). Still counted
    # in its family's adjustment, so that withholding it makes no other verdict easier to reach.
    not_judged: str = ""


def _hypothesis(node: dict) -> Hypothesis:
    from capsexp.results.statistics import ALTERNATIVES

    keys = [name for name in Hypothesis.__dataclass_fields__ if name != "not_judged"]
    unknown = set(node) - set(keys)
    if unknown:
        raise ValueError(f"a hypothesis has no key {', '.join(sorted(unknown))} (it has {', '.join(keys)})")
    hypothesis = Hypothesis(**{**node, "smallest_effect": float(node["smallest_effect"])})
    if hypothesis.direction not in ALTERNATIVES:
        raise ValueError(
            f"hypothesis {hypothesis.name!r}: direction {hypothesis.direction!r} "
            f"is not one of {', '.join(ALTERNATIVES)}"
        )
    if hypothesis.test not in HYPOTHESIS_TESTS:
        raise ValueError(
            f"hypothesis {hypothesis.name!r}: test {hypothesis.test!r} is not one of {', '.join(HYPOTHESIS_TESTS)}"
        )
    if hypothesis.margin is not None and float(hypothesis.margin) <= 0:
        raise ValueError(f"hypothesis {hypothesis.name!r}: margin must be positive, not {hypothesis.margin}")
    if hypothesis.smallest_effect <= 0:
        raise ValueError(
            f"hypothesis {hypothesis.name!r}: smallest_effect must be positive, not {hypothesis.smallest_effect}"
        )
    return hypothesis


@dataclass(frozen=True)
class StudyPage:
    experiment: str | None = None
    budget: str = DEFAULT_BUDGET
    title: str = "Run comparison"
    metrics: tuple[str, ...] = ()  # compared with the references; the first is the headline
    references: tuple[str, ...] = ()
    notes: str = ""
    paper: PaperFigures | None = None
    expected: Expected | None = None
    sections: list[str] = field(default_factory=list)
    claims: tuple[Claim, ...] = ()
    functions: tuple[str, ...] = ()  # figure functions the notes and claims may call (capsexp.results.claims)
    # the keys the experiment's sweep sets (hydra.sweeper.params), without a "+", and the groups it requires
    swept: tuple[str, ...] = ()
    lead_figure: str | None = None  # a function (runs, page, folder) -> Path: the figure shown first
    answer: str | None = None  # a function (runs, page, folder) -> Markdown: the answer, under the first figure
    # Why the declared hypotheses are read as exploratory (declared after some of their runs were seen):
    # their tests then find differences to confirm, not supported hypotheses. None: confirmatory.
    exploratory: str | None = None
    # What the runs of a page of verdicts were (its ``verdicts.setting`` for the budget): where set, the
    # page keeps its verdicts beside it for model cards to quote (capsexp.records.verdicts).
    verdicts_setting: str | None = None
    # false: no section of each configuration against the references, where the page's own sections make
    # the comparisons its design asks for (each net against itself in another precision, say)
    differences: bool = True
    hypotheses: tuple[Hypothesis, ...] = ()

    @property
    def source(self) -> str:
        """The experiment config as the page names it (``conf/experiment/<name>.yaml``, or a package's)."""
        return shown(experiment_file(self.experiment)) if self.experiment else "no experiment config"

    @property
    def reference(self) -> str | None:
        """The first reference: the configuration a figure of one configuration shows first."""
        return self.references[0] if self.references else None

    def headline_metric(self, logged: list[str]) -> str:
        """The metric compared: the page's first, else the first logged of the test accuracy, the best and
        the final validation accuracy, else the first metric logged."""
        if self.metrics:
            return self.metrics[0]
        return next((m for m in (TEST_ACC, VAL_ACC_BEST, VAL_ACC) if m in logged), logged[0] if logged else TEST_ACC)


def matches(key: str, overrides: list[str]) -> bool:
    """Whether a run with ``overrides`` is of the configuration ``key`` names (every override of the
    key among the run's; values compared without case, so ``true`` matches Hydra's ``True``)."""
    have = {o.lower() for o in overrides}
    return all(part.lower() in have for part in key.split())


def figure_for(figures: dict, overrides: list[str]):
    """The figure whose key the overrides match (the most specific key when several do), or None."""
    found = [key for key in figures if matches(key, overrides)]
    return figures[max(found, key=lambda key: len(key.split()))] if found else None


def _strings(value: str | list[str] | None) -> tuple[str, ...]:
    """A page key that takes one string or a list of them."""
    if value is None:
        return ()
    return (value,) if isinstance(value, str) else tuple(str(v) for v in value)


def load_study_page(experiment: str | None, budget: str | None, overrides: Sequence[str] = ()) -> StudyPage:
    """The ``page`` of ``conf/experiment/<experiment>.yaml`` for ``budget``, with the ``page.*`` overrides
    its runs were given (``page.verdicts.routings=[em,vb]``); a plain page for runs of no experiment, or
    of one this project does not hold."""
    budget = budget or DEFAULT_BUDGET
    if not experiment or not experiment_file(experiment).exists():
        return StudyPage(experiment, budget)
    config = experiment_config(experiment_file(experiment))
    if overrides:
        config = OmegaConf.merge(config, OmegaConf.from_dotlist(list(overrides)))
    node = config.get("page")
    page = OmegaConf.to_container(node) if node is not None else {}
    params = OmegaConf.select(config, "hydra.sweeper.params") or {}
    paper = page.get("paper")
    expected = (page.get("expected") or {}).get(budget)
    try:
        return StudyPage(
            experiment,
            budget,
            title=page.get("title", StudyPage.title),
            metrics=_strings(page.get("metric")),
            references=_strings(page.get("reference")),
            notes=((page.get("notes") or {}).get(budget) or "").strip(),
            paper=PaperFigures(paper["source"], paper["metric"], bool(paper.get("error")), paper["figures"])
            if paper
            else None,
            expected=_expected(expected) if expected else None,
            sections=list(page.get("sections") or []),
            claims=tuple(Claim(c["claim"], c["holds"]) for c in (page.get("claims") or {}).get(budget) or []),
            functions=_strings(page.get("functions")),
            # The keys the sweep sets, and the groups the study needs chosen (+routing=<name>): the study's own.
            swept=(*(override_key(str(name)) for name in params), *(config.get("requires") or [])),
            lead_figure=page.get("lead_figure"),
            answer=page.get("answer"),
            exploratory=page.get("exploratory"),
            verdicts_setting=((page.get("verdicts") or {}).get("setting") or {}).get(budget),
            differences=bool(page.get("differences", True)),
            hypotheses=(
                *(_hypothesis(node) for node in page.get("hypotheses") or []),
                *_verdicts(page.get("verdicts"), budget),
            ),
        )
    except ConfigError as error:  # a routing its verdicts name, not installed here
        raise ConfigError(f"{shown(experiment_file(experiment))}, page.verdicts.routings: {error}") from error
    except (KeyError, TypeError, ValueError) as error:
        raise ConfigError(f"{shown(experiment_file(experiment))}: its page is malformed ({error!r})") from error


def _verdicts(node: dict | None, budget: str) -> tuple[Hypothesis, ...]:
    """The ``verdicts`` of a page of several routings (experiment=routing_reference): the hypotheses of
    the page ``hypotheses_of`` (a routing's verdict) asked of each of ``routings``, its arms' own cells
    in the verdict's arms' place (:func:`capsexp.config.verdict_arms.cell_name`), each routing a family."""
    if not node:
        return ()
    from capsexp.config.verdict_arms import cell_name
    from capsexp.overrides import left_side, written

    def cell(override: str, routing: str) -> str:
        return f"{left_side(override)}={cell_name(routing, written(override))}"

    asked = load_study_page(node["hypotheses_of"], budget).hypotheses
    return tuple(
        replace(
            judged(hypothesis, routing),
            name=f"{routing}: {hypothesis.name}",
            arm=cell(hypothesis.arm, routing),
            reference=cell(hypothesis.reference, routing),
            family=routing,
        )
        for routing in node["routings"]
        for hypothesis in asked
    )


def judged(hypothesis: Hypothesis, routing: str) -> Hypothesis:
    """``hypothesis`` of a routing's verdict, its arms named as the verdict's (``+arm/routing_verdict=shuffled``),
    with the reason the runs cannot answer it for ``routing`` where its arms differ in more than it asks
    (:func:`~capsexp.config.verdict_arms.second_change`)."""
    from capsexp.config.verdict_arms import second_change
    from capsexp.overrides import written

    reason = second_change(routing, written(hypothesis.arm)) or second_change(routing, written(hypothesis.reference))
    return replace(hypothesis, not_judged=reason) if reason else hypothesis


def page_for(runs: list) -> StudyPage:
    """The page of the runs' experiment and budget (:class:`~capsexp.results.runs.Run`), when they share
    one; a plain page otherwise."""
    experiments = {run.choice("experiment") for run in runs}
    budgets = {run.choice("study") for run in runs}
    if len(experiments) != 1 or len(budgets) != 1:
        return StudyPage()
    shared = set.intersection(*(set(run.overrides) for run in runs)) if runs else set()
    overrides = [o for o in runs[0].overrides if o in shared and override_key(o).startswith("page.")]
    page = load_study_page(*experiments, *budgets, overrides=overrides)
    routings = {run.choice("routing") for run in runs}
    if "routing" in page.swept and len(routings) == 1 and None not in routings:  # a verdict: +routing=<name>
        page = replace(page, hypotheses=tuple(judged(h, *routings) for h in page.hypotheses))
    # A confirmatory reading needs every run at one clean commit on one machine: else its tests are
    # exploratory, and say why (the config's own reason, where it gives one, already covers its runs).
    if page.exploratory is None and (mixed := mixed_provenance(runs)):
        page = replace(page, exploratory=mixed)
    return page
