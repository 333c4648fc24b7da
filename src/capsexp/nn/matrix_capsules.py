"""Matrix-capsule layers (Hinton, Sabour & Frosst 2018, section 4), routed by EM (Procedure 1), by
variational Bayes, or by any router of :mod:`capsexp.nn.routers` (:class:`WindowRouter`).

A capsule map is a pair: poses (N, T, P*P, H, W), T capsule types with a P x P pose matrix each,
and activations (N, T, H, W) in [0, 1].
"""

from __future__ import annotations

import inspect
import math

import torch
import torch.nn.functional as F
from torch import nn

from capsexp.config.routing_options import EMRouting, RoutingOptions, VBRouting
from capsexp.nn.functional import Routed, VoteMaker, em_routing, vb_routing
from capsexp.nn.routers import CLASS_CAPSULE_ACTIVATION, make_router, named

CapsuleMap = tuple[torch.Tensor, torch.Tensor]

# What the class capsules' activations are called where they are a net's class scores (capsexp.use.inference's
# score_kind): as the matrix router declares (``score_kind``), or this where it declares nothing.
EM_ACTIVATION = "EM activation"


def block_diagonal(weight: torch.Tensor) -> torch.Tensor:
    """W (G, J, P, P) as the (G, P*P, J*P*P) matrices :func:`transform` multiplies by: for each group g,
    block[(a', b), (j, a, c)] = [a' = a] W[g, j, b, c], P copies of each W_j along a diagonal."""
    groups, parents, pose_size = weight.shape[:3]
    eye = torch.eye(pose_size, dtype=weight.dtype, device=weight.device)
    return torch.einsum("xy,gjbc->gxbjyc", eye, weight).reshape(groups, pose_size**2, parents * pose_size**2)


