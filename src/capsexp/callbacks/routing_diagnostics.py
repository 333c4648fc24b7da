"""What routing does during training, in TensorBoard: the quantities that tell a stuck run.

Every ``every_n_steps`` training steps, for each routing layer of the net: the EM capsule layers
(``conv_caps1``, ``conv_caps2``, ``class_caps``) and CapsNet's ``digits``, whatever its algorithm:

- ``routing/<layer>/entropy``: mean entropy of each child's assignment (responsibilities, couplings) over
  the parents that receive it, divided by its maximum (1: uniform, routing undecided; 0: hard
  assignments). A value near 0 after the first E-step is the collapse that stalls EM training (see
  docs/em_training.md);
- ``routing/<layer>/largest_coupling``, ``kl_from_uniform`` and ``decided_share``: how far the assignments
  are from uniform, where the entropy moves little (:func:`~capsexp.nn.functional.routing_engagement`): the
  mean largest share a child gives one parent (1/P uniform), the mean KL divergence from uniform (nats, 0
  uniform) and the share of children whose largest share exceeds twice uniform;
- ``routing/<layer>/test_predicted_share``, after testing, for a layer whose parents are the classes: the
  mean share of each child's assignment that goes to the class the layer's activations predict (1/J when
  routing ignores the prediction);
- after testing, on the plain test set (the first), how far the assignments depend on the image, against
  the same child's in another image (``test_image_dependence``, :func:`~capsexp.nn.functional.image_dependence`:
  0 for couplings that are the same for every image) beside their distance from uniform
  (``test_uniform_distance``), for layers with one assignment per child; and the share of the layer's
  capsules never active on any test image (activation never above :data:`DEAD_ACTIVATION`), its children
  (``test_dead_children``) and its parents (``test_dead_parents``), each capsule a type at a position;
- ``routing/<layer>/activation_mean`` and ``activation_std``: parent activations over all capsules
  and inputs (all near 0.5 means the sigmoid argument is too small to tell parents apart);
- ``routing/<layer>/activation_std_across_inputs``: the std of each capsule's (parent type at one
  position) activation over the batch's inputs, averaged over capsules: near 0 means an activation
  that does not depend on the input, whatever its spread over capsules;
- ``routing/<layer>/inverse_temperature_scale``: the learned factor on the layer's inverse
  temperatures, where it learns one (``learn_inverse_temperature``);
- ``grad_norm/<layer>``: norm of the gradient of the layer's parameters (which layer's vanish);
- histograms ``routing/<layer>/activations`` and ``routing/<layer>/entropy``.

A no-op for nets without routing layers (LeNet5), so it sits in the default callbacks.
"""

from __future__ import annotations

import functools

import lightning as L
import torch
from pydantic import PositiveInt

from capsexp.callbacks.image_logging import tensorboard_writer
from capsexp.config.arguments import checked
from capsexp.models.inspection import routing_layers
from capsexp.nn.functional import (
    image_dependence,
    predicted_share,
    responsibility_entropy,
    routing_engagement,
    uniform_distance,
)
from capsexp.nn.routers import Watch, watch

# routing_engagement's measures and the tags they are logged under
ENGAGEMENT = {"largest": "largest_coupling", "kl_from_uniform": "kl_from_uniform", "decided": "decided_share"}
# A capsule is dead where its activation (in [0, 1]) stays at or below this on every test image.
DEAD_ACTIVATION = 0.01


