"""EM routing and the spread loss (Hinton, Sabour & Frosst 2018, "Matrix capsules with EM routing").

Shapes: ``B`` batch, ``Q`` parent positions (1 for a dense layer), ``M`` children in each parent's
receptive field, ``J`` parent capsule types, ``H`` pose elements (16 for 4x4 poses).

In a convolutional capsule layer a child lies in the receptive fields of several parent positions.
The paper routes it among *all* the parents that receive it: its responsibilities sum to 1 over every
(parent position, parent type) pair that sees it. ``child_index[q, m]`` names the child in slot m of
position q's receptive field, and the E-step normalises over all slots holding the same child.
"""

from __future__ import annotations

import math
from typing import NamedTuple, get_args

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from capsexp.config.routing_options import EM_PAPER, CostNormalization, EMRouting

LOG_2PI = math.log(2 * math.pi)
COST_NORMALIZATIONS: tuple[str, ...] = get_args(CostNormalization)


def inverse_temperatures(routing: EMRouting) -> list[float]:
    """lambda_t = final_lambda * (1 - 0.95^(t+1)) for t = 0..iterations-1 (the authors' schedule)."""
    return [routing.final_lambda * (1.0 - 0.95 ** (t + 1)) for t in range(routing.iterations)]


def em_routing(
    votes: torch.Tensor,
    activations: torch.Tensor,
    beta_u: torch.Tensor,
    beta_a: torch.Tensor,
    routing: EMRouting = EM_PAPER,
    child_index: torch.Tensor | None = None,
    num_children: int | None = None,
    return_responsibilities: bool = False,
    inplace: bool = False,
    inverse_temperature_scale: torch.Tensor | None = None,
):
    """Procedure 1 of the paper: parent poses and activations from votes and child activations.

    R_ij starts uniform over the parents of each child. Each iteration runs the M-step
    (R'_ij = R_ij a_i; mu_jh and sigma_jh^2 are the R'-weighted mean and variance of the votes;
    cost_h = (beta_u + log sigma_jh) sum_i R'_ij; a_j = sigmoid(lambda_t (beta_a - sum_h cost_h))) and,
    except after the last, the E-step: R_ij proportional to a_j N(V_ij; mu_j, sigma_j^2), normalised
    over the parents of child i.

    Args:
        votes: V, shape (B, I, J, H) for a dense layer, or (B, Q, M, J, H) for a convolutional one.
            Stored parent-major in memory ((B, Q, J, M, H), i.e. a ``transpose(-3, -2)`` view, as the
            matrix-capsule layers make them), no copy is made.
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
        inplace: centre ``votes`` in place (see Computation below): the caller's tensor then holds
            V - c afterwards, and no vote-sized copy is made. For callers whose votes are a temporary
            nothing else reads, as the matrix-capsule layers'. Gradients are unchanged.

    Returns:
        poses mu (B, J, H) or (B, Q, J, H); activations a_j (B, J) or (B, Q, J) [; R].

    How the options of ``routing`` enter Procedure 1 (the paper's values in brackets):

    - ``sigma_eps`` is added to every variance sigma_h^2 [none given]: it keeps log sigma and
      1/sigma^2 finite when all votes agree exactly (sigma -> 0).
    - ``cost_normalization``, how the cost enters the sigmoid [``"none"``]. ``"data"``: the amount
      of data sum_i R'_ij in the cost is divided by its mean over the parent types of the position,
      so that the cost no longer grows with the number of children a layer has (Gritzman 2019,
      pitfall 2, in a scale-free form). ``"standardize"``: the costs are standardised over the parent
      types of each position. ``"layer"``: the amount of data is divided by the children per parent
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
    c + mu(V - c) with everything else unchanged, so c carries no gradient of its own). The Gaussian
    is then expanded on V', sum R'(V' - mu')^2 = sum R'V'^2 - 2 mu' sum R'V' + mu'^2 sum R' and
    (V' - mu')^2 / sigma^2 = V'^2 . (1 / sigma^2) - 2 V' . (mu' / sigma^2) + mu'^2 / sigma^2, so that
    with V' and V'^2 computed once, every sum over children (M-step) and over pose elements (E-step)
    is a batched matrix-vector product. Centring is what keeps float32 exact: expanded around 0,
    votes far from zero compared with their spread cancel catastrophically (offset 20, spread 0.01:
    activations off by 0.1, vote gradients by 100%); around c, each term is of the order of the
    spread of the votes that carry weight (weighted, c stays near the parents' means also where
    inactive children vote far from the active ones). No (B, Q, M, J, H)-sized tensor is made per
    iteration, and the backward pass (:class:`_EMRouting`) builds the gradient of V from low-rank
    factors instead of keeping every intermediate: memory and time stay near those of the votes.
    Safeguards, in float32 at least whatever the input dtype: the variance is clamped at 0 before
    adding ``sigma_eps`` (the expansion can round below 0); sums of R' are floored at 1e-8 before
    dividing (which keeps mu translation-equivariant; a parent that receives no data sits near c); the
    E-step runs in the log domain (log a_j is ``logsigmoid`` of its argument, the normalisation a
    log-sum-exp per child), so R is never 0/0.
    """
    dense = votes.ndim == 4
    if dense:
        if child_index is not None:
            raise ValueError("child_index is for convolutional votes (B, Q, M, J, H)")
        votes, activations = votes.unsqueeze(1), activations.unsqueeze(1)  # Q = 1, children = slots
    elif child_index is None:
        raise ValueError("convolutional votes (B, Q, M, J, H) need child_index (Q, M)")
    with torch.autocast(device_type=votes.device.type, enabled=False):
        dtype = torch.promote_types(votes.dtype, torch.float32)  # float32 at least
        parent_major = votes.transpose(2, 3)  # (B, Q, J, M, H)
        copied = parent_major.dtype != dtype or not parent_major.is_contiguous()
        parent_major = parent_major.to(dtype).contiguous()
        children = _Children(child_index, num_children)
        scale = votes.new_ones(()) if inverse_temperature_scale is None else inverse_temperature_scale
        mu, parent_activations, responsibilities = _route(
            parent_major,
            activations.to(dtype),
            beta_u.to(dtype),
            beta_a.to(dtype),
            scale.to(dtype),
            routing,
            children,
            inplace or copied,
        )

    responsibilities = responsibilities.transpose(2, 3)  # (B, Q, M, J)
    if dense:
        mu, parent_activations, responsibilities = mu[:, 0], parent_activations[:, 0], responsibilities[:, 0]
    if return_responsibilities:
        return mu, parent_activations, responsibilities
    return mu, parent_activations


