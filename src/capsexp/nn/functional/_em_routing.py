"""EM routing (Hinton, Sabour & Frosst 2018, "Matrix capsules with EM routing", Procedure 1).

Shapes: ``B`` batch, ``Q`` parent positions (1 for a dense layer), ``M`` children in each parent's
receptive field, ``J`` parent capsule types, ``H`` pose elements (16 for 4x4 poses).

In a convolutional capsule layer a child lies in the receptive fields of several parent positions.
The paper routes it among *all* the parents that receive it: its responsibilities sum to 1 over every
(parent position, parent type) pair that sees it. ``child_index[q, m]`` names the child in slot m of
position q's receptive field, and the E-step normalises over all slots holding the same child.
"""

from __future__ import annotations

import math
from typing import get_args

import torch
import torch.nn.functional as F

from capsexp.config.routing_options import EM_PAPER, CostNormalization, EMRouting
from capsexp.nn.functional._gaussian_routing import gaussian_routing
from capsexp.nn.functional._gaussian_votes import VoteMaker, _Children, _normalise_per_child

LOG_2PI = math.log(2 * math.pi)
COST_NORMALIZATIONS: tuple[str, ...] = get_args(CostNormalization)


# The variance floor of routing.sigma_eps=None: the matrix-capsule layers' (capsexp.nn.EMRouting).
MATRIX_FLOOR = 0.01


# Standardised costs: a spread of the costs below this fraction of their mean size is rounding, not a
# difference between the parents (float32 rounds at 6e-8 of a value).
TIE_SCALE = 1e-4


def variance_floor(routing: EMRouting) -> float:
    """The floor added to every variance: ``routing.sigma_eps``, or :data:`MATRIX_FLOOR` where unset."""
    return MATRIX_FLOOR if routing.sigma_eps is None else routing.sigma_eps


def inverse_temperatures(routing: EMRouting) -> list[float]:
    """lambda_t = final_lambda * (1 - 0.95^(t+1)) for t = 0..iterations-1 (the authors' schedule)."""
    return [routing.final_lambda * (1.0 - 0.95 ** (t + 1)) for t in range(routing.iterations)]


