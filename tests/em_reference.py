"""The plain, unoptimised transcription of EM routing (Procedure 1), as first written: the reference
the optimised ``capsexp.nn.functional.em_routing`` must match."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

LOG_2PI = math.log(2 * math.pi)


def inverse_temperatures(iterations: int, final_lambda: float) -> list[float]:
    """The inverse temperature at iteration t = 0..iterations-1, lambda_t = final_lambda (1 - 0.95^(t+1)),
    written out here so that the reference shares no code with what it checks."""
    return [final_lambda * (1 - 0.95 ** (t + 1)) for t in range(iterations)]


def plain_em_routing(
    votes: torch.Tensor,
    activations: torch.Tensor,
    beta_u: torch.Tensor,
    beta_a: torch.Tensor,
    iterations: int = 3,
    final_lambda: float = 0.01,
    child_index: torch.Tensor | None = None,
    num_children: int | None = None,
    sigma_eps: float = 1e-4,
    cost_normalization: str = "none",
    return_responsibilities: bool = False,
    inverse_temperature_scale: torch.Tensor | None = None,
    detach_responsibilities: bool = False,
    e_step_temperature: float = 1.0,
):
    """The same arguments and results as :func:`capsexp.nn.functional.em_routing`, computed the obvious way:
    every (V - mu)^2 materialised, plain autograd."""
    dense = votes.ndim == 4
    if dense:
        if child_index is not None:
            raise ValueError("child_index is for convolutional votes (B, Q, M, J, H)")
        votes, activations = votes.unsqueeze(1), activations.unsqueeze(1)  # Q = 1, children = slots
    elif child_index is None:
        raise ValueError("convolutional votes (B, Q, M, J, H) need child_index (Q, M)")
    if iterations < 1:
        raise ValueError(f"EM routing needs at least one iteration, got {iterations}")

    with torch.autocast(device_type=votes.device.type, enabled=False):
        dtype = torch.promote_types(votes.dtype, torch.float32)
        votes, activations = votes.to(dtype), activations.to(dtype)
        beta_u, beta_a = beta_u.to(dtype), beta_a.to(dtype)
        batch, positions, slots, parents, _ = votes.shape
        if child_index is None:
            slot_activations = activations.unsqueeze(-1)  # (B, 1, M, 1)
            fan_out = votes.new_full((1, 1, slots, 1), float(parents))
        else:
            num_children = num_children or int(child_index.max()) + 1
            flat_index = child_index.reshape(-1)
            slot_activations = activations[:, flat_index].view(batch, positions, slots, 1)
            # Parents receiving each child: (positions whose field holds it) x (parent types).
            counts = torch.bincount(flat_index, minlength=num_children).to(votes.dtype)
            fan_out = (counts[flat_index] * parents).view(1, positions, slots, 1)
        responsibilities = (1.0 / fan_out).expand(batch, positions, slots, parents)  # R uniform

        for t, inverse_temperature in enumerate(inverse_temperatures(iterations, final_lambda)):
            # M-step: R'_ij = R_ij a_i; mu_j, sigma_j^2 weighted by R'; cost; a_j.
            weighted = (responsibilities * slot_activations).unsqueeze(-1)  # (B, Q, M, J, 1)
            weight_sum = weighted.sum(dim=2)  # (B, Q, J, 1)
            mu = (weighted * votes).sum(dim=2) / weight_sum.clamp_min(1e-8)  # (B, Q, J, H)
            variance = (weighted * (votes - mu.unsqueeze(2)).pow(2)).sum(dim=2) / weight_sum.clamp_min(1e-8)
            variance = variance + sigma_eps
            amount = weight_sum
            if cost_normalization == "data":  # the amount of data relative to the mean parent's
                amount = weight_sum / (weight_sum.mean(dim=2, keepdim=True) + 1e-8)
            elif cost_normalization == "layer":  # divided by the children per parent of a receptive field
                amount = weight_sum * parents / slots
            cost = ((beta_u.view(-1, 1) + 0.5 * torch.log(variance)) * amount).sum(dim=-1)  # (B, Q, J)
            if cost_normalization == "standardize":
                # Spreads below 1e-4 of the costs' mean size are ties (rounding), not differences.
                spread = cost.std(dim=-1, keepdim=True) + 1e-4 * cost.abs().mean(dim=-1, keepdim=True) + 1e-8
                cost = (cost - cost.mean(dim=-1, keepdim=True)) / spread
            logit = inverse_temperature * (beta_a - cost)
            if inverse_temperature_scale is not None:
                logit = logit * inverse_temperature_scale
            parent_activations = torch.sigmoid(logit)
            if t == iterations - 1:
                break
            # E-step: R_ij proportional to a_j N(V_ij; mu_j, sigma_j^2), in the log domain.
            log_p = -0.5 * (
                (votes - mu.unsqueeze(2)).pow(2) / variance.unsqueeze(2) + torch.log(variance.unsqueeze(2)) + LOG_2PI
            ).sum(dim=-1)  # (B, Q, M, J)
            log_r = F.logsigmoid(logit).unsqueeze(2) + log_p / e_step_temperature
            responsibilities = _plain_normalise(log_r, child_index, num_children)
            if detach_responsibilities:
                responsibilities = responsibilities.detach()

    if dense:
        mu, parent_activations, responsibilities = mu[:, 0], parent_activations[:, 0], responsibilities[:, 0]
    if return_responsibilities:
        return mu, parent_activations, responsibilities
    return mu, parent_activations


def _plain_normalise(log_r: torch.Tensor, child_index: torch.Tensor | None, num_children: int | None):
    """exp(log_r) normalised to sum to 1 over every (position, parent type) that holds the same child."""
    if child_index is None:
        return torch.softmax(log_r, dim=-1)
    batch, positions, slots, _ = log_r.shape
    flat_index = child_index.reshape(-1).expand(batch, -1)  # (B, Q*M)
    slot_max = log_r.amax(dim=-1).reshape(batch, -1)  # (B, Q*M)
    child_max = slot_max.new_full((batch, num_children), -torch.inf)
    child_max = child_max.scatter_reduce(1, flat_index, slot_max, reduce="amax").detach()
    shifted = log_r - child_max.gather(1, flat_index).view(batch, positions, slots, 1)
    slot_sum = shifted.exp().sum(dim=-1).reshape(batch, -1)
    child_sum = slot_sum.new_zeros(batch, num_children).scatter_add(1, flat_index, slot_sum)
    log_norm = torch.log(child_sum.gather(1, flat_index)).view(batch, positions, slots, 1)
    return torch.exp(shifted - log_norm)


# The options of capsexp.nn.EMRouting that the layers apply, not em_routing itself.
LAYER_OPTIONS = ("route_per_window", "learn_inverse_temperature")


def plain_options(routing) -> dict:
    """An :class:`capsexp.nn.EMRouting` as the keyword arguments of :func:`plain_em_routing`."""
    import dataclasses

    options = {k: v for k, v in dataclasses.asdict(routing).items() if k not in LAYER_OPTIONS}
    if options["sigma_eps"] is None:  # unset: the matrix-capsule layers' floor
        options["sigma_eps"] = 0.01
    return options


def fast_em_routing(votes, activations, beta_u, beta_a, **options):
    """``capsexp.nn.functional.em_routing`` called with :func:`plain_em_routing`'s keyword arguments:
    the routing options among them as the paper's (``EM_PAPER``) with those replaced."""
    import dataclasses

    from capsexp.nn import EM_PAPER
    from capsexp.nn.functional import em_routing

    names = {field.name for field in dataclasses.fields(EM_PAPER)}
    routing = dataclasses.replace(EM_PAPER, **{k: v for k, v in options.items() if k in names})
    rest = {k: v for k, v in options.items() if k not in names}
    return em_routing(votes, activations, beta_u, beta_a, routing, **rest)
