"""What a comparison shows of a capsule model's insides, where its runs logged them: the presence
scores (:class:`capsexp.lit.Classifier`: the median over the validation images of the target class's
score, of the largest other's, and of their gap) and, per routing layer, the entropy of the routing
assignments and the spread of each parent capsule's activation across inputs
(:class:`capsexp.callbacks.RoutingDiagnostics`). Accuracy alone does not say that activations signal
presence or that routing routes."""

from __future__ import annotations

import re

from capsexp.records.metric_names import presence_metric
from capsexp.results.runs import Configuration

_ROUTING = re.compile(r"^routing/(?P<layer>[^/]+)/(?P<measure>entropy|activation_std_across_inputs)$")
# capsexp.callbacks.RoutingFigures: how much the assignment moved at iteration r (r >= 2), per validation.
_COUPLING_CHANGE = re.compile(r"^routing/(?P<layer>[^/]+)/coupling_change_iter(?P<iteration>\d+)$")
PRESENCE = {name: presence_metric(name) for name in ("gap", "target", "largest_other")}


def _mean_std(configuration: Configuration, tag: str) -> str:
    summary = configuration.summary(tag)
    return summary.text() if summary else ""


def _last_coupling_change(configuration: Configuration, layer: str) -> str:
    """The assignment's change at the layer's last iteration (its last validation), mean over the runs."""
    found = [
        (int(m["iteration"]), tag)
        for tag in dict.fromkeys(tag for run in configuration.runs for tag in run.scalars)
        if (m := _COUPLING_CHANGE.match(tag)) and m["layer"] == layer
    ]
    if not found:
        return ""
    iteration, tag = max(found)
    summary = configuration.summary(tag)
    return f"{summary.mean:.2g} (iteration {iteration})" if summary else ""


def diagnostics_section(configurations: list[Configuration]) -> str:
    """A table, one row per configuration: the presence gap (target - largest other) and, per routing
    layer in the order logged, the last entropy and activation spread across inputs, mean ± std over
    runs, and where logged the change of the assignment at the last iteration; empty where no run logged
    them."""
    tags = list(dict.fromkeys(tag for c in configurations for run in c.runs for tag in run.scalars))
    layers = list(dict.fromkeys(m["layer"] for tag in tags if (m := _ROUTING.match(tag))))
    settling = list(dict.fromkeys(m["layer"] for tag in tags if (m := _COUPLING_CHANGE.match(tag))))
    presence = PRESENCE["gap"] in tags
    if not layers and not presence:
        return ""
    header = ["configuration"]
    if presence:
        header += ["presence gap", "target / largest other"]
    header += [f"{layer}: entropy" for layer in layers] + [f"{layer}: spread across inputs" for layer in layers]
    header += [f"{layer}: coupling change at the last iteration" for layer in settling]
    lines = ["| " + " | ".join(header) + " |", "| --- |" + " ---: |" * (len(header) - 1)]
    for configuration in configurations:
        cells = [configuration.label]
        if presence:
            cells.append(_mean_std(configuration, PRESENCE["gap"]))
            target, other = (_mean_std(configuration, PRESENCE[name]) for name in ("target", "largest_other"))
            cells.append(f"{target} / {other}" if target and other else "")
        cells += [_mean_std(configuration, f"routing/{layer}/entropy") for layer in layers]
        cells += [_mean_std(configuration, f"routing/{layer}/activation_std_across_inputs") for layer in layers]
        cells += [_last_coupling_change(configuration, layer) for layer in settling]
        lines.append("| " + " | ".join(cells) + " |")
    return (
        "## Presence and routing\n\n"
        "The last values logged, mean ± std over the runs: the presence scores of the last validation, the "
        "routing measures of the last training step that logged them. Presence gap: the median over the "
        "validation images of the target class's score minus the largest other's (scores that signal "
        "presence keep it well above 0). Entropy: of each child's routing assignment over its parents, "
        "normalised (1 uniform: no routing; 0 each child to one parent). Spread across inputs: the std of each "
        "parent capsule's activation across a batch's images, averaged over capsules (near 0: the capsule "
        "ignores its input)."
        + (
            " Coupling change at the last iteration: the mean absolute change of the assignment from the "
            "iteration before to the last, on the last validation's first images, mean over the runs (near 0: "
            "routing has settled, or never moved)."
            if settling
            else ""
        )
        + "\n\n"
        + "\n".join(lines)
        + "\n"
    )
