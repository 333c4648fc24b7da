"""A trained model, ready to ask about images: ``capsexp.load(path).predict(images)``.

:func:`load` takes a checkpoint, a run folder or a sweep's job folder (the checkpoint the run recorded as
best, the one it tested: :func:`~capsexp.records.checkpoints.checkpoint_of`) and rebuilds, from the
checkpoint's own record of its run (:class:`~capsexp.records.run_record.RunRecord`; a checkpoint without
one: its run folder's ``.hydra/config.yaml``), the model in eval mode and the DataModule of its training
data. The DataModule is never set up and reads no dataset: it declares how an image becomes the net's
input, as its evaluation images did (:attr:`~capsexp.data.base.InMemoryDataModule.evaluation_transform`),
and the model keeps that as ``transforms``, which needs no DataModule. Nothing about preprocessing is
declared here.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf
from PIL import Image

from capsexp.config.instantiation import instantiate
from capsexp.data.page import invert_choice
from capsexp.data.transforms import ImageLike, ReadImage
from capsexp.errors import CapsexpError, ConfigError, ImageError
from capsexp.models.inspection import class_scores, routing_layers
from capsexp.nn import ClassMatrixCapsules, PrimaryCapsules
from capsexp.nn.functional import shares
from capsexp.nn.routers import watch
from capsexp.records.checkpoints import model_of_run
from capsexp.records.run_record import RunRecord

BATCH_SIZE = 256  # images per forward pass


def score_kind(module: torch.nn.Module, objects: int = 1) -> str:
    """What a model's class scores are: for presence scores, as the net declares (``net.score_kind``, from
    what computes them: a capsule length under dynamic routing, a class capsule's activation under another
    routing algorithm in CapsNet's place, an EM or a VB activation for matrix capsules routed by EM or by
    variational Bayes, a sigmoid score for CapsNet's fully connected reference head; a sigmoid score for a
    net that declares none), or, for logits, the probability made of them (softmax; sigmoid with several
    objects per image, as their loss is)."""
    net = getattr(module, "net", module)
    if not getattr(getattr(module, "objective", None), "presence_scores", False):
        return "sigmoid probability" if objects > 1 else "softmax probability"
    return getattr(net, "score_kind", "sigmoid score")  # as the net declares; a net that declares none


def reported_scores(raw: torch.Tensor, kind: str) -> torch.Tensor:
    """A net's class scores as :func:`score_kind` names them: logits made probabilities, others as they are."""
    if kind == "softmax probability":
        return raw.softmax(dim=-1)
    if kind == "sigmoid probability":
        return raw.sigmoid()
    return raw


@dataclasses.dataclass
class Predictions:
    """What a model says about N images (tensors on the CPU).

    ``classes`` (N,) or, for T objects per image, (N, T); ``scores`` (N, K) of :attr:`score_kind`;
    ``inputs``: the net's inputs; for capsule models ``poses`` (N, K, D) of the class capsules,
    ``couplings`` (N, I, K): each child's share sent to each class capsule by the last routing layer
    (couplings c_ij, or EM responsibilities R_ij, divided by their sum over the classes where a routing's
    do not sum to one), and ``reconstructions`` from the predicted capsules
    (models with a decoder); ``notes``: per image, what was done to bring it to the net's input;
    ``present`` (N,) bool: whether the predicted class's score reaches the model's presence threshold
    (capsule models trained with the margin loss; None for the others, which always name a class);
    ``absent_text``: what :attr:`names` says of an image where no class is present."""

    classes: torch.Tensor
    scores: torch.Tensor
    score_kind: str
    class_names: list[str]
    inputs: torch.Tensor
    notes: list[list[str]]
    poses: torch.Tensor | None = None
    couplings: torch.Tensor | None = None
    reconstructions: torch.Tensor | None = None
    present: torch.Tensor | None = None
    absent_text: str = "no class present"

    def __len__(self) -> int:
        return len(self.scores)

    @property
    def names(self) -> list[str]:
        """Each image's predicted class by name (several objects joined by ``+``), or :attr:`absent_text`
        where no class is present (:attr:`classes` and :meth:`top` still hold the best)."""
        classes = self.classes if self.classes.ndim == 2 else self.classes[:, None]
        present = [True] * len(classes) if self.present is None else self.present.tolist()
        return [
            "+".join(self.class_names[c] for c in row) if shown else self.absent_text
            for row, shown in zip(classes.tolist(), present, strict=True)
        ]

    def top(self, k: int) -> list[list[tuple[str, float]]]:
        """Each image's ``k`` highest-scoring classes, by name, with their scores."""
        values, indices = self.scores.topk(min(k, self.scores.shape[1]), dim=1)
        return [
            [(self.class_names[c], float(v)) for c, v in zip(row_i, row_v, strict=True)]
            for row_i, row_v in zip(indices.tolist(), values.tolist(), strict=True)
        ]