class _Children(NamedTuple):
    """Which child sits in each receptive-field slot: see em_routing's ``child_index``, ``num_children``."""

    index: torch.Tensor | None
    count: int | None


def _em_iterations(
    votes,
    squares,
    activations,
    beta_u,
    beta_a,
    temperature_scale,
    routing: EMRouting,
    children: _Children,
    over_children,
    over_elements,
):
    """Procedure 1 on parent-major votes V (B, Q, J, M, H) and V^2 (centred ones: see em_routing).

    ``over_children(x, big)``: sum_m x[..., m] big[..., m, :]; ``over_elements(big, y)``:
    sum_h big[..., h] y[..., h]: the only operations that read the vote-sized tensors.
    Returns mu (B, Q, J, H), a (B, Q, J), R (B, Q, J, M).
    """
    _, _, parents, slots, elements = votes.shape
    child_index, num_children = children
    if child_index is not None:
        num_children = num_children or int(child_index.max()) + 1
    slot_activations, responsibilities = _uniform_assignment(votes, activations, children)

    for t, inverse_temperature in enumerate(inverse_temperatures(routing)):
        # M-step: R'_ij = R_ij a_i; mu_j and sigma_j^2 weighted by R'; cost; a_j.
        weighted = responsibilities * slot_activations  # (B, Q, J, M)
        weight_sum = weighted.sum(dim=-1, keepdim=True)  # (B, Q, J, 1)
        denominator = weight_sum.clamp_min(1e-8)
        first = over_children(weighted, votes)  # sum_i R' V   (B, Q, J, H)
        second = over_children(weighted, squares)  # sum_i R' V^2
        mu = first / denominator
        # sum_i R' (V - mu)^2 / denominator, expanded (exact also where the floor shrinks mu).
        variance = ((second - 2 * mu * first + mu.square() * weight_sum) / denominator).clamp_min(0)
        variance = variance + routing.sigma_eps
        log_variance = torch.log(variance)
        amount = weight_sum  # sum_i R'_ij
        if routing.cost_normalization == "data":
            amount = weight_sum / (weight_sum.mean(dim=2, keepdim=True) + 1e-8)
        elif routing.cost_normalization == "layer":
            amount = weight_sum * (parents / slots)
        cost = ((beta_u.view(-1, 1) + 0.5 * log_variance) * amount).sum(dim=-1)  # (B, Q, J)
        if routing.cost_normalization == "standardize":
            cost = (cost - cost.mean(dim=-1, keepdim=True)) / (cost.std(dim=-1, keepdim=True) + 1e-8)
        logit = inverse_temperature * temperature_scale * (beta_a - cost)
        parent_activations = torch.sigmoid(logit)
        if t == routing.iterations - 1:
            break
        # E-step: log N(V_ij; mu_j, sigma_j^2), summed over h with two matrix-vector products.
        precision = 1.0 / variance
        quadratic = over_elements(squares, precision) - 2 * over_elements(votes, mu * precision)  # (B, Q, J, M)
        constant = (mu.square() * precision + log_variance).sum(dim=-1, keepdim=True) + elements * LOG_2PI
        log_r = F.logsigmoid(logit).unsqueeze(-1) - (0.5 / routing.e_step_temperature) * (quadratic + constant)
        responsibilities = _normalise_per_child(log_r, child_index, num_children)
        if routing.detach_responsibilities:  # the backward pass (run on a graph) then skips the E-step
            responsibilities = responsibilities.detach()
    return mu, parent_activations, responsibilities