def transform(matrices: torch.Tensor, block: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Votes V = M W (section 4) for children that share a transformation matrix per group.

    ``matrices``: (G, R, P*P), the row-major pose matrices of R children in each group g (a kernel
    position and input type, or an input type); ``block``: the group's W_j, (G, J, P, P), as
    :func:`block_diagonal` lays them out. Returns (G, R, J, P*P), written into the flat buffer ``out``
    if given.

    One GEMM per group on a block-diagonal W (P copies of W along the diagonal, so each of the P rows
    of M meets W): 4 times the multiplications of M W for 4x4 poses, but each vote's P*P elements come
    out contiguous, so the copy into the routing's parent-major layout moves 64-byte runs. The plain
    product leaves each vote's rows J * P elements apart, and that copy ran 6 times slower than the
    product itself.
    """
    elements = matrices.shape[-1]
    if out is None:
        votes = torch.bmm(matrices, block)
    else:
        out = out[: matrices.shape[0] * matrices.shape[1] * block.shape[-1]].view(*matrices.shape[:2], -1)
        votes = _ProductInto.apply(matrices, block, (out,))
    return votes.view(*matrices.shape[:2], -1, elements)


class _ProductInto(torch.autograd.Function):
    """torch.bmm written into a given buffer (in a tuple, not an input of the graph), differentiable:
    bmm(out=...) has no graph."""

    @staticmethod
    def forward(ctx, left: torch.Tensor, right: torch.Tensor, out: tuple[torch.Tensor]) -> torch.Tensor:
        ctx.save_for_backward(left, right)
        return torch.bmm(left, right, out=out[0])

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        left, right = ctx.saved_tensors
        grad_left = torch.bmm(grad, right.mT) if ctx.needs_input_grad[0] else None
        grad_right = torch.bmm(left.mT, grad) if ctx.needs_input_grad[1] else None
        return grad_left, grad_right, None


def _grouped(matrices: torch.Tensor) -> torch.Tensor:
    """(b, G, R, P*P) -> (G, b * R, P*P): each group's matrices for :func:`transform`."""
    batch, groups, rows, elements = matrices.shape
    return matrices.transpose(0, 1).reshape(groups, batch * rows, elements)


def conv_votes(matrices: torch.Tensor, block: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """A ConvCaps layer's votes, parent-major (b, Q, J, K*K*I, P*P) (a view), from the poses in each
    window slot, ``matrices`` (b, K*K*I, Q, P*P), and W (K*K*I, J, P, P) as :func:`block_diagonal` lays
    it out; ``out`` as :func:`transform` takes it."""
    batch, slots, positions, elements = matrices.shape
    votes = transform(_grouped(matrices), block, out)  # (K*K*I, b*Q, J, P*P)
    return votes.view(slots, batch, positions, -1, elements).permute(1, 2, 3, 0, 4)


def class_votes(
    matrices: torch.Tensor, block: torch.Tensor, *offsets: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """The class capsules' votes, parent-major (b, 1, J, H*W*I, P*P) (children numbered (h, w, i)), from
    the poses ``matrices`` (b, I, H*W, P*P) and W (I, J, P, P) as :func:`block_diagonal` lays it out,
    plus ``offsets`` (H*W, P*P) if given (coordinate addition); ``out`` as :func:`transform` takes it."""
    batch, in_types, positions, elements = matrices.shape
    parents = block.shape[-1] // elements
    votes = transform(_grouped(matrices), block, out).view(in_types, batch, positions, parents, elements)
    votes = votes.permute(1, 3, 2, 0, 4)  # (b, J, H*W, I, P*P)
    if offsets:
        votes = votes + offsets[0].view(1, 1, positions, 1, elements)
    return votes.reshape(batch, 1, parents, positions * in_types, elements)


class PrimaryMatrixCapsules(nn.Module):
    """1x1 convolutions: a P x P pose and a sigmoid activation for each of ``num_types`` types.

    ``norm``: batch-normalise each type's poses (over the batch, its pose elements and the positions) and
    its activation logits, with learned scale and shift, as the variational Bayes routing authors'
    PrimaryCapsules2d does (fabio-deep/Variational-Capsule-Routing, src/layers.py); not in the EM paper.
    """

    def __init__(self, in_channels: int, num_types: int, pose_size: int = 4, norm: bool = False) -> None:
        super().__init__()
        self.num_types, self.pose_elements = num_types, pose_size * pose_size
        self.pose = nn.Conv2d(in_channels, num_types * self.pose_elements, kernel_size=1)
        self.activation = nn.Conv2d(in_channels, num_types, kernel_size=1)
        self.pose_norm = nn.BatchNorm3d(num_types) if norm else nn.Identity()
        self.activation_norm = nn.BatchNorm2d(num_types) if norm else nn.Identity()

    def forward(self, features: torch.Tensor) -> CapsuleMap:
        batch, _, height, width = features.shape
        poses = self.pose_norm(self.pose(features).view(batch, self.num_types, self.pose_elements, height, width))
        return poses, torch.sigmoid(self.activation_norm(self.activation(features)))


class EMRouter(nn.Module):
    """EM routing (Procedure 1, :func:`~capsexp.nn.functional.em_routing`) under fixed options, as a
    module: its forward returns the responsibilities too (computed anyway), so that a forward hook can
    see what routing did without the layers knowing of it (capsexp.callbacks.routing_diagnostics)."""

    score_kind = EM_ACTIVATION

    def __init__(self, routing: EMRouting) -> None:
        super().__init__()
        self.routing = routing

    def forward(
        self, votes: torch.Tensor, activations: torch.Tensor, beta_u: torch.Tensor, beta_a: torch.Tensor, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(mu, parent activations, responsibilities)``; ``kwargs`` as :func:`em_routing` takes them."""
        return em_routing(votes, activations, beta_u, beta_a, self.routing, return_responsibilities=True, **kwargs)

    def extra_repr(self) -> str:
        return repr(self.routing)


class VBMatrixRouter(nn.Module):
    """Variational Bayes routing (Ribeiro et al. 2020, :func:`~capsexp.nn.functional.vb_routing`) in a
    matrix-capsule layer, as the authors' VariationalBayesRouting2d ends: the posterior mean poses
    batch-normalised per parent type (over the batch, the positions and the pose elements), the activations
    sigmoid(batch norm of the logits) per parent type, both normalisations without learned scale or shift.
    Called as :class:`EMRouter` is, and returns what it returns."""

    score_kind = "VB activation"

    def __init__(self, routing: VBRouting, out_types: int) -> None:
        super().__init__()
        self.routing = routing
        self.pose_norm = nn.BatchNorm1d(out_types, affine=False)
        self.activation_norm = nn.BatchNorm1d(out_types, affine=False)

    def forward(
        self, votes: VoteMaker, activations: torch.Tensor, beta_u: torch.Tensor, beta_a: torch.Tensor, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(poses (B, Q, J, P*P), activations (B, Q, J), responsibilities)``; ``kwargs``: child_index,
        num_children, as :func:`~capsexp.nn.functional.vb_routing` takes them."""
        mean, logits, responsibilities = vb_routing(votes, activations, beta_u, beta_a, self.routing, **kwargs)
        dense = mean.ndim == 3  # the class capsules: (B, J, P*P)
        if dense:
            mean, logits = mean.unsqueeze(1), logits.unsqueeze(1)
        batch, positions, types, elements = mean.shape
        dtype = votes.batched[0].dtype
        poses = self.pose_norm(mean.permute(0, 2, 1, 3).reshape(batch, types, positions * elements))
        poses = poses.view(batch, types, positions, elements).permute(0, 2, 1, 3).to(dtype)
        activations = torch.sigmoid(self.activation_norm(logits.transpose(1, 2))).transpose(1, 2).to(dtype)
        if dense:
            poses, activations = poses[:, 0], activations[:, 0]
        return poses, activations, responsibilities

    def extra_repr(self) -> str:
        return repr(self.routing)


class WindowRouter(nn.Module):
    """A router of CapsNet's kind (:func:`~capsexp.nn.routers.make_router`: votes (B, I, J, D) in,
    :class:`~capsexp.nn.functional.Routed` out) in a matrix-capsule layer, its poses flattened (D = P*P).

    Built for I = ``in_caps`` children of P*P dimensions and J = ``out_types`` parents of P*P. Called on a
    convolutional layer's votes (B, Q, I, J, P*P), one window of I slots at each of Q positions, it routes
    every window on its own (the windows folded into the batch) and returns poses (B, Q, J, P*P),
    activations (B, Q, J) and the assignment (B, Q, I, J), the layout EM's returns; on the class capsules'
    (B, I, J, P*P) it is the router itself. ``child_index`` and ``num_children`` are the slots' layout for
    whoever hooks the router (each slot a child of its own, as EM's ``route_per_window``); routing does
    not read them.
    """

    def __init__(self, routing: RoutingOptions, in_caps: int | None, out_types: int, pose_size: int) -> None:
        super().__init__()
        self.routing = routing
        self.router = make_router(routing, in_caps, pose_size**2, out_types, pose_size**2)

    @property
    def score_kind(self) -> str:
        """What its activations are called where they are a net's class scores: as the router it wraps
        declares (a capsule length for dynamic routing's)."""
        return getattr(self.router, "score_kind", CLASS_CAPSULE_ACTIVATION)

    def forward(
        self,
        votes: torch.Tensor,
        children: torch.Tensor,
        child_activations: torch.Tensor,
        child_index: torch.Tensor | None = None,
        num_children: int | None = None,
    ) -> Routed:
        if votes.ndim == 4:
            return self.router(votes, children, child_activations)
        windows = votes.shape[:2]
        routed = self.router(votes.flatten(0, 1), children.flatten(0, 1), child_activations.flatten(0, 1))
        return Routed(*(None if part is None else part.unflatten(0, windows) for part in routed))


class _EMLayer(nn.Module):
    """What the matrix-capsule layers share: the routing, by the router its options name. A routing that
    names a ``matrix_router`` (:class:`EMRouting`: :class:`EMRouter`; :class:`VBRouting`, variational
    Bayes routing: :class:`VBMatrixRouter`) routes by it, with beta_u, beta_a learned per parent type;
    any other by its CapsNet router, in a :class:`WindowRouter` built for ``in_caps`` children per window
    (None: not known, refused by a router that needs it).

    ``weight_std``: the transformation matrices W start as N(0, weight_std^2); None gives the routing's own
    (:meth:`new_weight`): 1/sqrt(P), which keeps the votes V = M W at the scale of the poses M (each entry
    sums P products); under VB routing the authors' smaller Xavier std.
    ``routing.learn_inverse_temperature``: a learned scalar s = exp(log_inverse_temperature), starting at 1,
    multiplies the layer's inverse temperatures lambda_t, so that each layer sets how sharply its
    activations separate (not in the paper).
    """

    def __init__(
        self,
        out_types: int,
        pose_size: int,
        routing: RoutingOptions,
        weight_std: float | None = None,
        in_caps: int | None = None,
    ) -> None:
        super().__init__()
        self.pose_size, self.out_types = pose_size, out_types
        self.weight_std = weight_std
        self.routing = routing
        if not type(routing).matrix_router:
            self.router = WindowRouter(routing, in_caps, out_types, pose_size)
            self.beta_u = self.beta_a = self.log_inverse_temperature = None
            return
        router = named(type(routing).matrix_router)
        sizes = {"out_types": out_types} if "out_types" in inspect.signature(router).parameters else {}
        self.router = router(routing, **sizes)
        self.beta_u = nn.Parameter(torch.zeros(out_types))
        self.beta_a = nn.Parameter(torch.zeros(out_types))
        learned = getattr(routing, "learn_inverse_temperature", False)
        self.log_inverse_temperature = nn.Parameter(torch.zeros(())) if learned else None

    def _route(self, votes: VoteMaker, activations: torch.Tensor, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        if self.log_inverse_temperature is not None:
            kwargs["inverse_temperature_scale"] = self.log_inverse_temperature.exp()
        mu, parent_activations, _ = self.router(votes, activations, self.beta_u, self.beta_a, **kwargs)
        return mu, parent_activations

    def new_weight(self, *leading: int) -> nn.Parameter:
        """W (*leading, P, P), ``leading`` = (kernel positions, input types, output types) or (input types,
        output types), N(0, std^2): ``weight_std`` where given; else 1/sqrt(P) under EM routing, and under VB
        routing the std of the authors' Xavier-uniform initialisation, sqrt(2 / (fan_in + fan_out)) with
        fan_in = kernel positions x input types x P^2 and fan_out = kernel positions x output types x P^2
        (fabio-deep/Variational-Capsule-Routing, src/layers.py ConvCapsules2d): with EM's 1/sqrt(P), 6 to 24
        times larger, model=vb_caps stayed at chance on MNIST."""
        std = self.weight_std
        if std is None and isinstance(self.router, VBMatrixRouter):
            kernel = leading[0] if len(leading) == 3 else 1
            elements = self.pose_size**2
            std = math.sqrt(2.0 / (math.prod(leading[:-1]) * elements + kernel * leading[-1] * elements))
        elif std is None:
            std = 1.0 / math.sqrt(self.pose_size)
        return nn.Parameter(torch.randn(*leading, self.pose_size, self.pose_size) * std)


class ConvMatrixCapsules(_EMLayer):
    """ConvCaps: votes V_ij = M_i W_ij from every child in a K x K window, routed to the parents.

    One W per (kernel position, input type, output type), shared across positions. Under EM routing a
    child under several overlapping windows is shared among all their parents: its responsibilities sum
    to 1 over all of them (``child_index`` in :func:`~capsexp.nn.functional.em_routing`);
    ``routing.route_per_window`` routes each window's children on their own instead, as every routing
    without a matrix router of its own does (:class:`WindowRouter`). No padding, as in the paper.
    """

    def __init__(
        self,
        in_types: int,
        out_types: int,
        kernel_size: int = 3,
        stride: int = 1,
        pose_size: int = 4,
        routing: RoutingOptions = EMRouting(),
        weight_std: float | None = None,
    ) -> None:
        super().__init__(out_types, pose_size, routing, weight_std, in_caps=kernel_size * kernel_size * in_types)
        self.in_types, self.kernel_size, self.stride = in_types, kernel_size, stride
        self.weight = self.new_weight(kernel_size * kernel_size, in_types, out_types)

    def output_size(self, size: int) -> int:
        return (size - self.kernel_size) // self.stride + 1

    def _unfold(self, maps: torch.Tensor) -> torch.Tensor:
        """(N, C, H, W) -> (N, Q, K*K, C): the K x K windows, one per output position q."""
        batch, channels = maps.shape[:2]
        patches = F.unfold(maps, self.kernel_size, stride=self.stride)  # (N, C*K*K, Q)
        return patches.view(batch, channels, self.kernel_size**2, -1).permute(0, 3, 2, 1)

    def child_index(self, height: int, width: int, device: torch.device) -> torch.Tensor:
        """(Q, K*K*I): the child (input type i at position (h, w), numbered i*H*W + h*W + w) in each slot."""
        ids = torch.arange(self.in_types * height * width, device=device, dtype=torch.float64)
        windows = self._unfold(ids.view(1, self.in_types, height, width))[0]  # (Q, K*K, I)
        return windows.reshape(windows.shape[0], -1).long()

    def forward(self, poses: torch.Tensor, activations: torch.Tensor) -> CapsuleMap:
        batch, in_types, elements, height, width = poses.shape
        patches = F.unfold(
            poses.reshape(batch, in_types * elements, height, width), self.kernel_size, stride=self.stride
        )
        positions, slots = patches.shape[-1], self.kernel_size**2 * in_types
        # The poses in each (kernel position, input type) slot of every window: (N, K*K*I, Q, P*P).
        matrices = patches.view(batch, in_types, elements, self.kernel_size**2, positions).permute(0, 3, 1, 4, 2)
        matrices = matrices.reshape(batch, slots, positions, elements)
        block = block_diagonal(self.weight.flatten(0, 1))
        child_index, child_activations = self.child_index(height, width, poses.device), activations.reshape(batch, -1)
        windowed = isinstance(self.router, WindowRouter)
        if windowed or self.routing.route_per_window:
            # Every (window, slot) is a child of its own: R sums to 1 over the parent types of one
            # position, as in most public ports (Gritzman 2019's pitfall 3; the paper shares them).
            child_activations = child_activations[:, child_index.reshape(-1)]
            child_index = torch.arange(child_index.numel(), device=poses.device).view_as(child_index)
        layout = {"child_index": child_index, "num_children": child_activations.shape[1]}
        if windowed:
            # Window q's slot s: its child's pose M_i (N, Q, K*K*I, P*P) and votes (N, Q, K*K*I, J, P*P).
            routed = self.router(
                conv_votes(matrices, block).transpose(2, 3),
                matrices.transpose(1, 2),
                child_activations.view(batch, positions, slots),
                **layout,
            )
            mu, parent_activations = routed.poses, routed.activations
        else:
            votes = VoteMaker(conv_votes, (matrices,), (block,), (positions, self.out_types, slots, elements))
            mu, parent_activations = self._route(votes, child_activations, **layout)
        out_height, out_width = self.output_size(height), self.output_size(width)
        mu = mu.view(batch, out_height, out_width, self.out_types, elements).permute(0, 3, 4, 1, 2)
        parent_activations = parent_activations.view(batch, out_height, out_width, self.out_types).permute(0, 3, 1, 2)
        return mu.contiguous(), parent_activations.contiguous()


class ClassMatrixCapsules(_EMLayer):
    """Class capsules: one W per input type, shared across positions, with coordinate addition.

    Every child (h, w, i) of the H x W map of I input types is routed to the classes at once, by EM or
    VB routing, or by a router of CapsNet's kind built for ``in_positions`` x I children (``in_positions``
    = H * W; needed only by a router with per-child parameters).

    Coordinate addition (section 4): the scaled (row, column) of the centre of each child's receptive
    field is added to the first two elements of the right-hand column of its vote matrix, so the class
    poses keep where the parts were. ``centres``: (H, W, 2) scaled centres; by default those of a plain
    grid, ((h + 0.5) / H, (w + 0.5) / W). :class:`~capsexp.models.MatrixCapsNet` passes the true ones.
    """

    def __init__(
        self,
        in_types: int,
        num_classes: int,
        pose_size: int = 4,
        routing: RoutingOptions = EMRouting(),
        coordinate_addition: bool = True,
        weight_std: float | None = None,
        in_positions: int | None = None,
    ) -> None:
        in_caps = None if in_positions is None else in_positions * in_types
        try:
            super().__init__(num_classes, pose_size, routing, weight_std, in_caps=in_caps)
        except ValueError as error:
            if in_positions is not None:
                raise
            raise ValueError(
                f"ClassMatrixCapsules with {type(routing).__name__}: its router has parameters per child; "
                "pass in_positions=H*W, the positions of the input map"
            ) from error
        self.in_positions = in_positions
        self.coordinate_addition = coordinate_addition
        self.weight = self.new_weight(in_types, num_classes)

    @property
    def score_kind(self) -> str:
        """What its activations are called where they are a net's class scores: as its matrix router declares
        (``router.score_kind``: an EM activation for :class:`EMRouter`, a VB activation for
        :class:`VBMatrixRouter`, the wrapped router's for :class:`WindowRouter`), :data:`EM_ACTIVATION` for
        a router that declares nothing."""
        return getattr(self.router, "score_kind", EM_ACTIVATION)

    @staticmethod
    def grid_centres(height: int, width: int, device: torch.device | None = None) -> torch.Tensor:
        rows = (torch.arange(height, device=device) + 0.5) / height
        cols = (torch.arange(width, device=device) + 0.5) / width
        return torch.stack(torch.meshgrid(rows, cols, indexing="ij"), dim=-1)

    def vote_maker(self, poses: torch.Tensor, centres: torch.Tensor | None = None) -> VoteMaker:
        """How the votes V = M W (plus coordinate addition) of poses (N, I, P*P, H, W) are made:
        :func:`class_votes` of the poses, W and the offsets."""
        batch, in_types, elements, height, width = poses.shape
        matrices = poses.reshape(batch, in_types, elements, height * width).transpose(2, 3)
        shared = (block_diagonal(self.weight),)
        if self.coordinate_addition:
            if centres is None:
                centres = self.grid_centres(height, width, poses.device)
            offsets = poses.new_zeros(height, width, self.pose_size, self.pose_size)
            offsets[..., 0, -1], offsets[..., 1, -1] = centres[..., 0], centres[..., 1]
            shared += (offsets.view(height * width, elements),)
        return VoteMaker(class_votes, (matrices,), shared, (1, self.out_types, height * width * in_types, elements))

    def votes(self, poses: torch.Tensor, centres: torch.Tensor | None = None) -> torch.Tensor:
        """V = M W plus coordinate addition for poses (N, I, P*P, H, W): (N, J, H, W, I, P, P), parent-major."""
        batch, in_types, _, height, width = poses.shape
        maker = self.vote_maker(poses, centres)
        votes = maker.make(*maker.batched, *maker.shared)
        return votes.view(batch, self.out_types, height, width, in_types, self.pose_size, self.pose_size)

    def forward(
        self, poses: torch.Tensor, activations: torch.Tensor, centres: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # Children numbered (h, w, i).
        batch, in_types, elements, height, width = poses.shape
        child_activations = activations.permute(0, 2, 3, 1).reshape(batch, -1)
        maker = self.vote_maker(poses, centres)
        if not isinstance(self.router, WindowRouter):
            return self._route(maker, child_activations)
        if self.in_positions is not None and height * width != self.in_positions:
            raise ValueError(
                f"ClassMatrixCapsules was built for in_positions={self.in_positions}, given a {height}x{width} map"
            )
        votes = maker.make(*maker.batched, *maker.shared)[:, 0].transpose(1, 2)  # (N, H*W*I, J, P*P)
        children = maker.batched[0].transpose(1, 2).reshape(batch, height * width * in_types, elements)
        routed = self.router(votes, children, child_activations)
        return routed.poses, routed.activations
