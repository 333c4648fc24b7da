"""``predict(cfg)``: a trained model on a user's image files, through Lightning's ``Trainer.predict``
(its devices, precision and progress bar), the rows written batch by batch, so that a large folder
never sits in memory.

Writes into ``output_dir``: ``predictions.csv`` (a row per image: file, predicted class by name, its
score, the top-k classes with their scores, what the score is, whether a class is present at all for
capsule models, the label and whether it was right where the folder gives labels, and what was done to
the image to fit the net), ``summary.md`` (the model, its checkpoint and code revision, the counts, the
files skipped and why, the accuracy and confusion matrix where labelled) and, for the first ``explain``
images (and as many it got wrong), a figure each in ``explain/`` (:mod:`capsexp.use.explain`), drawn
after the prediction pass from a second pass over those images alone.
"""

from __future__ import annotations

import csv
import logging
import os
import sys
import time
import warnings
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import BasePredictionWriter, RichProgressBar
from omegaconf import DictConfig
from torch.utils.data import DataLoader, Dataset

from capsexp.config.instantiation import instantiate, quiet_lightning_notices
from capsexp.data.page import NO_INK
from capsexp.errors import ImageError
from capsexp.locations import shown_path
from capsexp.records.revision import short as short_revision
from capsexp.use.inference import Predictions, TrainedModel, load
from capsexp.use.request import ImageFiles, folder_labels, image_files, predict_options

log = logging.getLogger("capsexp")

PREDICTIONS, SUMMARY, EXPLAINED = "predictions.csv", "summary.md", "explain"
_SHOWN = 5  # files named in an error


class ImageDataset(Dataset):
    """The files, each brought to the model's evaluation size (:meth:`TrainedModel.read`); an unreadable
    one gives a blank image and its error, so that one bad file does not stop a folder."""

    def __init__(self, files: Sequence[Path], model: TrainedModel) -> None:
        self.files, self.model = list(files), model
        self.blank = torch.zeros(model.channels, model.transforms.size, model.transforms.size)

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int, list[str], str]:
        try:
            pixels, notes = self.model.read(self.files[index])
            return pixels, index, notes, ""
        except ImageError as error:
            return self.blank.to(torch.uint8), index, [], str(error)


def _collate(items: list[tuple]) -> tuple[torch.Tensor, torch.Tensor, list[list[str]], list[str]]:
    pixels, indices, notes, errors = zip(*items, strict=True)
    return torch.stack(pixels), torch.tensor(indices), list(notes), list(errors)


class Predictor(L.LightningModule):
    """The trained model as a LightningModule for ``Trainer.predict``: a batch of fitted uint8 images
    becomes the net's input on the device, then :meth:`TrainedModel.forward`."""

    def __init__(self, model: TrainedModel, writer: PredictionWriter) -> None:
        super().__init__()
        self.model, self.writer = model, writer
        self.classifier = model.module  # a child module, so that the Trainer moves it to its device

    def predict_step(self, batch: tuple, batch_idx: int, dataloader_idx: int = 0) -> tuple[Predictions, Any, list]:
        images, indices, notes, errors = batch
        # No couplings: keeping them costs dynamic routing a second pass; the figures recompute theirs.
        predictions = self.model.forward(self.model.inputs(images), couplings=False)
        predictions.notes = notes
        return predictions, indices.cpu(), errors