def _uniform_assignment(votes: torch.Tensor, activations: torch.Tensor, children: _Children):
    """a_i in each receptive-field slot, (B, Q or 1, 1, M), and the uniform R (B, Q, J, M) routing
    starts from: 1 / the number of parents receiving the child."""
    batch, positions, parents, slots, _ = votes.shape
    if children.index is None:
        slot_activations = activations.view(batch, 1, 1, slots)  # (B, 1, 1, M)
        fan_out = float(parents)
    else:
        flat_index = children.index.reshape(-1)
        num_children = children.count or int(flat_index.max()) + 1
        slot_activations = activations[:, flat_index].view(batch, positions, 1, slots)
        # Parents receiving each child: (positions whose field holds it) x (parent types).
        counts = _children_counts(flat_index, num_children, votes.dtype)
        fan_out = (counts[flat_index] * parents).view(1, positions, 1, slots)
    return slot_activations, (votes.new_ones(()) / fan_out).expand(batch, positions, parents, slots)


def _children_counts(flat_index: torch.Tensor, num_children: int, dtype: torch.dtype) -> torch.Tensor:
    """How often each child's index occurs in ``flat_index``: (num_children,). Not torch.bincount, whose
    output length depends on the data: torch.compile breaks the graph at each call."""
    ones = torch.ones(flat_index.numel(), dtype=dtype, device=flat_index.device)
    return torch.zeros(num_children, dtype=dtype, device=flat_index.device).index_add_(0, flat_index, ones)


def _sum_over_children(weights: torch.Tensor, big: torch.Tensor) -> torch.Tensor:
    return torch.matmul(weights.unsqueeze(-2), big).squeeze(-2)


@torch.compiler.disable
def _route(*inputs):
    """:class:`_EMRouting`, left out of torch.compile's graphs: its backward pass records factors in a
    Python list, which dynamo cannot trace; it tried at every layer and fell back to this anyway, at
    twice the compile time of a MatrixCapsNet."""
    return _EMRouting.apply(*inputs)