class TrainedModel:
    """A trained model with its preprocessing and class names (see the module's docstring).

    Attributes: ``module`` (the :class:`~capsexp.lit.Classifier`, eval mode), ``net``, ``transforms``
    (:class:`~capsexp.data.transforms.EvaluationTransform`: an image or a file -> the net's input),
    ``datamodule`` (unset up, its files unread), ``config`` (the run's), ``checkpoint`` (the file), ``class_names``,
    ``score_kind``, ``revision`` (the code that trained it, where recorded), ``notes``."""

    def __init__(
        self, module: torch.nn.Module, datamodule: Any, config: DictConfig, checkpoint: Path, record: RunRecord | None
    ) -> None:
        self.module, self.net, self.datamodule, self.config = module.eval(), module.net, datamodule, config
        self.checkpoint = checkpoint
        self.transforms = datamodule.evaluation_transform  # an image or a file -> the net's input
        self.channels, self.image_size = self.transforms.channels, self.transforms.input_size
        self.objects = int(OmegaConf.select(config, "geometry.objects", default=1) or 1)
        self.class_names = _class_names(record, datamodule, int(config.geometry.num_classes))
        self.score_kind = score_kind(module, self.objects)
        # A class counts as present where its score reaches the midpoint of the loss's targets for a present
        # and an absent class (0.5 for the margin loss's 0.9 and 0.1); None where the loss has no such
        # targets (logits, the spread loss): every image then has a class.
        self.presence_threshold: float | None = getattr(getattr(module, "objective", None), "presence_threshold", None)
        self.fit = "conventions"  # or "plain": images resized and cropped alone (capsexp.use.request.FIT_OPTIONS)
        self.invert = "auto"  # or "true" / "false": the user's word on the polarity (capsexp.data.page.INVERT_OPTIONS)
        digits = self.transforms.conventions.digit_box is not None
        self.absent_text = "no digit found" if digits else "no class present"  # what a line says of such an image
        self.revision = record.revision if record is not None else None
        self.notes: list[str] = []
        self.routing_layer = next(reversed(routing_layers(module).items()), None)  # (name, layer): the last

    @property
    def device(self) -> torch.device:
        return next(self.module.parameters()).device

    def to(self, device: str | torch.device) -> TrainedModel:
        self.module.to(device)
        return self

    # ---- images -> the net's input ------------------------------------------------------------------
    def read(self, image: ImageLike, invert: str | bool | None = None) -> ReadImage:
        """One image (a file, a Pillow image, or a (C, H, W) tensor of pixels, uint8 or in [0, 1]) as a
        :class:`~capsexp.data.transforms.ReadImage`: (C, S, S) uint8 pixels of the evaluation size, and what
        was done to it (:meth:`~capsexp.data.transforms.EvaluationTransform.read` with :attr:`fit`).
        ``invert``: ``auto``, ``true`` or ``false`` (default: :attr:`invert`, ``auto``)."""
        invert = checked_invert(self.invert if invert is None else invert)
        return self.transforms.read(image, plain=self.fit == "plain", invert=invert)

    def inputs(self, images: torch.Tensor) -> torch.Tensor:
        """(N, C, S, S) uint8 images of the evaluation size -> the net's input, on the model's device."""
        return self.transforms.inputs(images.to(self.device))

    # ---- prediction -------------------------------------------------------------------------------
    @torch.inference_mode()
    def forward(self, inputs: torch.Tensor, couplings: bool = True) -> Predictions:
        """The model on a batch of net inputs (see :class:`Predictions`), notes left empty. ``couplings=False``
        leaves them out: dynamic routing runs fused, without them, and keeping them runs its routing twice."""
        captured: dict[str, torch.Tensor] = {}
        hook = None
        if self.routing_layer is not None and couplings:
            hook = watch(
                self.routing_layer[1].router, lambda module, args, output: captured.__setitem__("assignment", output[2])
            )
        try:
            output = self.module(inputs)
        finally:
            if hook is not None:
                hook.remove()
        scores = reported_scores(class_scores(output).float(), self.score_kind)
        classes = scores.argmax(dim=-1) if self.objects == 1 else scores.topk(self.objects, dim=-1).indices
        present = None
        if self.presence_threshold is not None:
            present = (scores.max(dim=-1).values >= self.presence_threshold).cpu()
        field = functools.partial(_field, output)
        return Predictions(
            classes=classes.cpu(),
            scores=scores.cpu(),
            score_kind=self.score_kind,
            class_names=self.class_names,
            inputs=inputs.float().cpu(),
            notes=[[] for _ in range(len(inputs))],
            poses=field("poses"),
            couplings=shares(captured["assignment"].float()).cpu() if captured.get("assignment") is not None else None,
            reconstructions=field("reconstructions"),
            present=present,
            absent_text=self.absent_text,
        )

    def predict(
        self, images: ImageLike | Iterable[ImageLike], batch_size: int = BATCH_SIZE, invert: str | bool | None = None
    ) -> Predictions:
        """Predict on image files, Pillow images or tensors ((H, W), (C, H, W), or a batch (N, C, H, W)),
        in batches of ``batch_size``; ``invert`` as :meth:`read` takes it; see :class:`Predictions`."""
        invert = checked_invert(self.invert if invert is None else invert)
        if isinstance(images, (str, os.PathLike, Image.Image)) or (
            isinstance(images, torch.Tensor) and images.ndim in (2, 3)  # one image, as read() takes it
        ):
            images = [images]
        parts: list[Predictions] = []
        batch: list[torch.Tensor] = []
        notes: list[list[str]] = []
        for image in images:
            pixels, note = self.read(image, invert)
            batch.append(pixels)
            notes.append(note)
            if len(batch) == batch_size:
                parts.append(self.forward(self.inputs(torch.stack(batch))))
                batch = []
        if batch:
            parts.append(self.forward(self.inputs(torch.stack(batch))))
        if not parts:
            raise ImageError("no images to predict on")
        joined = concatenate(parts)
        joined.notes = notes
        return joined

    def describe(self) -> str:
        """One line: the net, its data, and what its scores are."""
        return (
            f"{type(self.net).__name__} trained on {self.config.geometry.name} "
            f"({self.channels}x{self.image_size}x{self.image_size}, {len(self.class_names)} classes); "
            f"scores: {self.score_kind}"
        )


