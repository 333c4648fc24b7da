"""A run's model card, ``model_card.md`` in its folder: what the model is, what data and recipe made it,
how well it did, on which machine and from which code, written at the end of the run from what the run
recorded (never typed by hand), with the command that uses it."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from capsexp.locations import LAST_CHECKPOINT
from capsexp.records.machine import describe_text
from capsexp.records.metric_names import PRESENCE_GAP, TEST_ACC, VAL_ACC_BEST
from capsexp.records.revision import short as short_revision

MODEL_CARD = "model_card.md"


@dataclass
class CardFacts:
    """What a run knows of itself at its end; :func:`model_card` writes it out."""

    net: str  # the net's class
    choices: Mapping[str, Any]  # the config groups chosen (model, data, ...) and the command-line overrides
    config: Mapping[str, Any]  # the resolved config
    parameters: int
    flops: float  # forward, per image
    split_sizes: Mapping[str, int]  # images (or pairs) per split: train, val, test[, each extra test set]
    class_names: Sequence[str]
    metrics: Mapping[str, float]  # the run's final metrics
    train_seconds: float | None
    machine: Mapping[str, Any]
    revision: Mapping[str, Any] | None
    checkpoint: str | None  # the tested checkpoint (a path, as the run shows it)
    run_folder: str
    overrides: Sequence[str] = field(default_factory=list)
    # A test-only run (train=false): the SHA-256 of the checkpoint it tested, which another run trained.
    tested_sha256: str | None = None
    # The precision it ran in (Lightning's name), which trainer.precision=auto chooses per model and machine.
    precision: str | None = None
    # Its routing's verdicts where a reference page judged it (capsexp.records.verdicts.verdict_of).
    routing: str | None = None
    verdicts: Sequence[Mapping[str, Any]] = ()


def _precision(ran: str | None, asked: Any) -> str:
    """``bf16-mixed (trainer.precision=auto)``, or the precision asked for where it ran as given."""
    if ran is None or str(asked) == ran:
        return str(asked)
    return f"{ran} (`trainer.precision={asked}`)"


def _row(name: str, value: Any) -> str:
    return f"| {name} | {value} |"


def model_card(facts: CardFacts) -> str:
    """The card as Markdown."""
    config = facts.config
    model, data, trainer = config.get("model", {}), config.get("data", {}), config.get("trainer", {})
    geometry = config.get("geometry", {})
    optimizer = model.get("optimizer") or {}
    scheduler = (model.get("lr_scheduler") or {}).get("scheduler") or {}
    title = f"{facts.choices.get('model', facts.net)} on {facts.choices.get('data', geometry.get('name', 'data'))}"
    lines = [
        f"# Model card: {title}",
        "",
        "Written by the run from what it recorded. Use it: "
        f"`{use_command(facts)} images=<file | folder | glob>` (docs/predict.md).",
        "",
        "## Model",
        "",
        "| | |",
        "| --- | --- |",
        _row("net", f"`{facts.net}` (`model={facts.choices.get('model', '?')}`)"),
        _row("parameters", f"{facts.parameters:,}"),
        _row("forward FLOPs per image", f"{facts.flops / 1e6:,.1f} M"),
        _row("net options", _options(model.get("net", {}))),
        _row("objective", _target(model.get("objective"))),
        _row("input", f"{geometry.get('channels')}x{geometry.get('image_size')}x{geometry.get('image_size')}"),
        _row("classes", ", ".join(map(str, facts.class_names))),
        "",
        "## Data and recipe",
        "",
        "| | |",
        "| --- | --- |",
        _row("data", f"`data={facts.choices.get('data', '?')}` (`{data.get('_target_', '?')}`)"),
        _row("split sizes", ", ".join(f"{name} {count:,}" for name, count in facts.split_sizes.items())),
        _row("used of each split", _used(trainer)),
        _row("batch size (global)", data.get("batch_size")),
        _row("optimizer", f"{_target(optimizer)}, lr {optimizer.get('lr')}"),
        _row("learning-rate schedule", _target(scheduler) if scheduler else "constant"),
        _row("length", _length(trainer)),
        _row("precision", _precision(facts.precision, trainer.get("precision"))),
        _row("devices", f"{trainer.get('devices')} x {trainer.get('accelerator')}"),
        _row("seed", config.get("seed")),
        _row("command-line overrides", " ".join(f"`{o}`" for o in facts.overrides) or "none"),
        "",
        "## Results",
        "",
        "| metric | value |",
        "| --- | ---: |",
    ]
    shown = [VAL_ACC_BEST, *sorted(m for m in facts.metrics if m.startswith(TEST_ACC)), PRESENCE_GAP]
    lines += [_row(name, _value(name, facts.metrics[name])) for name in shown if name in facts.metrics]
    lines += ["", _tested(facts), "", *_verdicts(facts)]
    lines += [
        "## Provenance",
        "",
        "| | |",
        "| --- | --- |",
        _row("training time", _duration(facts.train_seconds)),
        _row("machine", describe_text(dict(facts.machine))),
        _row("code", _code(facts.revision)),
        _row("run folder", f"`{facts.run_folder}` (its `.hydra/config.yaml` holds the whole config)"),
        "",
    ]
    return "\n".join(lines)


def _verdicts(facts: CardFacts) -> list[str]:
    """Its routing's verdicts, each from the page that found it and in the setting its runs had: the
    routing's, not this run's."""
    if not facts.verdicts:
        return []
    lines = ["## Its routing's verdict", ""]
    for found in facts.verdicts:
        lines.append(f"`model/routing={facts.routing}` {found['setting']} (`{found['page']}/`):")
        lines.append("")
        lines += [f"- {question}: {said}" for question, said in found["answers"].items()]
        lines.append("")
    lines += ["A verdict of the routing in that setting, not a measure of this run.", ""]
    return lines


def _tested(facts: CardFacts) -> str:
    """What the results above were measured on, as the run chose it (:mod:`capsexp.run.train`): the best
    checkpoint, a checkpoint given as ``ckpt_path``, or, with neither, the weights the model held."""
    if not facts.config.get("test"):
        return "Not tested (`test=false`): the results are the validation's."
    if not facts.config.get("train"):
        if not facts.checkpoint:
            return "Tested: the untrained weights (`train=false` without a `ckpt_path`)."
        digest = f"; SHA-256 {facts.tested_sha256}" if facts.tested_sha256 else ""
        return f"Tested checkpoint: `{facts.checkpoint}` (given as ckpt_path: trained by another run{digest})."
    checkpointing = (facts.config.get("callbacks") or {}).get("model_checkpoint")
    if facts.checkpoint:
        return f"Tested checkpoint: `{facts.checkpoint}` (the best by {(checkpointing or {}).get('monitor')})."
    if not checkpointing:
        return "Tested: the final weights (no checkpoint was kept: `callbacks.model_checkpoint=null`)."
    return (
        f"Tested: the final weights (saved as `{LAST_CHECKPOINT}`), never validated: the run saved no best "
        f"checkpoint by {checkpointing.get('monitor')} to test."
    )


def write_model_card(run_folder: Path, facts: CardFacts) -> Path:
    path = run_folder / MODEL_CARD
    path.write_text(model_card(facts))
    return path


def use_command(facts: CardFacts) -> str:
    """The command that predicts with the run's model, as a shell takes it: the run folder (its best
    checkpoint), or for a test-only run the checkpoint it tested (its own folder holds none)."""
    target = facts.checkpoint if facts.tested_sha256 and facts.checkpoint else facts.run_folder
    return shlex.join(["python", "-m", "capsexp.predict", f"ckpt_path={target}"])


def _length(trainer: Mapping[str, Any]) -> str:
    return (
        f"max_epochs {trainer.get('max_epochs')}, max_steps {trainer.get('max_steps')}, "
        f"validation every {trainer.get('val_check_interval')}"
    )


def _used(trainer: Mapping[str, Any]) -> str:
    """How much of each split an epoch, a validation and a test used (Lightning's ``limit_*_batches``: a
    whole number is batches, a fraction a share of the split; 1.0 or unset, all of it)."""
    parts = []
    for split in ("train", "val", "test"):
        limit = trainer.get(f"limit_{split}_batches")
        if limit is None or (isinstance(limit, float) and limit == 1.0):
            parts.append(f"{split}: all")
        elif isinstance(limit, int) and not isinstance(limit, bool):
            parts.append(f"{split}: {limit:,} batch{'es' if limit != 1 else ''} (limit_{split}_batches={limit})")
        else:
            parts.append(f"{split}: {100 * float(limit):g}% (limit_{split}_batches={limit})")
    return ", ".join(parts)


def _duration(seconds: float | None) -> str:
    if not seconds:
        return "no training"
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def _value(name: str, value: float) -> str:
    return f"{100 * value:.2f}%" if "acc" in name else f"{value:.3f}"


def _target(node: Any) -> str:
    if not isinstance(node, Mapping):
        return str(node)
    return f"`{str(node.get('_target_', '?')).rsplit('.', 1)[-1]}`"


def _options(net: Mapping[str, Any]) -> str:
    """The net's options as ``key=value``, nested options (routing) as their target and values."""
    parts = []
    for key, value in net.items():
        if key == "_target_":
            continue
        if isinstance(value, Mapping):
            inner = ", ".join(f"{k}={v}" for k, v in value.items() if k != "_target_")
            value = f"{_target(value)}({inner})"
        parts.append(f"{key}={value}")
    return ", ".join(parts)


def _code(revision: Mapping[str, Any] | None) -> str:
    text = short_revision(dict(revision) if revision else None)
    if revision and revision.get("commit"):
        text = f"`{text}` (commit {revision['commit']}" + (
            f", uncommitted changes of SHA-256 {revision['diff_sha256']})" if revision.get("dirty") else ", clean tree)"
        )
    return text