class _EMRouting(torch.autograd.Function):
    """EM routing on centred votes whose backward pass never holds more than a few vote-sized tensors.

    Forward: Procedure 1 without a graph; only V is saved. Backward: the iterations run again on a
    graph of the small tensors, in which each read of V or V^2 is a :class:`_Contraction` that
    records its (child-vector, pose-vector) factor pair instead of a vote-sized gradient. The
    gradient of V is then sum(factor products) + 2 V * sum(factor products of V^2), built with two
    batched matmuls. Autograd alone would keep every intermediate and one gradient per read.
    """

    @staticmethod
    def forward(ctx, votes, activations, beta_u, beta_a, temperature_scale, routing, children, centre_in_place):
        # c (B, Q, J, 1, H): the first M-step's mu, the mean vote weighted by R a_i. Weighted, it sits
        # among the votes that carry data, also where inactive children vote far from the active ones.
        slot_activations, uniform = _uniform_assignment(votes, activations, children)
        weighted = uniform * slot_activations
        weight_sum = weighted.sum(dim=-1, keepdim=True).clamp_min(torch.finfo(votes.dtype).tiny)
        centre = (_sum_over_children(weighted, votes) / weight_sum).unsqueeze(-2)
        # V' = V - c. In place (the input modified without mark_dirty: its gradient is that of V' (c
        # carries none, see em_routing), and the callers that allow it read the votes nowhere else):
        # here, after autograd has taken the votes' grad_fn, an in-place change of a view costs no
        # vote-sized as_strided scatter in the backward pass.
        centred = votes.sub_(centre) if centre_in_place else votes - centre
        mu, parent_activations, responsibilities = _em_iterations(
            centred,
            centred.square(),
            activations,
            beta_u,
            beta_a,
            temperature_scale,
            routing,
            children,
            _sum_over_children,
            _dot_pose,
        )
        ctx.routing, ctx.children = routing, children
        ctx.save_for_backward(centred, activations, beta_u, beta_a, temperature_scale)
        ctx.mark_non_differentiable(responsibilities)
        return mu + centre.squeeze(-2), parent_activations, responsibilities

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_mu, grad_activations, _grad_responsibilities):
        votes, *small = ctx.saved_tensors  # activations, beta_u, beta_a, temperature_scale
        leaves = [
            tensor.detach().requires_grad_(needed)
            for tensor, needed in zip(small, ctx.needs_input_grad[1:5], strict=True)
        ]
        factors = {"votes": ([], []), "squares": ([], [])}
        squares = votes.square()
        # Every read of V must be visited by the backward pass, also those whose small input needs no
        # gradient (the first iteration's weights when the activations are constants): each
        # contraction also takes this empty leaf, which is among the inputs asked for.
        anchor = votes.new_empty(0, requires_grad=True)

        def over_children(weights, big):
            return _Contraction.apply(weights, big, True, factors["votes" if big is votes else "squares"], anchor)

        def over_elements(big, vectors):
            return _Contraction.apply(vectors, big, False, factors["votes" if big is votes else "squares"], anchor)

        with torch.enable_grad():
            mu, parent_activations, _ = _em_iterations(
                votes, squares, *leaves, ctx.routing, ctx.children, over_children, over_elements
            )
            wanted = [leaf for leaf in leaves if leaf.requires_grad]
            grads = torch.autograd.grad(
                (mu, parent_activations), [anchor, *wanted], (grad_mu, grad_activations), allow_unused=True
            )
        grads = iter(grads[1:])
        leaf_grads = [next(grads) if leaf.requires_grad else None for leaf in leaves]
        del squares
        grad_votes = None
        if ctx.needs_input_grad[0]:
            # g(V) = sum_t L_t (x) R_t over the reads of V, + 2 V * (the same over the reads of V^2).
            grad_votes = _outer_sum(*factors["squares"], votes.shape).mul_(votes).mul_(2)
            left, right = factors["votes"]
            flat = grad_votes.view(-1, *votes.shape[-2:])
            flat.baddbmm_(torch.stack(left, -1).flatten(0, -3), torch.stack(right, -2).flatten(0, -3))
        return grad_votes, *leaf_grads, None, None, None


def _outer_sum(left: list[torch.Tensor], right: list[torch.Tensor], shape: torch.Size) -> torch.Tensor:
    """sum_t left_t[..., m] right_t[..., h] as one batched matmul: (B, Q, J, M, T) @ (B, Q, J, T, H)."""
    return torch.matmul(torch.stack(left, dim=-1), torch.stack(right, dim=-2)).view(shape)


