"""Every ``python -m capsexp`` command that the README and docs/ show composes and passes the config
check (one job of a sweep each; commands with placeholders, ``--help`` and ``--cfg`` are left out)."""

from __future__ import annotations

import re
import shlex

import pytest

from capsexp.config.config_check import config_problems
from capsexp.results.claims import A_PAPER as NAMES_A_PAPER
from capsexp.results.claims import HANDWRITTEN_FIGURE
from tests.helpers import EXAMPLE, PROJECT_ROOT, compose_config, example_routings

PAGES = [PROJECT_ROOT / "README.md", *sorted((PROJECT_ROOT / "docs").glob("*.md"))]


def documented_commands() -> list[tuple[str, str]]:
    commands = []
    for page in PAGES:
        # A shell line continued with a backslash is one command; quotes are the shell's, not Hydra's.
        text = re.sub(r"\\\n\s*", " ", page.read_text())
        for line in re.findall(r"(?<!\$ )python -m capsexp ([^`\n#]*)", text):
            arguments = shlex.split(line)
            if not arguments or any("<" in a or a.startswith("--") or a in ("...", '"...")') for a in arguments):
                continue
            commands.append((page.name, " ".join(arguments)))
    return commands


def first_job(arguments: list[str]) -> list[str]:
    """A sweep's first job: ``-m`` dropped, each ``key=a,b`` as ``key=a``."""
    if "-m" not in arguments:
        return arguments
    return [a.split(",")[0] if "=" in a and "[" not in a else a for a in arguments if a != "-m"]


@pytest.mark.parametrize(("page", "command"), documented_commands())
def test_a_documented_command_composes_and_passes_the_check(page, command):
    from capsexp.config.routing_registry import registered

    overrides = first_job(command.split())
    named = {o.partition("=")[2] for o in overrides if o.partition("=")[0].lstrip("+").endswith("routing")}
    if named & example_routings() - set(registered()):
        # The command is documented for a user who installed the example (make examples), as CI does after
        # this suite; the example's own tests compose it then.
        pytest.skip(f"needs the example routing package installed ({EXAMPLE.relative_to(PROJECT_ROOT)})")
    assert config_problems(compose_config(overrides)) == [], f"{page}: python -m capsexp {command}"


def test_the_docs_show_commands():
    assert len(documented_commands()) >= 20


def test_a_documented_error_is_the_one_the_check_gives():
    """A ``$ python -m capsexp ...`` transcript followed by its error: the same lines today."""
    transcripts = [
        match
        for page in PAGES
        for match in re.findall(
            r"\$ python -m capsexp ([^\n]*)\n\nerror: invalid configuration:\n((?:  .*\n)+)", page.read_text()
        )
    ]
    assert transcripts
    for command, shown in transcripts:
        assert config_problems(compose_config(command.split())) == [line.strip() for line in shown.splitlines()]


def relative_links() -> list[tuple[str, str]]:
    """``(page, target)`` for every relative Markdown link of the README, docs/ and the results pages."""
    pages = [*PAGES, *sorted((PROJECT_ROOT / "experiments").rglob("*.md"))]
    links = []
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if not re.match(r"[a-z]+:", target) and not target.startswith("#"):
                links.append((str(page.relative_to(PROJECT_ROOT)), target))
    return links


def test_every_relative_link_of_the_docs_resolves():
    assert len(relative_links()) >= 30
    broken = []
    for page, target in relative_links():
        path = (PROJECT_ROOT / page).parent / target.split("#")[0]
        if not path.exists():
            broken.append(f"{page}: {target}")
    assert broken == []


# A docs page's quote of a results page: `<!-- quote experiments/results/<page>: <text> = <template> -->`,
# the template (Jinja, capsexp.results.claims) rendered over the page's kept runs must give the text,
# and the text must be on the docs page.
QUOTE = re.compile(r"<!-- quote (experiments/results/[\w.-]+): (.+?) = (.+?) -->")


def quotes() -> list[tuple[str, str, str, str]]:
    found = []
    for path in sorted([PROJECT_ROOT / "README.md", *(PROJECT_ROOT / "docs").glob("*.md")]):
        for page, text, template in QUOTE.findall(path.read_text()):
            found.append((path.name, page, text, template))
    return found


@pytest.mark.slow
def test_the_docs_quotes_of_results_pages_are_the_figures_of_their_runs():
    """Every quote, rendered from the runs kept beside its page: a figure that drifts from the runs (or a
    step that is not the last logged) fails here, naming the docs page and the quote."""
    from capsexp.results.claims import render_over_page

    found = quotes()
    assert len(found) >= 20  # docs/em_training.md quotes its pages' figures so
    by_page: dict[str, str] = {}
    for doc, page, text, template in found:
        rendered = render_over_page(PROJECT_ROOT / page, template)
        assert rendered == text, f"{doc}: quoted {text!r}, the runs of {page} give {rendered!r}"
        body = by_page.setdefault(
            doc,
            QUOTE.sub(
                "",
                next(
                    p for p in [PROJECT_ROOT / "README.md", *(PROJECT_ROOT / "docs").glob("*.md")] if p.name == doc
                ).read_text(),
            ),
        )
        assert text in " ".join(body.split()), f"{doc}: the quote {text!r} is not in its text"


