"""Variational Bayes routing (Ribeiro, Leontidis & Kollias, "Capsule routing via variational Bayes", AAAI
2020): EM routing's Gaussian mixture of the votes with priors over its parameters, fitted by variational
Bayes."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from capsexp.config.routing_options import VBRouting
from capsexp.nn.functional._exporting import exporting
from capsexp.nn.functional._gaussian_routing import gaussian_routing
from capsexp.nn.functional._gaussian_votes import VoteMaker, _normalise_per_child


def _digamma(x: torch.Tensor) -> torch.Tensor:
    """psi(x), in ops ONNX has where the model is exported (it has no digamma): psi(x) = psi(x + 6) -
    sum_{k<6} 1/(x + k), then for y = x + 6 the asymptotic series ln y - 1/(2y) - 1/(12y^2) + 1/(120y^4) -
    1/(252y^6) + 1/(240y^8): within 1e-9 for x > 0."""
    if not exporting():
        return torch.digamma(x)
    shift = sum((x + k).reciprocal() for k in range(6))
    y = x + 6
    inverse_square = (y * y).reciprocal()
    series = inverse_square * (1 / 12 - inverse_square * (1 / 120 - inverse_square * (1 / 252 - inverse_square / 240)))
    return torch.log(y) - 0.5 / y - series - shift


class VBRouted(NamedTuple):
    """The parents' posterior mean poses m_j, their activation logits (before the batch normalisation and
    sigmoid of the layer) and the responsibilities of the last M-step: (B, J, D), (B, J) and (B, I, J) for
    a dense layer (no ``child_index``); (B, Q, J, D), (B, Q, J) and (B, Q, M, J) for a convolutional one."""

    poses: torch.Tensor
    activation_logits: torch.Tensor
    responsibilities: torch.Tensor


def vb_routing(
    votes: torch.Tensor | VoteMaker,
    child_activations: torch.Tensor,
    beta_u: torch.Tensor,
    beta_a: torch.Tensor,
    routing: VBRouting = VBRouting(),
    child_index: torch.Tensor | None = None,
    num_children: int | None = None,
) -> VBRouted:
    """Votes V_ij (B, I, J, D) and child activations a_i (B, I) -> parents, with beta_u, beta_a (J,).

    The matrix-capsule layers pass a :class:`~capsexp.nn.functional.VoteMaker` of parent-major votes
    (B, Q, J, M, D), Q parent positions with M receptive-field slots each, and for a convolutional layer
    ``child_index`` (Q, M) with the child activations (B, ``num_children``), as
    :func:`~capsexp.nn.functional.em_routing` takes them: a child's responsibilities then sum to 1 over
    every parent of every window that holds it (a layer that routes each window on its own, as the
    authors' code does, numbers every (window, slot) as a child of its own). Each position is a mixture
    of its own: the Dirichlet's sum runs over the parent types of the position, as in the authors' code.

    From responsibilities r_ij = 1/J, ``iterations`` M-steps with an E-step between each two (section 3 of
    the paper; the code's ``update_qparam`` and ``update_qlatent``); with R_ij = r_ij a_i, diagonal
    precisions and the priors of ``routing`` (Dirichlet alpha0; Normal mean 0 and precision scaling kappa0;
    Wishart scale psi0 I and nu0 = D + nu0_offset degrees of freedom):

    - M-step (Eq. 10-14): R_j = sum_i R_ij, alpha_j = alpha0 + R_j, kappa_j = kappa0 + R_j,
      nu_j = nu0 + R_j; mu_j = sum_i R_ij V_ij / R_j, m_j = R_j mu_j / kappa_j;
      Psi_j^-1 = psi0 + sum_i R_ij (V_ij - mu_j)^2 + (kappa0 R_j / kappa_j) mu_j^2 (per pose element).
    - E-step (Eq. 15-18): E[ln pi_j] = psi(alpha_j) - psi(sum_k alpha_k);
      E[ln|Lambda_j|] = sum_{d=0}^{D-1} psi((nu_j - d) / 2) + D ln 2 + ln|Psi_j|;
      E_ij = D / kappa_j + nu_j sum_d (V_ijd - m_jd)^2 Psi_jd;
      ln rho_ij = E[ln pi_j] + E[ln|Lambda_j|] / 2 - (D / 2) ln 2 pi - E_ij / 2, and
      r_ij = softmax_j(ln rho_ij), normalised in the log domain.
    - Activation logits (Eq. 19): beta_a - (exp(E[ln pi_j]) H[q(mu_j, Lambda_j)] + beta_u), with the
      entropy H = (D / 2) ln(2 pi e) - E[ln|Lambda_j|] / 2.

    The authors' code (src/vb_routing.py at 78fb69d) normalises r_ij in probability space,
    exp(ln rho_ij) / max(sum_k exp(ln rho_ik), 1e-11): when every ln rho_ij of a child is below ln 1e-11
    (16-D votes of norm about 2 and more) its responsibilities sum to less than 1, and to 0 when the
    exponentials underflow, which makes R_j 0 and mu_j 0/0 = NaN. Here they always sum to 1
    (``tests/test_vb_routing.py`` shows both). Its earlier revisions normalised with a log-sum-exp but
    left E[ln pi_j] out of the numerator, so that r_ij summed to 1 only where the proportions were equal.

    Computed in at least float32, with autocast off (the routing state is small), on the machinery EM routing
    shares (``_gaussian_routing.py``: chunks of the batch, no vote-sized tensor kept between the passes, the
    gradient of the votes from low-rank factors). The votes are centred once,
    V' = V - c with c the first M-step's means (detached: every output is the same function of V whatever
    c is), and stored beside their squares, [V' | V'^2], so that each M-step reads them once for both
    weighted sums (the scatter expanded about mu_j, exact because V' is of the order of the votes' spread)
    and each E-step once for all distances, sum_d (V'_d - m'_d)^2 P_d = [V' | V'^2] . [-2 m' P | P] +
    sum_d m'_d^2 P_d, with m' = m - c. Around 0 instead, votes far from 0 lose their spread in float32.
    """
    dense = not isinstance(votes, VoteMaker) and child_index is None
    if dense and (votes.ndim != 4 or child_activations.shape != votes.shape[:2]):
        raise ValueError(
            f"votes (B, I, J, D) and child activations (B, I) expected, got {tuple(votes.shape)} and "
            f"{tuple(child_activations.shape)}"
        )
    poses, logits, responsibilities = gaussian_routing(
        _vb_iterations, votes, child_activations, beta_u, beta_a, routing, child_index, num_children
    )
    return VBRouted(poses, logits, responsibilities)


def _vb_iterations(
    votes_and_squares, centre, slot_activations, uniform, beta_u, beta_a, _scale, routing: VBRouting, children, products
):
    """The M-steps and E-steps of :func:`vb_routing` on [V' | V'^2] (B, Q, J, M, 2D), the votes centred on c
    (B, Q, J, 1, D), as ``_gaussian_routing.py`` runs a procedure: the posterior means m_j (B, Q, J, D), the
    activation logits (B, Q, J) and the last M-step's responsibilities (B, Q, J, M)."""
    dims = votes_and_squares.shape[-1] // 2
    dtype = votes_and_squares.dtype
    tiny = torch.finfo(dtype).tiny
    nu0 = dims + routing.nu0_offset
    half_index = 0.5 * torch.arange(dims, dtype=dtype, device=votes_and_squares.device)
    constant = 0.5 * dims * math.log(2 * math.pi)
    centre = centre.squeeze(-2)  # (B, Q, J, D)
    responsibilities = uniform
    for iteration in range(routing.iterations):
        # M-step
        weights = responsibilities * slot_activations  # R_ij
        mass = weights.sum(dim=-1)  # R_j (B, Q, J)
        alpha, kappa, nu = routing.alpha0 + mass, routing.kappa0 + mass, nu0 + mass
        sums = products.over_children(weights)
        first, second = sums[..., :dims], sums[..., dims:]  # sum_i R_ij V', sum_i R_ij V'^2
        shift = first / mass.clamp_min(tiny).unsqueeze(-1)  # mu_j - c; R_j = 0: c
        mu = centre + shift
        scatter = (second - shift * first).clamp_min(0)  # sum_i R_ij (V' - mu')^2, expanded
        mean = (mass / kappa).unsqueeze(-1) * mu  # m_j = R_j mu_j / kappa_j
        inverse_scale = routing.psi0 + scatter + (routing.kappa0 * mass / kappa).unsqueeze(-1) * mu.square()
        e_ln_pi = _digamma(alpha) - _digamma(alpha.sum(dim=-1, keepdim=True))
        e_ln_lambda = (
            _digamma(0.5 * nu.unsqueeze(-1) - half_index).sum(dim=-1)
            + dims * math.log(2.0)
            - inverse_scale.log().sum(dim=-1)
        )
        if iteration == routing.iterations - 1:
            break
        # E-step: ln rho_ij = E[ln pi_j] + E[ln|Lambda_j|] / 2 - (D / 2) ln 2 pi - E_ij / 2, with
        # E_ij = D / kappa_j + nu_j ([V' | V'^2] . [-2 m' P | P] + sum_d m'_d^2 P_d), m' = m - c: one product.
        precision = inverse_scale.reciprocal()
        offset = mean - centre  # m'
        vector = (-0.5 * nu).unsqueeze(-1) * torch.cat([-2 * offset * precision, precision], dim=-1)
        distance_constant = (offset.square() * precision).sum(dim=-1)
        log_rho_constant = e_ln_pi + 0.5 * e_ln_lambda - constant - 0.5 * (dims / kappa + nu * distance_constant)
        responsibilities = _normalise_per_child(products.over_elements(vector, log_rho_constant), children)
    entropy = 0.5 * dims * math.log(2 * math.pi * math.e) - 0.5 * e_ln_lambda
    logits = beta_a - (e_ln_pi.exp() * entropy + beta_u)
    return mean, logits, responsibilities