def em_routing(
    votes: torch.Tensor | VoteMaker,
    activations: torch.Tensor,
    beta_u: torch.Tensor,
    beta_a: torch.Tensor,
    routing: EMRouting = EM_PAPER,
    child_index: torch.Tensor | None = None,
    num_children: int | None = None,
    return_responsibilities: bool = False,
    inverse_temperature_scale: torch.Tensor | None = None,
):
    """Procedure 1 of the paper: parent poses and activations from votes and child activations.

    R_ij starts uniform over the parents of each child. Each iteration runs the M-step
    (R'_ij = R_ij a_i; mu_jh and sigma_jh^2 are the R'-weighted mean and variance of the votes;
    cost_h = (beta_u + log sigma_jh) sum_i R'_ij; a_j = sigmoid(lambda_t (beta_a - sum_h cost_h))) and,
    except after the last, the E-step: R_ij proportional to a_j N(V_ij; mu_j, sigma_j^2), normalised
    over the parents of child i.

    Args:
        votes: V, shape (B, I, J, H) for a dense layer, or (B, Q, M, J, H) for a convolutional one; or
            a :class:`VoteMaker` that makes them (parent-major), as the matrix-capsule layers pass them.
        activations: child activations a_i: (B, I) dense; (B, num_children) with ``child_index``.
        beta_u, beta_a: learned per parent type, shape (J,) (broadcast over positions).
        routing: the routing options (:class:`~capsexp.nn.EMRouting`, where each is explained with its
            source and checked when built): iterations, the inverse temperatures' final_lambda (see
            :func:`inverse_temperatures`), the variance floor sigma_eps, cost_normalization, whether
            the E-steps' responsibilities are constants to the backward pass (detach_responsibilities)
            and the E-step's temperature. The default, :data:`~capsexp.nn.EM_PAPER`, is the paper's.
        child_index: (Q, M) long, the child in each receptive-field slot (convolutional layers).
        num_children: number of distinct children (default: ``child_index.max() + 1``).
        return_responsibilities: also return R, shape of ``votes`` without H.
        inverse_temperature_scale: a scalar tensor s multiplying every lambda_t (default 1): a
            learned inverse temperature (log-parametrised by the layers), not in the paper.

    Returns:
        poses mu (B, J, H) or (B, Q, J, H); activations a_j (B, J) or (B, Q, J) [; R].

    How the options of ``routing`` enter Procedure 1 (the paper's values in brackets):

    - ``sigma_eps`` is added to every variance sigma_h^2 [none given]: it keeps log sigma and
      1/sigma^2 finite when all votes agree exactly (sigma -> 0).
    - ``cost_normalization``, how the cost enters the sigmoid [``"none"``]. ``"data"``: the amount
      of data sum_i R'_ij in the cost is divided by its mean over the parent types of the position,
      so that the cost no longer grows with the number of children a layer has (Gritzman 2019,
      pitfall 2, in a scale-free form). ``"standardize"``: the costs are standardised over the parent
      types of each position, (cost - mean) / (std + :data:`TIE_SCALE` mean |cost|), so that costs tied
      up to rounding stay tied. ``"layer"``: the amount of data is divided by the children per parent
      in a receptive field, M / J, a constant of the layer (IBM/matrix-capsules-with-em-routing's
      layer normalisation factor, less its constant 100).
    - ``detach_responsibilities`` [false: "backpropagating through the unrolled iterations of EM"]:
      if true, the responsibilities each E-step computes are constants to the backward pass, so the
      gradient reaches the votes through the M-steps' weighted sums alone.
    - ``e_step_temperature`` T divides the E-step's log-likelihood [1]: R_ij proportional to
      a_j N(V_ij; mu_j, sigma_j^2)^(1/T); T > 1 softens the assignments (each of the H pose elements
      adds its own log-likelihood ratio, so T = H weighs a vote as one observation).

    Computation: the votes are first centred, V' = V - c with c each parent's mean vote weighted by
    R a_i at the start (the first M-step's mu; detached: routing is translation-equivariant, mu(V) =
    c + mu(V - c) with everything else unchanged, so c carries no gradient of its own). V' and V'^2
    are stored side by side, [V' | V'^2] (one (M, 2H) matrix per parent), and the Gaussian expanded on
    them: sum R'(V' - mu')^2 = sum R'V'^2 - 2 mu' sum R'V' + mu'^2 sum R', and the E-step's
    log a_j N(V'; mu', sigma^2) = [V' | V'^2] . [mu' / sigma^2 | -1 / (2 sigma^2)] + (terms of j alone).
    So each M-step reads the votes once (one batched vector-matrix product gives both sums) and each
    E-step once (one product, its constant added in the same call, gives log R). Centring is what
    keeps float32 exact: expanded around 0, votes far from zero compared with their spread cancel
    catastrophically (offset 20, spread 0.01: activations off by 0.1, vote gradients by 100%); around
    c, each term is of the order of the spread of the votes that carry weight (weighted, c stays near
    the parents' means also where inactive children vote far from the active ones).

    Memory (``_gaussian_routing.py``, the machinery VB routing shares): the batch is routed in chunks of
    at most ``CHUNK_BYTES`` of [V' | V'^2]; the backward pass keeps no vote-sized tensor from the
    forward pass (a :class:`VoteMaker` makes the votes again; votes given as a tensor are the caller's), replays the
    iterations from the products the forward pass kept, and builds the gradient of V from low-rank
    factors instead of keeping every intermediate. The chunks' vote-sized tensors reuse buffers
    allocated once per call.

    Safeguards, in float32 at least whatever the input dtype (also under autocast): the variance is
    clamped at 0 before adding ``sigma_eps`` (the expansion can round below 0); sums of R' are
    floored at 1e-8 before dividing (which keeps mu translation-equivariant; a parent that receives
    no data sits near c); the E-step runs in the log domain (log a_j is ``logsigmoid`` of its
    argument, the normalisation a log-sum-exp per child), so R is never 0/0.
    """
    routed = gaussian_routing(
        _em_iterations,
        votes,
        activations,
        beta_u,
        beta_a,
        routing,
        child_index,
        num_children,
        inverse_temperature_scale,
    )
    return routed if return_responsibilities else routed[:2]