# A time the README or docs give: `<!-- time <file>: <text> -->` names where it was measured (a results
# page, which must hold the text) or set (a source file, which must hold its numbers), and a `quote`
# may give it from a page's runs. A time in their prose that neither names is a figure nobody measured.
TIMED = re.compile(r"<!-- time ([\w./-]+): (.+?) -->")
A_TIME = re.compile(r"(?<![\w.])\d[\d.,]*(?: (?:to|and) \d[\d.,]*)? ?(?:ms|s|min|minutes|seconds|hours?)\b")


def flat(text: str) -> str:
    return " ".join(text.split())


def test_every_time_the_readme_and_docs_give_names_the_page_or_setting_it_comes_from():
    timed = 0
    for path in sorted([PROJECT_ROOT / "README.md", *(PROJECT_ROOT / "docs").glob("*.md")]):
        text = path.read_text()
        prose = flat(re.sub(r"<!--.*?-->", "", text, flags=re.S))
        sourced = [quoted for _, quoted in TIMED.findall(text)] + [quoted for _, quoted, _ in QUOTE.findall(text)]
        for source, quoted in TIMED.findall(text):
            timed += 1
            assert quoted in prose, f"{path.name}: the time {quoted!r} is not in its text"
            held = flat((PROJECT_ROOT / source).read_text())
            if source.endswith(".md"):  # the whole figure: "1 s" is not the end of "11 s"
                assert re.search(rf"(?<![\w.]){re.escape(quoted)}(?![\w.])", held), f"{source} does not say {quoted!r}"
            else:
                for number in re.findall(r"\d+(?:\.\d+)?", quoted):
                    assert re.search(rf"(?<![\d.]){re.escape(number)}(?:\.0)?(?![\d.])", held), (
                        f"{path.name}: {source} sets no {number} ({quoted!r})"
                    )
        for found in A_TIME.finditer(prose):
            assert any(found.group(0) in quoted for quoted in sourced), (
                f"{path.name}: {found.group(0)!r} ({prose[max(found.start() - 60, 0) : found.end() + 20]!r}) names "
                f"no page that measured it: add <!-- time <page>: <text> --> or a quote of a page's runs"
            )
    assert timed >= 8


def config_groups() -> dict[str, list[str]]:
    """Every config group a user chooses from (not Hydra's own, not a study's arms) and its options, as
    `python -m capsexp --help` lists them: conf/'s folders and the options stored in code."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from capsexp.config import hydra_setup
    from capsexp.locations import CONFIG_DIR

    hydra_setup.register()
    found = {}
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        pending = [""]
        while pending:
            prefix = pending.pop()
            for group in loader.list_groups(prefix):
                name = f"{prefix}/{group}" if prefix else group
                if name.startswith(("hydra", "arm")):
                    continue
                found[name] = loader.get_group_options(name)
                pending.append(name)
    return found


def test_the_docs_table_of_config_groups_lists_every_group_and_option():
    """docs/running.md's table: a group or an option added to conf/ (or stored in code) without a word
    in the table fails here, naming it."""
    table = {}
    for line in (PROJECT_ROOT / "docs" / "running.md").read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`") and cells[0].endswith("`"):
            table[cells[0].strip("`")] = set(re.findall(r"`([^`]+)`", cells[1]))
    from capsexp.config.routing_registry import built_in, registered

    groups = config_groups()
    assert sorted(set(groups) - set(table)) == [], "config groups missing from docs/running.md's table"
    from capsexp.locations import config_folders

    # Installed packages' routings and configs (their conf/ folders): their docs are their own.
    others = set(registered()) - set(built_in())
    for group, options in groups.items():
        theirs = {path.stem for folder in config_folders()[1:] for path in (folder / group).glob("*.yaml")}
        theirs |= others if group in ("model/routing", "arm/routing", "routing") else set()
        missing = sorted(set(options) - table[group] - theirs)
        assert not missing, f"docs/running.md's table: {group} lacks {', '.join(missing)}"


# A result's figure in the README, the docs or a config's comment: a percentage, points or nats with a
# decimal, or a p-value. In the README and docs each is a quote of a page's runs, a time a page measured,
# or `<!-- source <file or paper>: <text> -->` for a setting (the file must hold its number) or a paper's
# figure; in a config's comments a figure is a setting of that file (its number, or its hundredth, among the
# file's values) or a paper's (the comment names it). A figure copied from a page drifts from it unseen.
A_FIGURE = HANDWRITTEN_FIGURE  # what a page's notes may not type by hand, the same outside the pages
SOURCED = re.compile(r"<!-- source ([^:]+): (.+?) -->")


def unbound_figures(text: str) -> list[str]:
    """The figures of a README or docs page's prose that no quote, time or source marker gives."""
    prose = flat(re.sub(r"<!--.*?-->|```.*?```", "", text, flags=re.S))  # examples in code blocks are no results
    given = [quoted for _, quoted in TIMED.findall(text)] + [quoted for _, quoted, _ in QUOTE.findall(text)]
    given += [quoted for _, quoted in SOURCED.findall(text)]
    return [
        found.group(0)
        for found in A_FIGURE.finditer(prose)
        if not any(re.search(r"\d+\.\d+", found.group(0)).group(0) in quoted for quoted in given)
    ]


