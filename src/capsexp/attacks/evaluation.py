"""Adversarial accuracy of a trained classifier over a sweep of eps (``attack=fgsm|bim|pgd``).

The attacks are foolbox's L-inf attacks (Rauber et al. 2017/2020): FGSM (Goodfellow et al. 2015),
BIM (Kurakin et al. 2017) and PGD (Madry et al. 2018), untargeted or targeted. They perturb the test
images' pixels in [0, 1], as the data gives them, and differentiate through the DataModule's input
transform (a standardisation) and the whole net, scored by its class scores (capsule lengths or
activations for capsule nets; a softmax cross-entropy over them is the attack's loss).

White-box: the examples are crafted on the tested model itself. Black-box (``source``): crafted on
another checkpoint (its run folder's config builds its model) and shown to the tested model.

Guards against gradient masking (Athalye et al. 2018): the fraction of zero input gradients of the
crafting model, and of them the input positions whose gradient is zero on every attacked image (the
net never sees them: CapsNet's last row and column of a 28x28 image fall outside its strided
convolutions' reach; neither FGSM nor BIM can move them), and, for the iterative attacks, FGSM at
the same eps beside them (an iterative attack that does worse than one step signals masked
gradients; a warning names the eps).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import torch
import torch.nn.functional as F
from annotated_types import MinLen
from pydantic import PositiveInt
from torch import nn

from capsexp.config.arguments import PositiveFraction, UnitInterval, checked
from capsexp.models.inspection import class_scores

log = logging.getLogger(__name__)

Method = Literal["fgsm", "bim", "pgd"]
_PROGRESS_EVERY_S = 30.0


class PixelClassifier(nn.Module):
    """A classifier as an attack sees it: pixels in [0, 1] in, class scores out (the DataModule's
    input transform, then the net in evaluation mode, never fed the labels)."""

    def __init__(self, classifier: nn.Module, input_transform: Any) -> None:
        super().__init__()
        self.classifier, self.input_transform = classifier, input_transform

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        return class_scores(self.classifier(self.input_transform(pixels)))


@dataclass
class AttackResult:
    """Accuracies (fractions of the attacked images) per eps, in the order of ``eps``."""

    eps: list[float]
    accuracy: list[float]  # of the tested model on the adversarial images
    target_rate: list[float] | None  # targeted: the fraction classified as the attack's target
    fgsm_accuracy: list[float] | None  # iterative attacks: FGSM's at the same eps, crafted alike
    clean_accuracy: float
    zero_gradient_fraction: float  # of the input gradients of the crafting model
    unseen_input_fraction: float  # of the input positions: zero gradient on every image (never seen)
    images: int
    examples: torch.Tensor  # (len(eps), k, C, H, W): the first adversarial images at each eps


@checked
class AdversarialEvaluation:
    """The options of an attack sweep; :meth:`run` applies it to a test set.

    Args:
        method: ``fgsm`` (one step of eps), ``bim`` (``steps`` steps of ``relative_step`` x eps, no
            random start), ``pgd`` (the same from a random start in the eps ball).
        eps: the L-inf radii, in pixel values (the data's range is [0, 1]); 0 gives the clean accuracy.
        targeted: aim at another class per image (drawn uniformly among the others, seeded) instead of
            any wrong one.
        steps, relative_step: iterations and step size (a fraction of eps) of ``bim`` and ``pgd``
            (foolbox's defaults: 10 and 0.2 for BIM).
        source: black-box: a checkpoint of another run (``.ckpt`` in ``<run>/checkpoints/``) the
            examples are crafted on; ``None``: white-box, on the tested model.
        max_images: attack the first this many test images (``None``: all of the first test set).
        seed: seed of the targets and of PGD's random starts.
        examples: adversarial images kept per eps for TensorBoard.
    """

    def __init__(
        self,
        method: Method = "fgsm",
        eps: Annotated[Sequence[UnitInterval], MinLen(1)] = (0.0, 0.05, 0.1, 0.2, 0.3, 0.5),
        targeted: bool = False,
        steps: PositiveInt = 10,
        relative_step: PositiveFraction = 0.2,
        source: str | None = None,
        max_images: PositiveInt | None = None,
        seed: int = 0,
        examples: PositiveInt = 8,
    ) -> None:
        self.method, self.eps, self.targeted = method, [float(e) for e in eps], targeted
        self.steps, self.relative_step, self.source = steps, relative_step, source
        self.max_images, self.seed, self.examples = max_images, seed, examples

    @property
    def name(self) -> str:
        """``fgsm``, ``bim_targeted``, ``pgd_blackbox``: the attack's name in metrics and files."""
        return self.method + ("_targeted" if self.targeted else "") + ("_blackbox" if self.source else "")

    def _foolbox_attack(self, method: Method) -> Any:
        import foolbox as fb  # loads eagerpy and foolbox's attacks: only when attacking

        if method == "fgsm":
            # foolbox's FGSM is untargeted only; one BIM step of the whole eps is FGSM, targeted too.
            return fb.attacks.LinfBasicIterativeAttack(rel_stepsize=1.0, steps=1)
        if method == "bim":
            return fb.attacks.LinfBasicIterativeAttack(rel_stepsize=self.relative_step, steps=self.steps)
        return fb.attacks.LinfPGD(rel_stepsize=self.relative_step, steps=self.steps, random_start=True)

    def run(
        self, target: PixelClassifier, source: PixelClassifier | None, batches: Any, num_classes: int
    ) -> AttackResult:
        """Attack every ``(pixels, labels)`` batch of ``batches`` (on the models' device)."""

        crafter = source or target
        for model in {target, crafter}:
            model.eval()
        attacks = {self.method: self._foolbox_attack(self.method)}
        if self.method != "fgsm":
            attacks["fgsm"] = self._foolbox_attack("fgsm")
        # foolbox draws PGD's random start from torch's global generator: seeded here, and the run's own
        # generator state given back afterwards, so that an attack changes no later draw of the run.
        with torch.random.fork_rng():
            if self.method == "pgd":
                torch.manual_seed(self.seed)
            return self._run(target, crafter, attacks, batches, num_classes)

    def _run(
        self, target: PixelClassifier, crafter: PixelClassifier, attacks: dict, batches: Any, num_classes: int
    ) -> AttackResult:
        import foolbox as fb

        fmodel = None  # made at the first batch, on its device
        generator = torch.Generator().manual_seed(self.seed)
        correct = {name: torch.zeros(len(self.eps), dtype=torch.long) for name in attacks}
        on_target = torch.zeros(len(self.eps), dtype=torch.long)
        clean = zero_gradients = gradient_entries = seen = 0
        examples: list[torch.Tensor] = []
        zero_everywhere: torch.Tensor | None = None  # (C, H, W): zero gradient on every image so far
        started = last_line = time.monotonic()
        for pixels, labels in batches:
            if self.max_images is not None and seen >= self.max_images:
                break
            if self.max_images is not None:
                pixels, labels = pixels[: self.max_images - seen], labels[: self.max_images - seen]
            seen += len(labels)
            fmodel = fmodel or fb.PyTorchModel(crafter, bounds=(0.0, 1.0), device=pixels.device)
            with torch.no_grad():
                clean += (target(pixels).argmax(dim=1) == labels).sum().item()
            zero = input_gradient(crafter, pixels, labels) == 0
            zero_gradients += zero.sum().item()
            zero_everywhere = zero.all(dim=0) if zero_everywhere is None else zero_everywhere & zero.all(dim=0)
            gradient_entries += pixels.numel()
            if self.targeted:
                offset = torch.randint(1, num_classes, labels.shape, generator=generator).to(labels.device)
                goal = (labels + offset) % num_classes
                criterion = fb.criteria.TargetedMisclassification(goal)
            else:
                criterion = fb.criteria.Misclassification(labels)
            for name, attack in attacks.items():
                _, adversarial, _ = attack(fmodel, pixels, criterion, epsilons=self.eps)
                with torch.no_grad():
                    predictions = torch.stack([target(images).argmax(dim=1) for images in adversarial])
                correct[name] += (predictions == labels).sum(dim=1).cpu()
                if name == self.method:
                    if self.targeted:
                        on_target += (predictions == goal).sum(dim=1).cpu()
                    kept = sum(part.shape[1] for part in examples)
                    if kept < self.examples:
                        examples.append(torch.stack(adversarial)[:, : self.examples - kept].detach().cpu())
            if time.monotonic() - last_line > _PROGRESS_EVERY_S:
                last_line = time.monotonic()
                log.info(f"attack {self.name}: {seen} images, {seen / (last_line - started):.1f} img/s")
        if seen == 0:
            raise ValueError("the test set is empty: nothing to attack")
        result = AttackResult(
            eps=self.eps,
            accuracy=(correct[self.method].double() / seen).tolist(),
            target_rate=(on_target.double() / seen).tolist() if self.targeted else None,
            fgsm_accuracy=(correct["fgsm"].double() / seen).tolist() if self.method != "fgsm" else None,
            clean_accuracy=clean / seen,
            zero_gradient_fraction=zero_gradients / gradient_entries,
            unseen_input_fraction=zero_everywhere.float().mean().item(),
            images=seen,
            examples=torch.cat(examples, dim=1),
        )
        self._warn_if_masked(result)
        return result

    def _warn_if_masked(self, result: AttackResult) -> None:
        if result.fgsm_accuracy is not None:
            worse = [
                f"{eps:g} ({100 * acc:.2f}% > {100 * fgsm:.2f}%)"
                for eps, acc, fgsm in zip(result.eps, result.accuracy, result.fgsm_accuracy, strict=True)
                if acc > fgsm
            ]
            if worse:
                log.warning(
                    f"{self.method} left more images right than FGSM at eps {', '.join(worse)}: an iterative "
                    "attack weaker than one step is a sign of masked gradients"
                )
        if result.zero_gradient_fraction - result.unseen_input_fraction > 0.5:
            log.warning(
                f"{100 * result.zero_gradient_fraction:.1f}% of the input gradients are exactly zero: the "
                "attack's gradients may be masked (saturated scores)"
            )


def input_gradient(model: nn.Module, pixels: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The gradient of the cross-entropy of ``model``'s scores with respect to its input pixels."""
    pixels = pixels.detach().requires_grad_(True)
    with torch.enable_grad():
        loss = F.cross_entropy(model(pixels), labels, reduction="sum")
        (gradient,) = torch.autograd.grad(loss, pixels)
    return gradient


def results_table(result: AttackResult, name: str) -> str:
    """The sweep as a Markdown table: eps, accuracy (and FGSM's, the target rate) in %."""
    header = ["eps", f"{name} accuracy (%)"]
    if result.fgsm_accuracy is not None:
        header.append("FGSM accuracy (%)")
    if result.target_rate is not None:
        header.append("classified as the target (%)")
    lines = ["| " + " | ".join(header) + " |", "|" + " ---: |" * len(header)]
    for i, eps in enumerate(result.eps):
        cells = [f"{eps:g}", f"{100 * result.accuracy[i]:.2f}"]
        if result.fgsm_accuracy is not None:
            cells.append(f"{100 * result.fgsm_accuracy[i]:.2f}")
        if result.target_rate is not None:
            cells.append(f"{100 * result.target_rate[i]:.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def write_results(result: AttackResult, name: str, folder: Path, description: str) -> Path:
    """``<folder>/attack_<name>.md``: what was attacked, the table, the gradient-masking checks."""
    path = folder / f"attack_{name}.md"
    path.write_text(
        f"# Attack {name}\n\n{description}\n\n"
        f"{result.images} test images; clean accuracy {100 * result.clean_accuracy:.2f}%; "
        f"{100 * result.zero_gradient_fraction:.2f}% of the crafting model's input gradients are exactly 0; "
        f"{100 * result.unseen_input_fraction:.2f}% of the input positions have a zero gradient on every image "
        "(the net never sees them).\n\n" + results_table(result, name)
    )
    return path


def metric_name(name: str, eps: float) -> str:
    """``attack/fgsm/acc_eps0.1``: one scalar per eps (TensorBoard plots it against eps x 1000)."""
    return f"attack/{name}/acc_eps{eps:g}"


def eps_step(eps: float) -> int:
    """The TensorBoard step of an eps: eps x 1000 (the x-axis of the accuracy-versus-eps curve)."""
    return round(eps * 1000)
