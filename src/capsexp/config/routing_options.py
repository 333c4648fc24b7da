"""The routing options of the capsule layers: one frozen dataclass per routing algorithm, built from
``model.net.routing`` and passed down unchanged to the routing functions.

Plain data, no torch: :mod:`capsexp.config.hydra_setup` registers them in Hydra's ConfigStore
(``model/routing=em``, ``em_paper``, ``dynamic``) without importing the layers, so that the command-line
checks answer quickly. Import them from :mod:`capsexp.nn`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, ClassVar, Literal

from annotated_types import Gt
from pydantic import PositiveFloat, PositiveInt

from capsexp.config.arguments import checked

# How em_routing normalises the costs before the activations (capsexp.nn.functional.em_routing).
CostNormalization = Literal["none", "data", "standardize", "layer"]


@dataclass(frozen=True)
class Routing:
    """What every routing algorithm's options are: a frozen dataclass of its settings (``model.net.routing``,
    set from the command line field by field) deriving from this class, naming in ``router`` the router
    a capsule layer builds for it, as ``"module:name"`` (imported only then: the options stay torch-free):

    - an ``nn.Module`` class, built with the options and whichever of ``in_caps``, ``in_dim``, ``out_caps``,
      ``out_dim`` (I children of in_dim dimensions, J parents of out_dim) and ``bias`` its constructor
      names, and called as ``router(votes (B, I, J, D), children (B, I, in_dim), child_activations (B, I))``
      returning :class:`capsexp.nn.functional.Routed` (poses, activations in [0, 1], assignment);
    - or a function ``(votes, options) -> Routed``, for a routing without learned parameters.

    The same router routes in every capsule layer, each handing it (B, I, J, D) votes: CapsNet's class
    capsules (I children of in_dim dimensions, the votes W_ij u_i); and the matrix capsules' layers, whose
    poses are 4 x 4 matrices flattened row-major (in_dim = D = 16): a ConvMatrixCapsules layer routes each
    K x K window on its own, the windows of the batch folded into B (I = K*K*input types, the same for
    every window, so that a router's per-child parameters are shared across positions as the layer's W
    are), the class matrix capsules all H*W*input types of the map at once. ``children`` are then the
    children's flattened poses M_i, ``child_activations`` their activations a_i, and the parents' poses
    and activations are the router's as they are: a router of squashed vectors gives each parent the
    length of its squashed pose (Sabour et al. 2017, Eq. 1) as its activation, as in CapsNet.

    ``matrix_router`` names, for a routing that routes the matrix capsules otherwise (EM, VB: children
    shared among overlapping windows, votes made chunk by chunk), the module those layers build instead:
    called as :class:`capsexp.nn.EMRouter` is, with the layer's beta_u and beta_a.

    A package registers its options under the entry point group ``capsexp.routing``, as capsexp registers
    its own (``pyproject.toml``; docs/own_routing.md).

    ``first_iteration_uniform``: the routing's first iteration couples every child to every parent
    equally, so that stopped after it, it is uniform coupling (a verdict then leaves that control out).

    ``coupled_parents``: the routing makes its parents from its couplings as Eq. 1 does (s_j = sum_i c_ij
    u_hat_j|i, v_j = squash(s_j), the activation |v_j|), as the controls of its couplings (shuffled, uniform,
    random: :func:`capsexp.nn.functional.coupled`) make theirs, so that against them the couplings are the one
    change. A routing that makes them otherwise (an M-step's Gaussian, attention's scores) differs from those
    controls in that step too, and a verdict does not read its shuffled arm as the test of whether its
    couplings depend on the image (:func:`capsexp.config.verdict_arms.second_change`)."""

    router: ClassVar[str] = ""
    matrix_router: ClassVar[str] = ""
    first_iteration_uniform: ClassVar[bool] = False
    coupled_parents: ClassVar[bool] = False


@checked
@dataclass(frozen=True)
class DynamicRouting(Routing):
    """How :class:`capsexp.nn.RoutingCapsules` route (Sabour et al. 2017, Procedure 1); the defaults are
    the paper's."""

    router: ClassVar[str] = "capsexp.nn.routers:DynamicRouter"
    first_iteration_uniform: ClassVar[bool] = True  # b_ij = 0: c_ij = 1/J
    coupled_parents: ClassVar[bool] = True  # Procedure 1, line 5

    iterations: PositiveInt = 3
    # false: gradients flow through the agreement updates b += u_hat . v (paper, official code); see
    # capsexp.nn.functional.dynamic_routing.
    detach_agreement: bool = False
    # The paper's CIFAR-10 models: "a none-of-the-above category for the routing softmax" (section 7): one
    # more parent, of routing logit 0, takes its share of each child's coupling and is dropped (the
    # official code's leaky routing). Off for MNIST, as in the paper.
    none_of_the_above: bool = False
    # lambda in b_ij += lambda u_hat_j|i . v_j: an inverse temperature of the routing softmax, since every
    # b_ij is a sum of these updates (1: the paper). Not in the paper or the official code: a knob to ask
    # whether DigitCaps' small agreements at initialisation are why dynamic routing leaves its couplings
    # near uniform (experiments/results/routing_engagement_quick/).
    logit_scale: PositiveFloat = 1.0