def unbound_config_figures(text: str) -> list[str]:
    """The figures of a config file's comments that are neither its own settings nor a paper's."""
    values = set(re.findall(r"(?<![\w.])\d+(?:\.\d+)?(?![\w.])", re.sub(r"#.*", "", text)))
    found = []
    for line in text.splitlines():
        comment = line[line.index("#") :] if "#" in line else ""
        for figure in A_FIGURE.finditer(comment):
            number = re.search(r"\d+\.\d+", figure.group(0)).group(0)
            setting = {number, f"{float(number) / 100:g}", number.rstrip("0").rstrip(".")} & values
            if not setting and not NAMES_A_PAPER.search(comment):
                found.append(figure.group(0))
    return found


def test_every_source_marker_that_names_a_file_is_held_by_it():
    for path in [PROJECT_ROOT / "README.md", *sorted((PROJECT_ROOT / "docs").glob("*.md"))]:
        for source, text in SOURCED.findall(path.read_text()):
            if not (PROJECT_ROOT / source).is_file():
                continue  # a paper or another project's page
            held = (PROJECT_ROOT / source).read_text()
            for number in re.findall(r"\d+\.\d+", text):
                forms = {number, f"{float(number) / 100:g}"}
                assert any(re.search(rf"(?<![\d.]){re.escape(f)}(?![\d])", held) for f in forms), (
                    f"{path.name}: {source} holds no {number} ({text!r})"
                )


def test_every_result_figure_outside_the_pages_is_bound_to_them():
    unbound = {
        path.relative_to(PROJECT_ROOT).as_posix(): found
        for path in [PROJECT_ROOT / "README.md", *sorted((PROJECT_ROOT / "docs").glob("*.md"))]
        if (found := unbound_figures(path.read_text()))
    }
    unbound |= {
        path.relative_to(PROJECT_ROOT).as_posix(): found
        for path in sorted((PROJECT_ROOT / "conf").rglob("*.yaml"))
        if (found := unbound_config_figures(path.read_text()))
    }
    assert unbound == {}, f"figures that no page's runs, setting or paper gives: {unbound}"


def test_a_figure_copied_from_a_page_and_rounded_is_caught():
    """The VB recipe's page gives 54.05: its docs quote it bound; written as 54.1 by hand it is unbound."""
    from capsexp.results.claims import render_over_page

    page = PROJECT_ROOT / "experiments/results/vb_em_caps_lr_quick"
    bound = "{{ summary('val/acc_best', 'model.optimizer.lr=0.01').mean_text }}"
    assert render_over_page(page, bound) == "54.05"
    quoted = (
        f"at 1e-2 <!-- quote experiments/results/vb_em_caps_lr_quick: 54.05 = {bound} -->54.05% validation accuracy"
    )
    assert unbound_figures(quoted) == []
    assert unbound_figures("at 1e-2 54.1% validation accuracy") == ["54.1%"]
    assert unbound_figures(quoted.replace("-->54.05%", "-->54.1%")) == ["54.1%"]
    assert unbound_config_figures("# reached 54.1% against 82.0%\nlr: 0.003\n") == ["54.1%", "82.0%"]
    assert unbound_config_figures("# stop at 99.2% as the authors did\nstop_at: 0.992\n") == []


def test_a_bound_quote_whose_runs_change_no_longer_renders_its_text(tmp_path):
    """The docs' quote of the VB page's 54.05, rendered over a copy of its runs with one seed's accuracy
    changed: the text differs, so the quote test above fails naming the doc and the quote."""
    import shutil

    from capsexp.results.claims import render_over_page
    from tests.test_claims import rewrite_scalar

    page = PROJECT_ROOT / "experiments/results/vb_em_caps_lr_quick"
    _, _, text, template = next(q for q in quotes() if q[1] == "experiments/results/vb_em_caps_lr_quick")
    assert render_over_page(page, template) == text
    shutil.copytree(page / "runs", tmp_path / "runs")
    run = next(
        folder.parent.parent  # <run>/.hydra/overrides.yaml
        for folder in sorted((tmp_path / "runs").rglob("overrides.yaml"))
        if "model.optimizer.lr=0.01" in folder.read_text()
    )
    rewrite_scalar(run, "val/acc_best", 0.99)
    assert render_over_page(tmp_path, template) != text