@checked
class RoutingDiagnostics(L.Callback):
    """Written straight to TensorBoard (rank zero) at the step it was measured, whatever
    ``trainer.log_every_n_steps`` is; ``histograms=False`` keeps only the scalars."""

    def __init__(self, every_n_steps: PositiveInt = 100, histograms: bool = True) -> None:
        self.every_n_steps, self.histograms = every_n_steps, histograms
        self._step: int | None = None  # the step being recorded, or None
        self._grad_norms: dict[str, float] = {}
        self._routing: dict[str, dict[str, torch.Tensor]] = {}  # per layer, from the watch on its router
        self._hooks: list[Watch] = []
        self._test_shares: dict[str, list[float]] = {}  # per class layer: [sum of shares, count]
        self._test_hooks: list[Watch] = []
        self._plain_test = False  # whether the test batch being routed is of the plain (first) test set
        self._test_sums: dict[str, dict[str, list]] = {}  # per layer: measure -> [sum (a tensor), count]
        self._test_peaks: dict[str, dict[str, torch.Tensor]] = {}  # per layer: children/parents -> largest activation

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int) -> None:
        layers = routing_layers(pl_module)
        due = bool(layers) and trainer.global_step % self.every_n_steps == 0 and tensorboard_writer(trainer) is not None
        self._step, self._grad_norms, self._routing = (trainer.global_step if due else None), {}, {}
        if due:  # a watch on each layer's router, for this step only
            self._hooks = [
                watch(layer.router, functools.partial(self._keep, name), with_kwargs=True)
                for name, layer in layers.items()
            ]

    def _keep(self, name: str, router: torch.nn.Module, args, kwargs, output) -> None:
        """What the router of layer ``name`` did: parent activations and the normalised entropy of
        the responsibilities, detached."""
        _, parent_activations, responsibilities = output
        with torch.no_grad():
            layout = (kwargs.get("child_index"), kwargs.get("num_children"))
            engagement = routing_engagement(responsibilities.detach(), *layout)
            self._routing[name] = {
                "activations": parent_activations.detach(),
                "entropy": responsibility_entropy(responsibilities.detach(), *layout),
                **{measure: value for measure, value in zip(ENGAGEMENT, engagement, strict=True)},
            }

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule, optimizer) -> None:
        if self._step is None:
            return
        for name, layer in routing_layers(pl_module).items():
            grads = [p.grad.detach().float() for p in layer.parameters() if p.grad is not None]
            if grads:
                self._grad_norms[name] = torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])).item()

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int
    ) -> None:
        if self._step is None:
            return
        step, self._step = self._step, None
        for hook in self._hooks:
            hook.remove()
        self._hooks, recorded, self._routing = [], self._routing, {}
        writer = tensorboard_writer(trainer)
        for name, layer in routing_layers(pl_module).items():
            routing = recorded.get(name)
            if name in self._grad_norms:
                writer.add_scalar(f"grad_norm/{name}", self._grad_norms[name], step)
            log_inverse_temperature = getattr(layer, "log_inverse_temperature", None)
            if log_inverse_temperature is None:  # an EM router in CapsNet's place keeps its own
                log_inverse_temperature = getattr(layer.router, "log_inverse_temperature", None)
            if log_inverse_temperature is not None:
                scale = log_inverse_temperature.detach().exp().item()
                writer.add_scalar(f"routing/{name}/inverse_temperature_scale", scale, step)
            if routing is None:
                continue
            activations, entropy = routing["activations"].float().cpu(), routing["entropy"].float().cpu()
            writer.add_scalar(f"routing/{name}/entropy", entropy.mean().item(), step)
            for measure, tag in ENGAGEMENT.items():
                writer.add_scalar(f"routing/{name}/{tag}", routing[measure].float().mean().item(), step)
            writer.add_scalar(f"routing/{name}/activation_mean", activations.mean().item(), step)
            writer.add_scalar(f"routing/{name}/activation_std", activations.std().item(), step)
            if activations.shape[0] > 1:
                across_inputs = activations.std(dim=0).mean().item()
                writer.add_scalar(f"routing/{name}/activation_std_across_inputs", across_inputs, step)
            if self.histograms:
                writer.add_histogram(f"routing/{name}/activations", activations, step)
                writer.add_histogram(f"routing/{name}/entropy", entropy, step)

    # ---- at test time: does each child send its mass to the class the layer predicts? ----------
    def on_test_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        layers = routing_layers(pl_module) if tensorboard_writer(trainer) is not None else {}
        self._test_shares = {name: [0.0, 0.0] for name in layers}
        self._test_sums = {name: {} for name in layers}
        self._test_peaks = {name: {} for name in layers}
        self._test_hooks = [
            watch(layer.router, functools.partial(self._share, name), with_kwargs=True)
            for name, layer in layers.items()
        ]

    def on_test_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._plain_test = dataloader_idx == 0

    def _share(self, name: str, router: torch.nn.Module, args, kwargs, output) -> None:
        _, parent_activations, assignment = output
        if self._plain_test:
            # The children's activations: a router of vector capsules (and WindowRouter) takes (votes, children,
            # child_activations); a matrix router (EMRouter, VBMatrixRouter) (votes, activations, beta_u, beta_a).
            children = args[2] if len(args) == 3 else args[1]
            self._measure(
                name, children, parent_activations, assignment, kwargs.get("child_index"), kwargs.get("num_children")
            )
        if kwargs.get("child_index") is not None or parent_activations.ndim != 2:
            return  # a convolutional layer's parents are not the classes
        with torch.no_grad():
            shares = predicted_share(assignment.detach(), parent_activations.detach().argmax(dim=-1))
        total = self._test_shares[name]
        total[0], total[1] = total[0] + shares.sum().item(), total[1] + shares.numel()

    @torch.no_grad()
    def _measure(
        self,
        name: str,
        child_activations: torch.Tensor,
        parent_activations: torch.Tensor,
        assignment: torch.Tensor | None,
        child_index: torch.Tensor | None,
        num_children: int | None,
    ) -> None:
        """The plain test set's image dependence and distance from uniform (summed), and each capsule's
        largest activation so far."""
        sums = self._test_sums[name]
        if assignment is not None and child_index is None and assignment.ndim == 3:
            for measure, values in (
                ("test_image_dependence", image_dependence(assignment)),
                ("test_uniform_distance", uniform_distance(assignment)),
            ):
                total = sums.setdefault(measure, [0.0, 0])  # a tensor sum: no device sync until the epoch ends
                total[0], total[1] = total[0] + values.sum(), total[1] + values.numel()
        children = child_activations.detach().float().flatten(1)
        if child_index is not None and children.shape[1] == child_index.numel():  # per window slot: each child once
            count = num_children or int(child_index.max()) + 1
            children = children.new_zeros(len(children), count).scatter_reduce(
                1, child_index.reshape(1, -1).expand(len(children), -1), children, reduce="amax"
            )
        peaks = self._test_peaks[name]
        for side, activations in (("children", children), ("parents", parent_activations.detach().float().flatten(1))):
            largest = activations.amax(dim=0)
            peaks[side] = largest if side not in peaks else torch.maximum(peaks[side], largest)

    def on_test_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        for hook in self._test_hooks:
            hook.remove()
        self._test_hooks = []
        writer = tensorboard_writer(trainer)
        if writer is None:
            return
        step = trainer.global_step
        for name, (total, count) in self._test_shares.items():
            if count:
                writer.add_scalar(f"routing/{name}/test_predicted_share", total / count, step)
        for name, sums in self._test_sums.items():
            for measure, (total, count) in sums.items():
                if count:
                    writer.add_scalar(f"routing/{name}/{measure}", float(total) / count, step)
        for name, peaks in self._test_peaks.items():
            for side, largest in peaks.items():
                dead = (largest <= DEAD_ACTIVATION).float().mean().item()
                writer.add_scalar(f"routing/{name}/test_dead_{side}", dead, step)