class PredictionWriter(BasePredictionWriter):
    """Writes each batch's rows, keeps the first ``lines`` lines for the console, picks the images to
    explain (the first ``explain``, and as many it got wrong), and counts what the summary needs."""

    def __init__(
        self,
        model: TrainedModel,
        files: Sequence[Path],
        root: Path | None,
        labels: list[int] | None,
        output: Path,
        top_k: int,
        lines: int,
        explain: int,
    ) -> None:
        super().__init__(write_interval="batch")
        self.model, self.files, self.root, self.labels, self.output = model, files, root, labels, output
        self._root = str(root) + os.sep if root is not None else ""  # what a shown file name leaves out
        self.top_k, self.lines, self.explain = top_k, lines, explain
        classes = len(model.class_names)
        self.presence = model.presence_threshold is not None
        # A column more for the images on which no class is present: the label says one is, so they
        # count as wrong, and the matrix says so rather than filing them under their best class.
        self.confusion = torch.zeros(classes, classes + self.presence, dtype=torch.long)
        self.predicted = Counter()
        self.notes: Counter[str] = Counter()
        self.errors: list[str] = []
        self.shown: list[str] = []
        self.to_explain: list[tuple[int, str]] = []  # (file index, subfolder of explain/) for the figures
        self.explained = self.explained_wrong = 0
        self.absent = 0  # images on which the model finds no class present
        self.rows = 0
        header = ["file", "predicted", "score"]
        for rank in range(1, top_k + 1):
            header += [f"top{rank}", f"top{rank}_score"]
        header += ["score_kind", *(["present"] if self.presence else [])]
        self.header = [*header, *(["label", "correct"] if labels is not None else []), "notes"]
        # Opened with the first rows: a predict refused before any (a Trainer that cannot be built) leaves
        # no file that looks like an empty result.
        self._handle = self._csv = None

    def shown_name(self, path: Path) -> str:
        text = str(path)
        return text[len(self._root) :] if self._root and text.startswith(self._root) else text

    def write_on_batch_end(
        self, trainer, pl_module, prediction: tuple, batch_indices, batch, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        predictions, indices, errors = prediction
        # Per batch, not per row: the scores and classes as lists, the confusion counts in one update.
        names, tops = predictions.names, predictions.top(self.top_k)
        first = predictions.classes.reshape(len(predictions), -1)[:, 0]
        scores = predictions.scores.gather(1, first[:, None])[:, 0].tolist()
        first, indices = first.tolist(), indices.tolist()
        kind, blank = predictions.score_kind, [""] * (2 * self.top_k)
        labels = [self.labels[index] for index in indices] if self.labels is not None else None
        present = predictions.present.tolist() if predictions.present is not None else None
        rows = []
        for row, (index, error) in enumerate(zip(indices, errors, strict=True)):
            name = self.shown_name(self.files[index])
            label = [] if labels is None else [self.model.class_names[labels[row]]]
            if error:
                self.errors.append(error)
                unfilled = ["", *([""] if self.presence else [])]  # score_kind, present
                rows.append([name, "", "", *blank, *unfilled, *label, *([""] if label else []), error])
                continue
            notes = predictions.notes[row]
            self.notes.update(notes)
            absent = present is not None and not present[row]
            shown = names[row]  # no class present: the absent text, its best stays in top1
            self.predicted[shown] += 1
            self.absent += absent
            top = [value for pair in tops[row] for value in (pair[0], f"{pair[1]:.4f}")]
            right = bool(label) and labels[row] == first[row] and not absent
            correct = [str(int(right))] if label else []
            score = f"{scores[row]:.4f}"
            found = [] if present is None else [str(int(present[row]))]
            rows.append(
                [name, shown, score, *top, *blank[len(top) :], kind, *found, *label, *correct, "; ".join(notes)]
            )
            if len(self.shown) < self.lines:
                tag = f"  [label {label[0]}: {'right' if right else 'wrong'}]" if label else ""
                if absent:
                    best = ", ".join(f"{c} {v:.3f}" for c, v in tops[row])
                    threshold = self.model.presence_threshold
                    line = f"{name}: {shown} (no {kind} reaches {threshold:g}; the best: {best}){tag}"
                else:
                    line = self._line(name, names[row], kind, scores[row], tops[row]) + tag
                empty = next((note for note in notes if note.startswith(NO_INK)), None)
                self.shown.append(line if empty is None else f"{line}  [{empty}]")
            if self.explained < self.explain:
                self.to_explain.append((index, EXPLAINED))
                self.explained += 1
            if label and not right and self.explained_wrong < self.explain:
                self.to_explain.append((index, f"{EXPLAINED}/wrong"))
                self.explained_wrong += 1
        if self._handle is None:
            self._handle = open(self.output / PREDICTIONS, "w", newline="")  # noqa: SIM115 (closed in close())
            self._csv = csv.writer(self._handle)
            self._csv.writerow(self.header)
        self._csv.writerows(rows)
        self._handle.flush()
        if labels is not None:
            read = torch.tensor([not error for error in errors], dtype=torch.bool)
            columns = torch.tensor(first)
            if present is not None:
                columns[~torch.tensor(present, dtype=torch.bool)] = len(self.model.class_names)
            pairs = torch.tensor(labels)[read], columns[read]
            self.confusion.index_put_(pairs, torch.ones_like(pairs[0]), accumulate=True)
        done = self.rows + len(indices)
        if not sys.stdout.isatty() and done * 10 // len(self.files) > self.rows * 10 // len(self.files):
            log.info(f"{done:,} of {len(self.files):,} images")
        self.rows = done

    def _line(self, name: str, predicted: str, kind: str, score: float, top: list) -> str:
        """The printed line of one image: its prediction and score, and the runners-up."""
        listed = ", ".join(f"{cls} {value:.3f}" for cls, value in top[1:])
        return f"{name}: {predicted} ({kind} {score:.3f}){'; then ' + listed if listed else ''}"

    def _title(self, name: str, index: int) -> str:
        return name if self.labels is None else f"{name} (label {self.model.class_names[self.labels[index]]})"

    def draw_figures(self) -> None:
        """The figure of each image picked to explain, from a second pass over those images alone (with the
        routing couplings, which the prediction pass leaves out), after the prediction pass."""
        from capsexp.use.explain import explain_figure  # matplotlib: only when drawing

        if not self.to_explain:
            return
        indices = [index for index, _ in self.to_explain]
        read = [self.model.read(self.files[index]) for index in indices]
        pixels = torch.stack([image.pixels for image in read])
        predictions = self.model.forward(self.model.inputs(pixels), couplings=True)
        shown = list(dict.fromkeys(self.shown_name(self.files[index]) for index in indices))
        named = dict(zip(shown, figure_names(shown), strict=True))  # an image in explain/ and explain/wrong/: once
        for row, (index, subfolder) in enumerate(self.to_explain):
            folder = self.output / subfolder
            folder.mkdir(parents=True, exist_ok=True)
            title = self._title(self.shown_name(self.files[index]), index)
            if not read[row].ink_found:  # the model was given an empty image: the figure says so first
                title = f"{title} ({NO_INK} on the page: given as an empty image)"
            figure = explain_figure(self.model, predictions, row, title)
            figure.savefig(folder / named[self.shown_name(self.files[index])], dpi=90)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()


def figure_names(files: list[str]) -> list[str]:
    """The PNG name of each file's figure: its path's folders joined by ``_`` without its extension
    (``7/a.png`` -> ``7_a.png``), with the extension kept where two files would share a name
    (``a.png`` and ``a.jpg`` -> ``a_png.png`` and ``a_jpg.png``)."""
    stems = [name.replace("/", "_").replace(os.sep, "_") for name in files]
    plain = [stem.rsplit(".", 1)[0] for stem in stems]
    shared = {stem for stem in plain if plain.count(stem) > 1}
    return [
        f"{stem.replace('.', '_') if short in shared else short}.png" for stem, short in zip(stems, plain, strict=True)
    ]


def predict(cfg: DictConfig, found: ImageFiles | None = None) -> dict[str, Any]:
    """Predict as the module's docstring says; return the counts (``images``, ``unreadable``, ``absent``,
    ``skipped``, and ``accuracy`` where labelled) and the times (``seconds``: the prediction pass,
    ``figure_seconds``: the figures). ``found``: the files, where the command line listed them already.
    :class:`~capsexp.errors.ImageError` after writing, when a file could not be read."""
    options = predict_options(cfg)
    found = found or image_files(str(cfg.images))
    files = found.files
    model = load(cfg.ckpt_path)
    model.fit, model.invert = options.fit, options.invert
    for note in model.notes:
        log.info(f"Checkpoint: {note}")
    labels = folder_labels(files, model.class_names) if found.root is not None and model.objects == 1 else None
    log.info(f"{model.describe()}; trained by code {short_revision(model.revision)}")
    size = model.transforms.size
    log.info(
        f"{len(files):,} images"
        + (f" in {len(set(labels))} labelled class folders" if labels is not None else "")
        + f"; each brought to {model.channels}x{size}x{size} "
        + ("as the model's evaluation images were made (docs/predict.md)" if options.fit != "plain" else "(fit=plain)")
    )
    output = Path(cfg.paths.output_dir)
    output.mkdir(parents=True, exist_ok=True)
    writer = PredictionWriter(model, files, found.root, labels, output, options.top_k, options.lines, options.explain)
    loader = DataLoader(
        ImageDataset(files, model),
        batch_size=options.batch_size,
        num_workers=int(cfg.num_workers),
        collate_fn=_collate,
        persistent_workers=False,
    )
    # Lightning's notices (which devices exist, tips advertising its services) and a deprecation it raises
    # on every run: nothing a user acts on here.
    quiet_lightning_notices()
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)")
    terminal = sys.stdout.isatty()  # a progress bar on a terminal; in a log, a line every tenth of the images
    trainer: L.Trainer = instantiate(
        "trainer",
        cfg.trainer,
        callbacks=[writer, RichProgressBar()] if terminal else [writer],
        enable_progress_bar=terminal,
        logger=False,
        enable_model_summary=False,
    )
    log.info(f"Predicting on {trainer.strategy.root_device} in batches of {options.batch_size}")
    started = time.perf_counter()
    try:
        trainer.predict(Predictor(model, writer), dataloaders=loader, return_predictions=False)
    finally:
        writer.close()
    seconds = time.perf_counter() - started
    started = time.perf_counter()
    with torch.inference_mode():
        writer.draw_figures()
    figure_seconds = time.perf_counter() - started
    speed = f"{len(files):,} images in {seconds:.1f} s ({len(files) / seconds:,.0f} images/s: decoding and the model)"
    if writer.to_explain:
        speed += f"; figures of {len(writer.to_explain)} of them drawn in {figure_seconds:.1f} s"
    log.info(speed)
    for line in writer.shown:
        print(line)
    predicted = len(files) - len(writer.errors)
    if predicted > len(writer.shown) and writer.shown:
        print(f"... and {predicted - len(writer.shown):,} more in {PREDICTIONS}")
    for note, count in writer.notes.most_common():  # what was done to fit images, one line each (docs/predict.md)
        log.info(f"{count:,} of {predicted:,} images: {note}")
    if model.presence_threshold is not None:
        log.info(
            f"{writer.absent:,} of {predicted:,} images: {model.absent_text} (no {model.score_kind} reaches "
            f"{model.presence_threshold:g})"
        )
    if found.skipped:
        log.info(f"{len(found.skipped):,} files skipped (listed in {SUMMARY}): " + _skipped_counts(found))
    result = {**_summarise(cfg, model, writer, found), "seconds": seconds, "figure_seconds": figure_seconds}
    log.info(f"Predictions: {shown_path(output / PREDICTIONS)}; summary: {shown_path(output / SUMMARY)}")
    if writer.errors:
        shown = "\n  ".join(writer.errors[:_SHOWN]) + ("\n  ..." if len(writer.errors) > _SHOWN else "")
        raise ImageError(
            f"{len(writer.errors)} of {len(files):,} files could not be read as images (their rows in "
            f"{shown_path(output / PREDICTIONS)} say so):\n  {shown}"
        )
    return result