def concatenate(parts: Sequence[Predictions]) -> Predictions:
    """The predictions of several batches as one."""
    first = parts[0]

    def joined(name: str) -> torch.Tensor | None:
        values = [getattr(part, name) for part in parts]
        return None if values[0] is None else torch.cat(values)

    return dataclasses.replace(
        first,
        **{
            name: joined(name)
            for name in ("classes", "scores", "inputs", "poses", "couplings", "reconstructions", "present")
        },
        notes=[note for part in parts for note in part.notes],
    )


def load(path: str | os.PathLike, device: str | torch.device = "cpu") -> TrainedModel:
    """The trained model of a checkpoint, a run folder or a sweep's job folder (see the module's docstring),
    in eval mode on ``device``. :class:`~capsexp.errors.CheckpointError` for a file that is not a capsexp
    checkpoint. The checkpoint file is read once."""
    trained = model_of_run(path, f"ckpt_path={path}")
    datamodule = instantiate("data", trained.config.data, _convert_="all")
    model = TrainedModel(trained.module, datamodule, trained.config, trained.file, trained.record).to(device)
    if trained.note:
        model.notes.append(f"{path}: {trained.note}")
    return model


def _class_names(record: RunRecord | None, datamodule: Any, num_classes: int) -> list[str]:
    """The names the checkpoint recorded, else the DataModule's (where it can tell them without its
    files), else the class numbers."""
    names = record.class_names if record is not None else None
    if not names:
        try:
            names = list(datamodule.class_names)
        except (OSError, CapsexpError):  # a dataset that names its classes in its files, not on this machine
            names = None
    return [str(name) for name in names] if names and len(names) == num_classes else list(map(str, range(num_classes)))


def checked_invert(invert: str | bool) -> str | bool:
    """``invert`` if it is ``auto``, ``true`` or ``false`` (or a bool); else a ConfigError naming what is allowed."""
    try:
        invert_choice(invert)
    except ValueError as error:
        raise ConfigError(f"{error} (auto: the page's polarity decides; true or false: yours)") from None
    return invert


def _field(output: Any, name: str) -> torch.Tensor | None:
    value = getattr(output, name, None)
    return value.float().cpu() if isinstance(value, torch.Tensor) else None


def child_grid(net: torch.nn.Module, layer: torch.nn.Module) -> tuple[int, bool] | None:
    """How the children of a routing layer lie on a square grid: (types per position, whether the types are
    innermost); None where they do not (no primary capsule grid)."""
    if isinstance(layer, ClassMatrixCapsules):
        return layer.weight.shape[0], True
    primary = next((m for m in net.modules() if isinstance(m, PrimaryCapsules)), None)
    return (primary.num_types, False) if primary is not None else None
