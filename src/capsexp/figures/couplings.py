"""Routing couplings on the children's grid: per class (averaged over a class's images) or per image,
as heat maps on one diverging scale centred at the uniform share 1/J."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from matplotlib.figure import Figure, SubFigure

from capsexp.nn.functional import shares


def class_coupling_maps(
    couplings: torch.Tensor, labels: torch.Tensor, num_types: int, types_innermost: bool = False
) -> torch.Tensor:
    """(J, S, S): for each class j, the mean over the images of class j of c_ij (couplings (B, I, J),
    children type-major over a square S x S grid, or numbered (h, w, type) with ``types_innermost``, as
    EM class capsules number them), averaged over the types; NaN for a class with no image among them."""
    per_position = position_maps(couplings, num_types, types_innermost)  # (B, J, S, S)
    one_hot = F.one_hot(labels, couplings.shape[-1]).to(per_position.dtype)  # (B, J)
    counts = one_hot.sum(dim=0)
    maps = torch.einsum("bjxy,bj->jxy", per_position, one_hot) / counts[:, None, None]  # 0/0 = NaN: no image
    return maps.float().cpu()


def position_maps(couplings: torch.Tensor, num_types: int, types_innermost: bool = False) -> torch.Tensor:
    """(B, J, S, S): each image's couplings (B, I, J) to each class j, averaged over the child types at each
    position of the children's square S x S grid (children type-major, or numbered (h, w, type) with
    ``types_innermost``, as EM class capsules number them). Couplings are read as each child's shares
    (a routing's that do not sum to one over the classes included)."""
    couplings = shares(couplings)
    batch, children, classes = couplings.shape
    side = math.isqrt(children // num_types)
    if types_innermost:
        return couplings.view(batch, side, side, num_types, classes).mean(dim=3).permute(0, 3, 1, 2)
    return couplings.view(batch, num_types, side, side, classes).mean(dim=1).permute(0, 3, 1, 2)


def coupling_figure(
    maps: torch.Tensor,
    class_names: Sequence[str],
    quantity: str = "mean coupling to the class",
    grid: str = "primary capsule\nposition",
) -> Figure:
    """One heat map per class (titled by its name) over the children's grid (``grid``), on one
    diverging colour scale centred at the uniform share 1/J, with a colour bar naming ``quantity``."""
    columns = min(maps.shape[0], 5)
    figure = Figure(figsize=(1.9 * columns + 1.2, 2.0 * math.ceil(maps.shape[0] / columns)), layout="constrained")
    draw_coupling_maps(figure, maps, class_names, quantity, grid, columns)
    return figure


def draw_coupling_maps(
    figure: Figure | SubFigure,
    maps: torch.Tensor,
    class_names: Sequence[str],
    quantity: str,
    grid: str,
    columns: int = 5,
    highlight: int | None = None,
) -> None:
    """:func:`coupling_figure`'s heat maps drawn into ``figure`` (a figure or a sub-figure), ``columns``
    per row; the class ``highlight`` (a prediction) titled in bold. Each map's axes is labelled
    ``couplings/<class name>`` (``Axes.get_label``), so that a test can find it."""
    classes = maps.shape[0]
    uniform = 1.0 / classes
    reach = float((maps - uniform).abs().nan_to_num(0).amax().clamp_min(1e-6))
    columns = min(classes, columns)
    rows = math.ceil(classes / columns)
    axes = figure.subplots(rows, columns, squeeze=False)
    for j, ax in enumerate(axes.flat):
        if j >= classes:
            ax.set_axis_off()
            continue
        shown = ax.imshow(maps[j].numpy(), cmap="RdBu_r", vmin=uniform - reach, vmax=uniform + reach)
        seen = not torch.isnan(maps[j]).all()
        ax.set_title(
            str(class_names[j]) if seen else f"{class_names[j]} (no image)",
            fontsize=9,
            fontweight="bold" if j == highlight else "normal",
        )
        ax.set_label(f"couplings/{class_names[j]}")
        ax.set_xticks([]), ax.set_yticks([])
    axes[0, 0].set_ylabel(grid, fontsize=8)
    bar = figure.colorbar(shown, ax=axes, shrink=0.8)
    bar.set_label(f"{quantity} (uniform: 1/{classes})", fontsize=8)