class _Contraction(torch.autograd.Function):
    """One read of a vote-sized tensor ``big`` (B, Q, J, M, H) by a small one.

    over children (``small`` (B, Q, J, M)): out = sum_m small_m big_m,h;
    over elements (``small`` (B, Q, J, H)): out = sum_h big_m,h small_h.
    The backward pass returns the small tensor's gradient and appends the factors of big's gradient
    (an outer product) to ``factors`` = (left list over m, right list over h).
    """

    @staticmethod
    def forward(ctx, small, big, over_children: bool, factors, anchor):
        ctx.over_children, ctx.factors = over_children, factors
        ctx.save_for_backward(small, big)
        return _sum_over_children(small, big) if over_children else _dot_pose(big, small)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        small, big = ctx.saved_tensors
        # Detached, and the list dropped: a factor that kept its grad_fn would tie the graph to
        # this context in a cycle through C++ objects that the garbage collector cannot free.
        left, right = ctx.factors
        ctx.factors = None
        small = small.detach()
        if ctx.over_children:  # out_h = sum_m small_m big_mh: g(small_m) = sum_h g_h big_mh
            left.append(small), right.append(grad_out)
            return _dot_pose(big, grad_out), None, None, None, None
        left.append(grad_out), right.append(small)  # out_m = sum_h big_mh small_h
        return _sum_over_children(grad_out, big), None, None, None, None


def _dot_pose(votes: torch.Tensor, parent_vectors: torch.Tensor) -> torch.Tensor:
    """sum_h V_ijh x_jh for every child: (B, Q, J, M, H), (B, Q, J, H) -> (B, Q, J, M).

    Written x^T V^T, the (1 x H) @ (H x M) form BLAS runs fastest (as in dynamic routing).
    """
    return torch.matmul(parent_vectors.unsqueeze(-2), votes.transpose(-1, -2)).squeeze(-2)


def _normalise_per_child(log_r: torch.Tensor, child_index: torch.Tensor | None, num_children: int | None):
    """exp(log_r) (B, Q, J, M) normalised to sum to 1 over every (position, parent type) holding a child."""
    if child_index is None:
        return torch.softmax(log_r, dim=2)
    batch, positions, _, slots = log_r.shape
    flat_index = child_index.reshape(-1).expand(batch, -1)  # (B, Q*M)
    slot_max = log_r.amax(dim=2).reshape(batch, -1)  # (B, Q*M)
    child_max = slot_max.new_full((batch, num_children), -torch.inf)
    child_max = child_max.scatter_reduce(1, flat_index, slot_max, reduce="amax").detach()
    shifted = log_r - child_max.gather(1, flat_index).view(batch, positions, 1, slots)
    slot_sum = shifted.exp().sum(dim=2).reshape(batch, -1)
    child_sum = slot_sum.new_zeros(batch, num_children).scatter_add(1, flat_index, slot_sum)
    log_norm = torch.log(child_sum.gather(1, flat_index)).view(batch, positions, 1, slots)
    return torch.exp(shifted - log_norm)


def responsibility_entropy(
    responsibilities: torch.Tensor, child_index: torch.Tensor | None = None, num_children: int | None = None
) -> torch.Tensor:
    """Entropy of each child's responsibilities over all the parents that receive it, divided by its
    maximum log(number of those parents): 1 is uniform (routing undecided), 0 is a hard assignment.

    ``responsibilities`` as :func:`em_routing` returns them: (B, I, J) dense, or (B, Q, M, J) with
    ``child_index`` (Q, M). Returns (B, children).
    """
    plogp = torch.special.xlogy(responsibilities, responsibilities)
    parents = responsibilities.shape[-1]
    if child_index is None:
        return -plogp.sum(dim=-1) / math.log(parents)
    num_children = num_children or int(child_index.max()) + 1
    flat_index = child_index.reshape(-1)
    batch = responsibilities.shape[0]
    per_child = plogp.new_zeros(batch, num_children).index_add_(1, flat_index, plogp.sum(dim=-1).reshape(batch, -1))
    fan_out = _children_counts(flat_index, num_children, plogp.dtype) * parents
    return -per_child / torch.log(fan_out).clamp_min(1e-8)


def spread_loss(activations: torch.Tensor, targets: torch.Tensor, margin: float | torch.Tensor) -> torch.Tensor:
    """L = sum_{i != t} max(0, m - (a_t - a_i))^2 (section 3.1), averaged over the batch."""
    target_activation = activations.gather(1, targets.unsqueeze(1))
    gaps = F.relu(margin - (target_activation - activations)).pow(2)
    others = 1.0 - F.one_hot(targets, activations.shape[-1]).to(gaps.dtype)
    return (gaps * others).sum(dim=-1).mean()