def _em_iterations(
    votes_and_squares,
    centre,
    slot_activations,
    uniform,
    beta_u,
    beta_a,
    temperature_scale,
    routing: EMRouting,
    children: _Children,
    products,
):
    """Procedure 1 on parent-major [V' | V'^2] (B, Q, J, M, 2H) (centred votes: see em_routing).

    ``products`` computes the only two operations that read the vote-sized tensor:
    ``products.over_children(weights)``: sum_m weights[..., m] [V' | V'^2][..., m, :], (B, Q, J, 2H);
    ``products.over_elements(vector, constant)``: constant + sum_h [V' | V'^2][..., h] vector[..., h],
    (B, Q, J, M). ``slot_activations`` a_i in each slot, (B, Q or 1, 1, M); ``uniform`` the starting R.
    Returns mu (B, Q, J, H), a (B, Q, J), R (B, Q, J, M); mu computed about the centre c (B, Q, J, 1, H)
    the votes were centred on, and c added back (EM routing is translation-equivariant: nothing else
    depends on c).
    """
    _, _, parents, slots, doubled = votes_and_squares.shape
    elements = doubled // 2
    responsibilities = uniform
    for t, inverse_temperature in enumerate(inverse_temperatures(routing)):
        # M-step: R'_ij = R_ij a_i; mu_j and sigma_j^2 weighted by R'; cost; a_j.
        weighted = responsibilities * slot_activations  # (B, Q, J, M)
        weight_sum = weighted.sum(dim=-1, keepdim=True)  # (B, Q, J, 1)
        denominator = weight_sum.clamp_min(1e-8)
        sums = products.over_children(weighted)
        first, second = sums[..., :elements], sums[..., elements:]  # sum_i R' V', sum_i R' V'^2
        mu = first / denominator
        # sum_i R' (V - mu)^2 / denominator, expanded (exact also where the floor shrinks mu).
        variance = ((second - 2 * mu * first + mu.square() * weight_sum) / denominator).clamp_min(0)
        variance = variance + variance_floor(routing)
        log_variance = torch.log(variance)
        amount = weight_sum  # sum_i R'_ij
        if routing.cost_normalization == "data":
            amount = weight_sum / (weight_sum.mean(dim=2, keepdim=True) + 1e-8)
        elif routing.cost_normalization == "layer":
            amount = weight_sum * (parents / slots)
        cost = ((beta_u.view(-1, 1) + 0.5 * log_variance) * amount).sum(dim=-1)  # (B, Q, J)
        if routing.cost_normalization == "standardize":
            # Costs that tie differ by rounding alone, which a bare std would blow up to unit spread (tied
            # parents then got activations of 0 or 1 by chance): spreads below TIE_SCALE of the costs'
            # size count as ties.
            scale = cost.std(dim=-1, keepdim=True) + TIE_SCALE * cost.abs().mean(dim=-1, keepdim=True) + 1e-8
            cost = (cost - cost.mean(dim=-1, keepdim=True)) / scale
        logit = inverse_temperature * temperature_scale * (beta_a - cost)
        parent_activations = torch.sigmoid(logit)
        if t == routing.iterations - 1:
            break
        # E-step: log a_j N(V'_ij; mu_j, sigma_j^2)^(1/T) = [V' | V'^2] . vector + constant.
        precision = 1.0 / variance
        vector = torch.cat([mu * precision, -0.5 * precision], dim=-1) / routing.e_step_temperature
        normaliser = (mu.square() * precision + log_variance).sum(dim=-1) + elements * LOG_2PI
        constant = F.logsigmoid(logit) - (0.5 / routing.e_step_temperature) * normaliser
        responsibilities = _normalise_per_child(products.over_elements(vector, constant), children)
        if routing.detach_responsibilities:  # the backward pass (run on a graph) then skips the E-step
            responsibilities = responsibilities.detach()
    return mu + centre.squeeze(-2), parent_activations, responsibilities