def _skipped_counts(found: ImageFiles) -> str:
    return ", ".join(f"{count:,} {reason}" for reason, count in Counter(r for _, r in found.skipped).most_common())


def _summarise(cfg: DictConfig, model: TrainedModel, writer: PredictionWriter, found: ImageFiles) -> dict:
    predicted = len(found.files) - len(writer.errors)
    result: dict[str, Any] = {
        "images": predicted,
        "unreadable": len(writer.errors),
        "skipped": len(found.skipped),
        "absent": writer.absent,
        "presence_threshold": model.presence_threshold,
    }
    names = model.class_names
    text = [
        "# Predictions",
        "",
        f"- model: {model.describe()}",
        f"- checkpoint: `{model.checkpoint}`",
        f"- trained by code: {short_revision(model.revision)}",
        f"- images: `{cfg.images}`: {predicted:,} predicted"
        + (f", {len(writer.errors)} unreadable" if writer.errors else ""),
        f"- each image's row, top {writer.top_k} classes and scores: [{PREDICTIONS}]({PREDICTIONS})",
    ]
    if model.presence_threshold is not None:
        text.append(
            f"- {model.absent_text}: {writer.absent:,} of {predicted:,} (no {model.score_kind} reaches "
            f"{model.presence_threshold:g}, the midpoint of the loss's targets; their `predicted` column says "
            f"{model.absent_text}, `present` is 0 and `top1` holds the best class)"
        )
    if writer.notes:
        text += ["", "What was done to bring images to the model's input (as its evaluation images were):", ""]
        text += [f"- {count:,} of {predicted:,}: {note}" for note, count in writer.notes.most_common()]
    if found.skipped:
        text += ["", f"Files skipped ({len(found.skipped):,}):", ""]
        text += [f"- `{writer.shown_name(path)}`: {reason}" for path, reason in found.skipped]
    text += ["", "| predicted | images |", "| --- | ---: |"]
    text += [f"| {name} | {writer.predicted[name]:,} |" for name in names if writer.predicted[name]]
    if writer.absent:
        text.append(f"| {model.absent_text} | {writer.absent:,} |")
    for name, count in writer.predicted.items():  # several objects: the joined names
        if name not in names and name != model.absent_text:
            text.append(f"| {name} | {count:,} |")
    if writer.labels is not None and writer.confusion.sum():
        confusion = writer.confusion
        right = int(confusion.diag().sum())
        accuracy = right / int(confusion.sum())
        result["accuracy"] = accuracy
        columns = [*names, *([model.absent_text] if writer.presence else [])]
        absent = int(confusion[:, len(names) :].sum())
        treated = (
            f"; the {absent:,} with {model.absent_text} count as wrong, since their folders name a class"
            if writer.presence
            else ""
        )
        text += [
            "",
            f"Accuracy: **{100 * accuracy:.2f}%** ({right:,} of {int(confusion.sum()):,}; labels from the class "
            f"folders{treated})",
            "",
            "Confusion matrix (rows: label, columns: predicted):",
            "",
            "| label \\ predicted | " + " | ".join(columns) + " |",
            "| --- |" + " ---: |" * len(columns),
        ]
        text += [f"| {names[i]} | " + " | ".join(str(int(v)) for v in row) + " |" for i, row in enumerate(confusion)]
        log.info(f"Accuracy: {100 * accuracy:.2f}% of {int(confusion.sum()):,} labelled images{treated}")
    if writer.explained:
        text += ["", f"Figures of the first {writer.explained} images: [{EXPLAINED}/]({EXPLAINED}/)"]
    if writer.explained_wrong:
        text += [f"and of the first {writer.explained_wrong} it got wrong: [{EXPLAINED}/wrong/]({EXPLAINED}/wrong/)"]
    (writer.output / SUMMARY).write_text("\n".join(text) + "\n")
    return result
