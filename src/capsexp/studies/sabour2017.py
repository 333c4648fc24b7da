"""The dynamic-routing (CapsNet) studies' own steps and page sections, after Sabour, Frosst and Hinton
(2017), "Dynamic routing between capsules": the paper's Fig. 5 (reconstructions) and its Appendix A (how
routing settles over iterations)."""

from __future__ import annotations

import itertools
import logging
import statistics
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.tensorboard import SummaryWriter

from capsexp.config.instantiation import instantiate
from capsexp.nn import DynamicRouting, RoutingCapsules
from capsexp.records.checkpoints import model_of_run
from capsexp.records.events import event_folder, load_events
from capsexp.records.metric_names import RECONSTRUCTIONS
from capsexp.results.runs import Configuration, Run, find_runs, group
from capsexp.results.study import StudyPage, matches

log = logging.getLogger("capsexp")


STRIP_SCALE = 3  # the page shows a logged image strip this many times its size, pixels kept square


def _labelled_strip(png: bytes, path: Path, title: str) -> None:
    """The logged grid (inputs above reconstructions), enlarged with its pixels kept sharp, its rows named."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.image
    import matplotlib.pyplot as plt

    pixels = matplotlib.image.imread(io.BytesIO(png), format="png")
    height, width = pixels.shape[:2]
    dpi = 100
    figure, axes = plt.subplots(figsize=(STRIP_SCALE * width / dpi + 1.6, STRIP_SCALE * height / dpi + 0.5), dpi=dpi)
    axes.imshow(pixels, interpolation="nearest")
    axes.set_xticks([])
    axes.set_yticks(
        [height / 4, 3 * height / 4],
        ["inputs", "reconstructions\n(red, green: the\ntwo longest capsules)"],
        fontsize="small",
    )
    axes.tick_params(length=0)
    axes.set_title(title, fontsize="small")
    figure.savefig(path, dpi=dpi, bbox_inches="tight")
    plt.close(figure)


def reconstructions(runs: list[Run], page: StudyPage, output: Path) -> str:
    """The paper's Fig. 5: the last validation's reconstructions of the first run of the reference
    configuration (else of the first configuration that logged them), written as ``reconstructions.png``."""
    configurations = group(runs)
    ordered = sorted(
        configurations, key=lambda c: not (page.reference and matches(page.reference, c.runs[0].overrides))
    )
    for configuration in ordered:
        for run in configuration.runs:
            events = load_events(run.folder, images=0)
            if RECONSTRUCTIONS not in events.Tags()["images"]:
                continue
            image = events.Images(RECONSTRUCTIONS)[-1]
            seed = f", seed {run.seed}" if run.seed is not None else ""
            _labelled_strip(
                image.encoded_image_string,
                output / "reconstructions.png",
                f"{configuration.label}{seed}, step {image.step}",
            )
            return (
                "## Reconstructions (the paper's Fig. 5)\n\n"
                f"`{configuration.label}`{seed}, at step {image.step}: validation inputs (top row) above each "
                "digit reconstructed from its own capsule (the two longest), in red and green, overlaid "
                f"(bottom row), shown {STRIP_SCALE} times the size logged.\n\n![reconstructions](reconstructions.png)\n"
            )
    return ""


CONVERGENCE = "routing_convergence"  # tags routing_convergence/<layer>/<measure>, logged at step = iteration
IMAGES = f"{CONVERGENCE}/images"  # how many validation images were routed
MEASURES = ("logit_change", "update_change", "coupling_change")  # RoutingTrace's measures, in its order


@dataclass
class RoutingConvergence:
    """After the sweep: how dynamic routing settles in each trained CapsNet (Sabour et al. 2017,
    Appendix A). Each run's best checkpoint routes its digit capsules' votes on the first ``images``
    validation images for ``iterations`` iterations (whatever the run trained with), and
    :func:`~capsexp.nn.functional.dynamic_routing_trace`'s measures of each iteration go into the run's
    event files as ``routing_convergence/<layer>/<measure>`` at step = iteration."""

    iterations: int = 10
    images: int = 1000

    def __call__(self, folder: Path) -> None:
        for run in find_runs(folder):
            if any(tag.startswith(f"{CONVERGENCE}/") for tag in run.scalars):
                continue  # traced before
            inputs = _routed_inputs(run.folder, self.images)
            if not inputs:
                continue  # no dynamic-routing layer
            # Logged at the run's last logged time, so that the run's span stays its training time.
            events = load_events(run.folder)
            wall_time = max(e.wall_time for tag in events.Tags()["scalars"] for e in events.Scalars(tag))
            writer = SummaryWriter(str(event_folder(run.folder)), filename_suffix=f".{CONVERGENCE}")
            writer.add_scalar(IMAGES, len(next(iter(inputs.values()))[1]), 0, walltime=wall_time)
            for name, (layer, children) in inputs.items():
                trace = layer.dynamic_routing_trace(children, self.iterations)
                for measure, values in zip(MEASURES, trace[1:], strict=True):
                    first = self.iterations - len(values) + 1  # the changes between iterations start at 2
                    for iteration, value in enumerate(values.tolist(), start=first):
                        writer.add_scalar(f"{CONVERGENCE}/{name}/{measure}", value, iteration, walltime=wall_time)
            writer.close()
            log.info(f"Routing convergence traced: {run.folder} ({', '.join(inputs)})")


def _routed_inputs(run: Path, images: int) -> dict[str, tuple[RoutingCapsules, torch.Tensor]]:
    """{layer name: (the layer, its input capsules)} for each dynamic-routing layer of the run's best
    checkpoint (its last, when it saved no other), on the first ``images`` validation images of the run's
    data: the layer traces its own routing (:meth:`RoutingCapsules.dynamic_routing_trace`)."""
    trained = model_of_run(run, str(run))
    module, cfg = trained.module, trained.config
    layers = {
        name: m
        for name, m in module.net.named_modules()
        if isinstance(m, RoutingCapsules) and isinstance(m.routing, DynamicRouting)
    }
    if not layers:
        return {}
    datamodule = instantiate("data", cfg.data)
    datamodule.prepare_data()
    datamodule.setup("fit")
    captured: dict[str, list[torch.Tensor]] = {name: [] for name in layers}
    hooks = [
        layer.register_forward_hook(lambda m, inputs, _, name=name: captured[name].append(inputs[0]))
        for name, layer in layers.items()
    ]
    seen = 0
    with torch.no_grad():
        for batch in datamodule.val_dataloader():
            images_in_batch = datamodule.on_after_batch_transfer(batch, 0)[0]
            module.eval()(images_in_batch)
            seen += len(images_in_batch)
            if seen >= images:
                break
    for hook in hooks:
        hook.remove()
    return {name: (layers[name], torch.cat(children)[:images]) for name, children in captured.items()}


def _mean_series(configuration: Configuration, tag: str) -> dict[int, float]:
    """{iteration: the mean over the configuration's runs} of one traced measure."""
    by_step: dict[int, list[float]] = {}
    for run in configuration.runs:
        for step, value in run.scalars.get(tag, []):
            by_step.setdefault(step, []).append(value)
    return {step: statistics.fmean(values) for step, values in sorted(by_step.items())}


def routing_convergence(runs: list[Run], page: StudyPage, output: Path) -> str:
    """Appendix A's measurement: per configuration (the mean over its runs), layer and iteration, the
    update change |u_hat_j|i . (v_j^(r) - v_j^(r-1))|, 0 once the parents stop moving; and whether it
    falls at every iteration, beside what the logit change and the coupling change do meanwhile."""
    images = 0
    rows: dict[str, dict[str, dict[int, float]]] = {}  # "configuration, layer" -> measure -> iteration -> mean
    for configuration in group(runs):
        for tag in sorted({t for run in configuration.runs for t in run.scalars if t.startswith(f"{CONVERGENCE}/")}):
            if tag == IMAGES:
                images = int(configuration.runs[0].scalars[tag][-1].value)
                continue
            _, layer, measure = tag.split("/")
            rows.setdefault(f"{configuration.label}, {layer}", {})[measure] = _mean_series(configuration, tag)
    if not rows:
        return ""
    iterations = sorted({step for series in rows.values() for step in series["update_change"]})
    names = list(rows)
    table = [
        "| iteration | " + " | ".join(f"`{name}`" for name in names) + " |",
        "| ---: |" + " ---: |" * len(names),
        *(
            f"| {r} | " + " | ".join(f"{rows[name]['update_change'].get(r, float('nan')):.3g}" for name in names) + " |"
            for r in iterations
        ),
    ]
    findings = []
    for name, measures in rows.items():
        # Each measure from the first iteration with an update change (2) to the last.
        updates, logits, couplings = (
            [measures[measure][r] for r in iterations]
            for measure in ("update_change", "logit_change", "coupling_change")
        )
        falls = all(later < earlier for earlier, later in itertools.pairwise(updates))
        findings.append(
            f"- `{name}`: the update change {'falls' if falls else 'does not fall'} at every iteration from "
            f"{iterations[0]} to {iterations[-1]} ({updates[0]:.3g} to {updates[-1]:.3g}, a factor "
            f"{updates[0] / updates[-1]:.3g}); meanwhile the logit change goes from {logits[0]:.3g} to "
            f"{logits[-1]:.3g} and the coupling change from {couplings[0]:.3g} to {couplings[-1]:.3g}."
        )
    return (
        "## How routing settles (the paper's Appendix A)\n\n"
        f"Each run's best checkpoint routes its digit capsules' votes on the first {images:,} validation "
        f"images for iterations 1 to {iterations[-1]} (whatever it trained with). Means over images, primary "
        "capsules i, digit capsules j and the configuration's runs of the update change "
        "|u_hat_j|i . (v_j^(r) - v_j^(r-1))|: how much iteration r's addition to the routing logit b_ij "
        "differs from iteration r - 1's, 0 once the digit capsules stop moving. TensorBoard: "
        f"`{CONVERGENCE}/<layer>/update_change`, beside `logit_change` (the addition |u_hat_j|i . v_j^(r)| "
        "itself) and `coupling_change` (|c_ij^(r) - c_ij^(r-1)|).\n\n"
        + "\n".join(table)
        + "\n\n"
        + "\n".join(findings)
        + "\n\nThe paper (a CapsNet trained 500 epochs on MNIST) reports an average logit change of about 0.007 at "
        "iteration 2 that falls almost linearly in log scale, to about 1e-5 at iteration 5. Procedure 1 adds the "
        "agreement u_hat . v to b_ij at every iteration, so the logit change itself tends to the agreement of the "
        "settled digit capsules, not to 0; what can fall that way is the update change. A net trained far less "
        "than the paper's need not settle as fast.\n"
    )