@checked
@dataclass(frozen=True)
class EMRouting(Routing):
    """How the EM capsule layers route: the options of Procedure 1 (:func:`~capsexp.nn.functional.em_routing`)
    and capsexp's own. The defaults are capsexp's recipe (docs/em_training.md), the one place it is
    declared; :data:`EM_PAPER` (``model/routing=em_paper``) is the paper's."""

    router: ClassVar[str] = "capsexp.nn.routers:EMVectorRouter"
    matrix_router: ClassVar[str] = "capsexp.nn.matrix_capsules:EMRouter"

    # Paper: 3. Here 2, the fewest that route (1 is a single M-step), as neither fewer nor more does
    # better (experiments/results/em_routing_ablation_quick/).
    iterations: PositiveInt = 2
    # Inverse temperature at the last iteration, lambda_t = final_lambda (1 - 0.95^(t+1)) (the authors'
    # schedule, OpenReview); the paper's final_lambda is 0.01. With standardised costs the spread of the
    # activations is set by lambda alone, so each layer also learns a factor on it (learn_inverse_temperature).
    # Against a smaller fixed final lambda: experiments/results/em_training_quick/.
    final_lambda: PositiveFloat = 10.0
    # Added to every variance. Paper: none given (its recipe here: 1e-4). A floor guards the E-step against
    # near-zero variances when few votes agree (Gritzman 2019, pitfall 1). None: the layer's own floor, which
    # suits its votes' scale: em_routing's MATRIX_FLOOR in the matrix-capsule layers (the arm sigma_eps_1e_4
    # of experiment=em_training compares it with the paper recipe's), capsexp.nn.routers.VECTOR_FLOOR in
    # CapsNet's DigitCaps, whose votes start with variances far below the matrix floor (with that floor it
    # trains far behind every other routing: experiments/results/routing_comparison_quick/, em_default_floor).
    sigma_eps: PositiveFloat | None = None
    # none (paper) | standardize (costs standardised over the parent types of each position, as
    # www0wwwjs1/Matrix-Capsules-EM-Tensorflow does) | data (amount of data relative to the mean parent's,
    # Gritzman 2019, pitfall 2) | layer (amount of data divided by the children per parent,
    # IBM/matrix-capsules-with-em-routing). standardize by default: under layer the ConvCaps activations
    # ignore the input and the net trains worse (experiments/results/em_training_quick/).
    cost_normalization: CostNormalization = "standardize"
    # ConvCaps: false (paper; Gritzman 2019, pitfall 3) shares a child among the parents of all the windows
    # that hold it; true routes each window's children on their own, as most public ports do. No committed
    # run shows either to be better within capsexp's recipe (experiments/results/em_training_quick/).
    route_per_window: bool = True
    # A learned factor s = exp(log_inverse_temperature) on each layer's lambda_t, from 1 (not in the paper).
    learn_inverse_temperature: bool = True
    # false (paper: "backpropagating through the unrolled iterations of EM") lets the gradient of the votes
    # flow through the E-steps' responsibilities too; true makes each E-step's responsibilities constants
    # to the backward pass, as detach_agreement does for dynamic routing. false, as true trains far worse
    # (experiments/results/em_routing_ablation_quick/).
    detach_responsibilities: bool = False
    # The E-step's R_ij proportional to a_j N(V_ij; mu_j, sigma_j^2)^(1/T). Paper: 1. Here 4 (not in the
    # paper): each pose element adds its own log-likelihood term, so at 1 the E-steps sharpen the
    # assignments and accuracy falls with each iteration; at 4 they still route, at no cost the runs
    # detect (experiments/results/em_routing_ablation_quick/).
    e_step_temperature: PositiveFloat = 4.0


@checked
@dataclass(frozen=True)
class UniformRouting(Routing):
    """No routing: every coupling 1/J (:func:`~capsexp.nn.functional.uniform_routing`; Paik et al. 2019's
    baseline). No options."""

    router: ClassVar[str] = "capsexp.nn.routers:UniformRouter"
    coupled_parents: ClassVar[bool] = True


@checked
@dataclass(frozen=True)
class RandomRouting(Routing):
    """Couplings drawn at random at every pass (:func:`~capsexp.nn.functional.random_routing`; Paik et al.
    2019's other baseline). No options."""

    router: ClassVar[str] = "capsexp.nn.routers:RandomRouter"
    coupled_parents: ClassVar[bool] = True


