"""The routing contract's gradient checks in a few lines: autograd's Jacobian beside that of central
finite differences (:func:`jacobians`), and gradcheck's failure said as which gradient misses by how much
(:func:`gradcheck_summary`)."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import torch

INPUTS = ("votes", "children", "child activations")
OUTPUTS = ("poses", "activations", "assignment")


def jacobians(
    function: Callable[..., Sequence[torch.Tensor]], inputs: Sequence[torch.Tensor], index: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Autograd's and central finite differences' Jacobians of ``function``'s outputs (flattened, one
    after the other) with respect to ``inputs[index]``: (outputs, input elements), in the inputs' dtype."""
    inputs = [x.detach() for x in inputs]
    wanted = inputs[index].requires_grad_()
    with torch.enable_grad():
        outputs = torch.cat([y.reshape(-1) for y in function(*inputs)])
    autograds = torch.zeros(outputs.numel(), wanted.numel(), dtype=outputs.dtype)
    for row in range(outputs.numel()) if outputs.requires_grad else ():
        (gradient,) = torch.autograd.grad(outputs[row], wanted, retain_graph=True, allow_unused=True)
        if gradient is not None:
            autograds[row] = gradient.reshape(-1)
    numerical = torch.zeros_like(autograds)
    eps = 1e-6
    with torch.no_grad():
        for column in range(wanted.numel()):
            moved = []
            for step in (eps, -eps):
                shifted = [x.clone() for x in inputs]
                shifted[index].view(-1)[column] += step
                moved.append(torch.cat([y.reshape(-1) for y in function(*shifted)]))
            numerical[:, column] = (moved[0] - moved[1]) / (2 * eps)
    return autograds, numerical


def gradcheck_summary(
    message: str, function: Callable[..., Sequence[torch.Tensor]], inputs: Sequence[torch.Tensor]
) -> str:
    """gradcheck's failure in a few lines (its message prints both Jacobians whole): which output's
    gradient with respect to which input, and by how much it misses."""
    found = re.search(r"output (\d+) with respect to input (\d+)", message)
    if not found:
        return f"torch.autograd.gradcheck failed: {message.splitlines()[0][:300]}"
    # gradcheck numbers the inputs that require a gradient, the outputs all.
    output, index = int(found.group(1)), [i for i, x in enumerate(inputs) if x.requires_grad][int(found.group(2))]
    with torch.no_grad():
        sizes = [y.numel() for y in function(*inputs)]
    start = sum(sizes[:output])
    autograds, numerical = (j[start : start + sizes[output]] for j in jacobians(function, inputs, index))
    difference = (autograds - numerical).abs()
    row, column = divmod(int(difference.argmax()), difference.shape[1])
    cause = (
        "a hand-written backward pass that is wrong, or a forward pass not differentiable there (a max, a sort, "
        "a clamp at its bound)"
    )
    if index == 0:
        cause += (
            "; or the couplings held constant in the backward pass (test_the_votes_get_gradient_through_the_couplings)"
        )
    return (
        f"the gradient of the {OUTPUTS[output]} with respect to the {INPUTS[index]} is not that of finite differences "
        f"(torch.autograd.gradcheck, float64, a layer of 4 children and 3 parents): it misses by up to "
        f"{difference.max():.3g} (autograd {autograds[row, column]:.4g}, finite differences "
        f"{numerical[row, column]:.4g}, where the gradient is up to {numerical.abs().max():.3g}). Likely cause: {cause}"
    )
