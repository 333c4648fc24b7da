"""One labelled figure per image: what a trained model computed for it.

For a capsule model: the input, the reconstruction from the predicted class capsule (models with a
decoder), the class scores as bars (capsule lengths, EM activations, ...), the pose perturbation of
the predicted capsule (Sabour et al. 2017, Fig. 4: a row per pose dimension, a column per tweak, the
paper's steps, :data:`~capsexp.figures.images.PERTURBATION_STEPS`), and the last
routing layer's couplings (or EM responsibilities) of this image's children to each class, on the
children's grid. Other models: the input and the scores. Each panel's axes is labelled by what it
shows (``Axes.get_label``: ``input``, ``reconstruction``, ``scores``, ``pose_perturbation``,
``couplings/<class>``), so that tests read the figure back.
"""

from __future__ import annotations

import numpy as np
import torch
from matplotlib.figure import Figure
from torchvision.utils import make_grid

from capsexp.figures.couplings import draw_coupling_maps, position_maps
from capsexp.figures.images import (
    PERTURBATION_DELTA,
    PERTURBATION_STEPS,
    displayable,
    overlaid,
    perturbed_reconstructions,
)
from capsexp.use.inference import Predictions, TrainedModel, child_grid


def shown_image(image: torch.Tensor) -> np.ndarray:
    """(C, H, W) -> (H, W) or (H, W, 3) for ``imshow``: a standardised input rescaled to [0, 1] (its own
    range), a stereo pair side by side."""
    image = image.float()
    if image.min() < 0 or image.max() > 1:
        image = (image - image.min()) / (image.max() - image.min()).clamp_min(1e-8)
    image = displayable(image[None])[0]
    return (image[0] if image.shape[0] == 1 else image.permute(1, 2, 0)).numpy()


def explain_figure(model: TrainedModel, predictions: Predictions, index: int, title: str) -> Figure:
    """The figure of image ``index`` of ``predictions`` (see the module's docstring), titled ``title``."""
    classes = predictions.classes[index].reshape(-1)
    predicted = int(classes[0])
    names = predictions.class_names
    capsules = predictions.poses is not None
    figure = Figure(figsize=(13, 9.5 if capsules else 3.6), layout="constrained")
    absent = predictions.present is not None and not bool(predictions.present[index])
    if absent:  # the best class is no prediction: its score is below what counts as present
        best = float(predictions.scores[index].max())
        figure.suptitle(
            f"{title}: {model.absent_text} (the best, {names[predicted]}, at {best:.3f}; present from "
            f"{model.presence_threshold:g})",
            fontsize=12,
        )
    else:
        figure.suptitle(f"{title}: predicted {predictions.names[index]}", fontsize=12)
    top, bottom = figure.subfigures(2, 1, height_ratios=[1, 1.35]) if capsules else (figure, None)

    decoder = predictions.reconstructions is not None
    panels = top.subplots(1, 3 if decoder else 2, width_ratios=[1, 1, 2.4] if decoder else [1, 2.4])
    ax = panels[0]
    ax.imshow(shown_image(predictions.inputs[index]), cmap="gray", interpolation="nearest")
    ax.set_title("input (as the net sees it)", fontsize=9)
    ax.set_label("input")
    ax.set_xticks([]), ax.set_yticks([])
    if decoder:
        reconstruction = predictions.reconstructions[index]
        if reconstruction.ndim == 4:  # one per object, overlaid in colours
            reconstruction = overlaid(reconstruction[None])[0]
        ax = panels[1]
        ax.imshow(shown_image(reconstruction), cmap="gray", interpolation="nearest", vmin=0, vmax=1)
        ax.set_title(f"reconstruction from {names[predicted]}'s capsule", fontsize=9)
        ax.set_label("reconstruction")
        ax.set_xticks([]), ax.set_yticks([])
    ax = panels[-1]
    scores = predictions.scores[index]
    chosen = [] if absent else classes.tolist()
    colours = ["tab:red" if j in chosen else "tab:gray" for j in range(len(scores))]
    ax.barh(range(len(scores)), scores.numpy(), color=colours)
    ax.set_yticks(range(len(scores)), names, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(predictions.score_kind)
    if model.presence_threshold is not None:
        ax.axvline(model.presence_threshold, color="black", linestyle=":", linewidth=1)
    ax.set_title(
        f"class scores (none reaches the dotted line: {model.absent_text})"
        if absent
        else "class scores (predicted in red)"
        + (", a class is present from the dotted line" if model.presence_threshold is not None else ""),
        fontsize=9,
    )
    ax.set_label("scores")
    if predictions.score_kind != "EM activation" and "probability" not in predictions.score_kind:
        ax.set_xlim(0, max(1.0, float(scores.max())))

    if bottom is not None:
        _capsule_panels(model, predictions, index, predicted, bottom)
    return figure


def _capsule_panels(model: TrainedModel, predictions: Predictions, index: int, predicted: int, bottom) -> None:
    names = predictions.class_names
    couplings = predictions.couplings
    grid = child_grid(model.net, model.routing_layer[1]) if model.routing_layer and couplings is not None else None
    decoder = getattr(model.net, "decoder", None) is not None
    parts = bottom.subfigures(1, 2, width_ratios=[1, 1.3]) if decoder and grid else [bottom]
    if decoder:
        inputs = predictions.inputs[index : index + 1].to(model.device)
        perturbed = perturbed_reconstructions(model.net, inputs, PERTURBATION_STEPS, PERTURBATION_DELTA)[0].cpu()
        pose_dim = perturbed.shape[0]
        tiles = displayable(perturbed.flatten(0, 1))
        grid_image = make_grid(tiles, nrow=PERTURBATION_STEPS, padding=1, pad_value=0.5)
        ax = parts[0].subplots()
        ax.imshow(grid_image.permute(1, 2, 0).numpy(), interpolation="nearest")
        ax.set_title(f"{names[predicted]}'s capsule, each pose dimension tweaked", fontsize=9)
        ax.set_label("pose_perturbation")
        # Ticks at the tiles' centres (make_grid: a 1-pixel border before each tile): rows are the pose
        # dimensions, numbered from 1; columns the tweaks, its ends and middle labelled.
        height, width = tiles.shape[-2:]
        rows = [1 + r * (height + 1) + height / 2 for r in range(pose_dim)]
        ax.set_yticks(rows, [str(d + 1) for d in range(pose_dim)], fontsize=7)
        ax.set_ylabel("pose dimension", fontsize=8)
        deltas = torch.linspace(-PERTURBATION_DELTA, PERTURBATION_DELTA, PERTURBATION_STEPS)
        shown = sorted({0, PERTURBATION_STEPS // 2, PERTURBATION_STEPS - 1})
        ax.set_xticks(
            [1 + c * (width + 1) + width / 2 for c in shown],
            ["0" if abs(float(deltas[c])) < 1e-6 else f"{float(deltas[c]):+.2f}" for c in shown],
            fontsize=7,
        )
        ax.set_xlabel("added to the dimension", fontsize=8)
    if grid:
        types, innermost = grid
        maps = position_maps(couplings[index : index + 1], types, innermost)[0]
        layer_name = model.routing_layer[0]
        quantity = "responsibility" if model.score_kind == "EM activation" else "coupling"
        target = parts[-1]
        target.suptitle(f"{layer_name}: each child's {quantity} to each class (predicted in bold)", fontsize=9)
        where = "child position" if innermost else "primary capsule\nposition"
        draw_coupling_maps(target, maps, names, f"{quantity}, mean over child types", where, 5, predicted)