@checked
@dataclass(frozen=True)
class SelfRouting(Routing):
    """Self-routing (Hahn et al. 2019, :func:`~capsexp.nn.functional.self_routing`): each child's couplings
    from its own pose by learned weights, no iterations. No options."""

    router: ClassVar[str] = "capsexp.nn.routers:SelfRouter"


@checked
@dataclass(frozen=True)
class AttentionRouting(Routing):
    """Inverted dot-product attention routing (Tsai et al. 2020, :func:`~capsexp.nn.functional.attention_routing`)."""

    router: ClassVar[str] = "capsexp.nn.routers:AttentionRouter"

    # Passes, the first with uniform coefficients (the parents start at 0). 2: one attention update.
    # apple/ml-capsules-inverted-attention-routing counts the same way (--num_routing, default 1, "recommended:
    # 0,1,2,3").
    iterations: PositiveInt = 2


@checked
@dataclass(frozen=True)
class EfficientRouting(Routing):
    """Efficient-CapsNet's self-attention routing (Mazzia et al. 2021,
    :func:`~capsexp.nn.functional.efficient_routing`): one pass, with learned log priors. No options."""

    router: ClassVar[str] = "capsexp.nn.routers:EfficientRouter"


@checked
@dataclass(frozen=True)
class SinkhornRouting(Routing):
    """Routing as entropy-regularised optimal transport (:func:`~capsexp.nn.functional.sinkhorn_routing`):
    dynamic routing's iterations, each child's mass spread over the parents so that every parent receives
    the same total. Not from a paper."""

    router: ClassVar[str] = "capsexp.nn.routers:SinkhornRouter"
    first_iteration_uniform: ClassVar[bool] = True  # equal costs: the plan m_i / J
    coupled_parents: ClassVar[bool] = True  # each iteration's parents as dynamic routing's

    # Routing iterations, counted as dynamic routing's: the first with uniform couplings.
    iterations: PositiveInt = 3
    # Sinkhorn-Knopp steps per iteration (each a column and a row normalisation).
    balance_iterations: PositiveInt = 10
    # The entropy's weight eps: the couplings are softmax(b / eps + g); at 1 the softmax of dynamic routing.
    epsilon: PositiveFloat = 1.0


@checked
@dataclass(frozen=True)
class VBRouting(Routing):
    """Variational Bayes routing (Ribeiro, Leontidis & Kollias 2020, :func:`~capsexp.nn.functional.vb_routing`):
    EM routing with Dirichlet and Normal-Wishart priors. The defaults are the priors of the authors' code
    (fabio-deep/Variational-Capsule-Routing, src/capsnet.py: alpha0 1, kappa0 1, Psi0 the identity, nu0 D + 1,
    m0 0)."""

    router: ClassVar[str] = "capsexp.nn.routers:VBRouter"
    matrix_router: ClassVar[str] = "capsexp.nn.matrix_capsules:VBMatrixRouter"

    # M-steps; an E-step between each two (the code's routing_iter, 3 in its examples).
    iterations: PositiveInt = 3
    # The Dirichlet prior over the mixing proportions (pseudo-count of every parent).
    alpha0: PositiveFloat = 1.0
    # The Normal prior's precision scaling of the parents' means (their mean m0 is 0).
    kappa0: PositiveFloat = 1.0
    # The Wishart prior's scale Psi0 = psi0 I: each parent's inverse scale Psi0 + its weighted scatter is at
    # least psi0 along every pose element, the variance floor.
    psi0: PositiveFloat = 1.0
    # The Wishart prior's degrees of freedom nu0 = D + nu0_offset for D pose elements (the code's: D + 1);
    # above -1, as the Wishart needs nu0 > D - 1.
    nu0_offset: Annotated[float, Gt(-1)] = 1.0
    # In the matrix-capsule layers (model=em_caps, model=vb_caps): true normalises each window's
    # responsibilities on their own, as the authors' code does (src/vb_routing.py normalises over the parent
    # types of one window); false shares a child's among every parent of every window that holds it, as
    # EM routing's paper does. Nothing in CapsNet's place, which has one window.
    route_per_window: bool = True


# Every routing algorithm's options, built in or a plugin's: the type a capsule layer's ``routing`` takes.
RoutingOptions = Routing


# EM routing as the paper has it (Hinton, Sabour & Frosst 2018, Procedure 1, and the authors' OpenReview
# answers): model/routing=em_paper, and the default of capsexp.nn.functional.em_routing. The paper gives
# no variance floor; 1e-4 keeps log sigma finite when votes agree exactly.
EM_PAPER = EMRouting(
    iterations=3,
    final_lambda=0.01,
    sigma_eps=1e-4,
    cost_normalization="none",
    route_per_window=False,
    learn_inverse_temperature=False,
    detach_responsibilities=False,
    e_step_temperature=1.0,
)
