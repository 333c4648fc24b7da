"""What routing did on validation images, in TensorBoard, at every validation.

On the first ``num_images`` images of the validation set, after the validation (one forward pass):

Each :class:`~capsexp.nn.RoutingCapsules` layer (e.g. CapsNet's ``digits``), under dynamic routing:

- ``routing/<layer>/logit_change_iter<r>``: the mean absolute change of the routing logits b_ij made by
  iteration r's agreement update u_hat . v (Sabour et al. 2017, Appendix A, follows the logits'
  change); ``update_change_iter<r>``: the mean absolute difference between iteration r's update and
  iteration r - 1's, which falls to 0 as the parents settle; ``coupling_change_iter<r>``: the mean
  absolute change of the couplings c_ij from iteration r - 1 to r
  (:func:`capsexp.nn.functional.dynamic_routing_trace`);
- figure ``routing/<layer>/couplings``: one heat map per class, titled by the class's name (the data's
  ``class_names`` where it has them), over the primary capsules' grid: the coupling coefficient c_ij
  of each primary capsule to that class's capsule (last iteration), averaged over the capsule types and
  over the images of that class, on one colour scale centred at the uniform coupling 1/J (white), red
  above it and blue below, with a colour bar. Under another algorithm
  (``model/routing=<name>``) only this image, of the weight the algorithm gives each child's vote.

EM routing (each :class:`~capsexp.nn.ClassMatrixCapsules` layer, the class capsules):

- histograms ``routing/<layer>/activation_present`` and ``activation_absent``: the class capsules'
  activations for the class in the image and for the others (Hinton et al. 2018: near 1 and near 0);
- histogram ``routing/<layer>/responsibility_to_present``: each child's responsibility toward the
  class in the image (the share of its vote that the right class explains);
- figure ``routing/<layer>/responsibilities``: as the couplings figure, over the grid of the class
  capsules' children (ConvCaps2's positions): each child's responsibility R_ij to that class, averaged
  over the child types and over the images of that class, centred at the uniform 1/J.

A no-op for nets without these layers (LeNet5). Off with ``callbacks.routing_figures=null``.
"""

from __future__ import annotations

import functools
import itertools

import lightning as L
import torch
import torch.nn.functional as F
from pydantic import PositiveInt

from capsexp.callbacks.image_logging import tensorboard_writer
from capsexp.config.arguments import checked
from capsexp.figures.couplings import class_coupling_maps, coupling_figure
from capsexp.nn import ClassMatrixCapsules, DynamicRouting, PrimaryCapsules, RoutingCapsules
from capsexp.nn.routers import watch


@checked
class RoutingFigures(L.Callback):
    """The figures above, from the first ``num_images`` images of each validation (one more forward
    pass of them after the validation), written by rank zero at the step of the validation."""

    def __init__(self, num_images: PositiveInt = 64) -> None:
        self.num_images = num_images
        self._batch: tuple[torch.Tensor, torch.Tensor] | None = None

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        if batch_idx == 0 and dataloader_idx == 0:
            targets = batch[1][: self.num_images].detach()
            # With several objects per image, the first is the one shown.
            self._batch = (batch[0][: self.num_images].detach(), targets if targets.ndim == 1 else targets[:, 0])

    @torch.no_grad()
    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        writer = tensorboard_writer(trainer)
        net = getattr(pl_module, "net", pl_module)
        fully_connected = {name: m for name, m in net.named_modules() if isinstance(m, RoutingCapsules)}
        em = {name: m for name, m in net.named_modules() if isinstance(m, ClassMatrixCapsules)}
        if trainer.sanity_checking or writer is None or self._batch is None or not (fully_connected or em):
            return
        images, labels = self._batch
        captured: dict[str, tuple] = {}
        hooks = [
            layer.register_forward_hook(functools.partial(_keep_input_and_output, captured, name))
            for name, layer in fully_connected.items()
        ]
        hooks += [watch(layer.router, functools.partial(_keep_output, captured, name)) for name, layer in em.items()]
        try:
            pl_module(images)
        finally:
            for hook in hooks:
                hook.remove()
        step = trainer.global_step
        primary = next((m for m in net.modules() if isinstance(m, PrimaryCapsules)), None)
        for name, layer in fully_connected.items():
            children, routed = captured[name]
            if isinstance(layer.routing, DynamicRouting):  # fused: its couplings are traced from the votes
                trace = layer.dynamic_routing_trace(children)
                for r, change in enumerate(trace.logit_changes.tolist(), start=1):
                    writer.add_scalar(f"routing/{name}/logit_change_iter{r}", change, step)
                for r, change in enumerate(trace.update_changes.tolist(), start=2):
                    writer.add_scalar(f"routing/{name}/update_change_iter{r}", change, step)
                for r, change in enumerate(trace.coupling_changes.tolist(), start=2):
                    writer.add_scalar(f"routing/{name}/coupling_change_iter{r}", change, step)
                couplings = trace.couplings[-1]
            else:  # the weight of each child's vote in each parent, as the pass just made set it
                couplings = routed.assignment
                by_iteration = layer.routed_by_iteration(children)
                for r, (previous, current) in enumerate(itertools.pairwise(by_iteration), start=2):
                    pose_change = (current.poses - previous.poses).abs().mean().item()
                    writer.add_scalar(f"routing/{name}/pose_change_iter{r}", pose_change, step)
                    coupling_change = (current.assignment - previous.assignment).abs().mean().item()
                    writer.add_scalar(f"routing/{name}/coupling_change_iter{r}", coupling_change, step)
            if primary is not None:
                maps = class_coupling_maps(couplings, labels, primary.num_types)
                writer.add_figure(
                    f"routing/{name}/couplings", coupling_figure(maps, _class_names(trainer, maps.shape[0])), step
                )
        for name in em:
            _, activations, responsibilities = captured[name]
            present = F.one_hot(labels, activations.shape[-1]).bool()
            writer.add_histogram(f"routing/{name}/activation_present", activations[present].float().cpu(), step)
            writer.add_histogram(f"routing/{name}/activation_absent", activations[~present].float().cpu(), step)
            to_present = responsibilities.gather(-1, labels[:, None, None].expand(-1, responsibilities.shape[1], 1))
            writer.add_histogram(f"routing/{name}/responsibility_to_present", to_present.float().cpu(), step)
            # Children numbered (h, w, i): position-major, the types innermost.
            in_types = em[name].weight.shape[0]
            maps = class_coupling_maps(responsibilities, labels, in_types, types_innermost=True)
            figure = coupling_figure(
                maps, _class_names(trainer, maps.shape[0]), "mean responsibility to the class", "child position"
            )
            writer.add_figure(f"routing/{name}/responsibilities", figure, step)


def _class_names(trainer: L.Trainer, classes: int) -> list[str]:
    """The data's class names where it has them (an image folder's, CIFAR-10's), else the class numbers."""
    names = getattr(trainer.datamodule, "class_names", None)
    return list(names) if names is not None and len(names) == classes else [str(j) for j in range(classes)]


def _keep_input_and_output(captured: dict, name: str, module: torch.nn.Module, inputs: tuple, output) -> None:
    captured[name] = (inputs[0].detach(), output)


def _keep_output(captured: dict, name: str, module: torch.nn.Module, inputs: tuple, output) -> None:
    captured[name] = tuple(tensor.detach() for tensor in output)
