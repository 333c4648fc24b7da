"""A trained model as a file that runs without capsexp: ONNX (for ONNX Runtime and other languages) or
TorchScript (for C++ and Python serving without the training code).

The exported graph takes what a user's decoded images become before the last, on-device step of the
training data's evaluation pipeline: ``images``, (N, C, S, S) uint8 of the evaluation size
(:class:`~capsexp.use.inference.TrainedModel` ``read`` gives them; docs/predict.md says how an image of
another size is fitted). The graph holds that last step (pixels to [0, 1], a centre crop, the
standardisation) and the net, and returns ``scores`` (N, classes) as ``capsexp.predict`` reports them
(probabilities for logits) and, for capsule models, the class capsules' ``poses``. Routing iterations are
unrolled at the configured count, EM routing in its forward form; the batch dimension stays free. Beside
the file, ``<name>.json`` holds the class names, the input's shape and dtype, what the scores are and the
image conventions with their parameters, and ``prepare.py`` (:mod:`capsexp.data.page`, NumPy and Pillow
alone) makes a person's image that input from them.
"""

from __future__ import annotations

import json
import logging
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from capsexp.config.routing_options import RandomRouting
from capsexp.data import page
from capsexp.errors import CapsexpError, ConfigError
from capsexp.use.inference import TrainedModel, reported_scores

log = logging.getLogger("capsexp")

FORMATS: dict[str, str] = {"onnx": ".onnx", "torchscript": ".pt"}  # format -> file ending
OPSET = 18  # the ONNX opset written (ONNX Runtime 1.16 and later run it)
PREPARE = "prepare.py"  # written beside the exported file: a person's image made its input, without capsexp


class ExportError(CapsexpError):
    """A model, layer or format that cannot be exported, with the reason."""


class Exported(nn.Module):
    """The net with the last step of the evaluation pipeline before it and the reported scores after it."""

    def __init__(self, model: TrainedModel) -> None:
        super().__init__()
        self.net = model.net
        self.transforms = model.transforms  # plain values: its last step is traced, it holds no weights
        self.score_kind = model.score_kind

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, ...]:
        output = self.net(self.transforms.inputs(images))
        scores = reported_scores(output if isinstance(output, torch.Tensor) else output.scores, self.score_kind)
        poses = getattr(output, "poses", None)
        return (scores,) if poses is None else (scores, poses)


def check_exportable(model: TrainedModel) -> None:
    """:class:`ExportError` for what has no exported form that equals the model."""
    for name, module in model.net.named_modules():
        routing = getattr(module, "routing", None)
        if isinstance(routing, RandomRouting):
            raise ExportError(
                f"{type(model.net).__name__}.{name} routes with routing=random: it draws new couplings at every "
                "call, so no exported copy can give the model's outputs (it is a baseline to compare routing "
                "against, not a model to serve)"
            )


def example_images(model: TrainedModel, count: int, data_dir: str | Path | None = None) -> tuple[torch.Tensor, str]:
    """``count`` images of the evaluation size to trace and check with: the first test images of the
    training data where its test files are in ``data_dir`` (this machine's data folder) or in the folder
    the model was trained with, else random pixels; and which they are. Nothing is prepared or downloaded
    and no folder made: only the test split's files are read, where they are."""
    size = model.transforms.size
    hparams = dict(model.datamodule.hparams)
    folders = [data_dir, hparams.get("data_dir")] if "data_dir" in hparams and data_dir is not None else [None]
    for folder in dict.fromkeys(folders):
        changed = {"download": False, "extra_test_sets": [], "data_dir": folder}
        try:
            datamodule = type(model.datamodule)(
                **{**hparams, **{k: v for k, v in changed.items() if k in hparams and v is not None}}
            )
            datamodule.setup("test")  # never prepare_data(), which downloads what is missing
            images = datamodule.data_test.images[:count]
        except Exception:  # no test files there (or none the data can read): the next folder, or random pixels
            continue
        if images.dtype == torch.uint8 and tuple(images.shape[1:]) == (model.channels, size, size):
            return images.clone(), f"the first {len(images)} test images of {model.config.geometry.name}"
    generator = torch.Generator().manual_seed(0)
    random = torch.randint(0, 256, (count, model.channels, size, size), generator=generator, dtype=torch.uint8)
    return random, f"{count} images of random pixels (the training data's test files are not on this machine)"


def export(model: TrainedModel, format: str, path: Path, batch: int = 2, images: torch.Tensor | None = None) -> Path:
    """Write ``model`` to ``path`` in ``format`` (see the module's docstring), traced on ``batch`` example
    images (the first of ``images`` where given, else of :func:`example_images`); and ``<path>.json``.
    :class:`ExportError` naming what cannot be exported."""
    if format not in FORMATS:
        raise ConfigError(f"format={format}: choose one of {', '.join(FORMATS)}")
    if format == "onnx":
        _check_onnx_installed()
    check_exportable(model)
    module = Exported(model.to("cpu")).eval()
    images = example_images(model, batch)[0] if images is None else images[:batch]
    path.parent.mkdir(parents=True, exist_ok=True)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporters' notes on their own internals
        outputs = module(images)
        output_names = ["scores", "poses"][: len(outputs)]
        try:
            if format == "onnx":
                _onnx(module, images, path, output_names)
            else:
                traced = torch.jit.trace(module, (images,), check_trace=False)
                torch.jit.save(traced, str(path))
        except Exception as error:  # the exporter's own failure: its first line, and what was being exported
            raise ExportError(
                f"{type(model.net).__name__} ({model.score_kind}) could not be exported to {format}: "
                f"{type(error).__name__}: {str(error).strip().splitlines()[0][:300]}"
            ) from error
    size = model.transforms.size
    sidecar = {
        "format": format,
        "inputs": {"images": {"shape": ["N", model.channels, size, size], "dtype": "uint8"}},
        "outputs": output_names,
        "score_kind": model.score_kind,
        "class_names": model.class_names,
        "objects_per_image": model.objects,
        "model": model.describe(),
        "checkpoint": str(model.checkpoint),
        "revision": model.revision,
        # How a person's image becomes the input (capsexp.data.conventions, every threshold and filter;
        # docs/predict.md), read by the prepare.py written beside it, so that another runtime makes the same
        # input; its crop and standardisation are in the graph (EvaluationTransform.from_dict rebuilds it all).
        "preprocessing": model.transforms.as_dict(),
    }
    path.with_suffix(".json").write_text(json.dumps(sidecar, indent=2) + "\n")
    # The code capsexp itself runs on a person's image, which needs only NumPy and Pillow.
    (path.parent / PREPARE).write_text(Path(page.__file__).read_text())
    return path


def _check_onnx_installed() -> None:
    """The ONNX exporter's packages are an extra (a plain install trains and predicts without them)."""
    import importlib.util

    missing = [name for name in ("onnx", "onnxscript") if importlib.util.find_spec(name) is None]
    if missing:
        raise ExportError(
            f"format=onnx needs {' and '.join(missing)}, which capsexp's export extra installs: "
            f"pip install 'capsexp[export]' (or export with format=torchscript, which needs nothing more)"
        )


def _onnx(module: nn.Module, images: torch.Tensor, path: Path, output_names: list[str]) -> None:
    batch = torch.export.Dim("batch")
    for exporter in ("torch.onnx", "onnx_ir", "onnxscript"):  # their INFO lines on their own passes
        logging.getLogger(exporter).setLevel(logging.ERROR)
    program = torch.onnx.export(
        module,
        (images,),
        dynamo=True,
        input_names=["images"],
        output_names=output_names,
        dynamic_shapes=({0: batch},),
        opset_version=OPSET,
        verbose=False,
    )
    program.save(str(path))


def runner(format: str, path: Path):
    """A function images (uint8 tensor) -> the exported model's outputs as tensors, run by ONNX Runtime
    (CPU) or TorchScript."""
    if format == "onnx":
        try:
            import onnxruntime
        except ImportError:
            raise ExportError("ONNX Runtime is not installed: pip install 'capsexp[export]' (or onnxruntime)") from None
        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        return lambda images: [torch.from_numpy(out) for out in session.run(None, {"images": images.numpy()})]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # "torch.jit.load is deprecated": the format is TorchScript
        loaded = torch.jit.load(str(path))
    return lambda images: list(loaded(images))


def compare(model: TrainedModel, format: str, path: Path, images: torch.Tensor) -> dict[str, Any]:
    """The exported model against the eager one on ``images``: the largest absolute difference of each
    output, and both rates in images/s (batched as given, one thread pool, medians of 3 passes)."""
    run_exported = runner(format, path)
    module = Exported(model.to("cpu")).eval()
    with torch.no_grad():
        eager, exported = module(images), run_exported(images)
    result: dict[str, Any] = {
        f"max_abs_difference_{name}": float((e - x).abs().max())
        for name, e, x in zip(["scores", "poses"], eager, exported, strict=False)
    }
    result["predictions_equal"] = bool(torch.equal(eager[0].argmax(1), exported[0].argmax(1)))
    result["images_checked"] = len(images)

    def rate(function) -> float:
        times = []
        for _ in range(3):
            started = time.perf_counter()
            function(images)
            times.append(time.perf_counter() - started)
        return len(images) / sorted(times)[1]

    with torch.no_grad():
        result["eager_images_per_s"] = rate(module)
        result["exported_images_per_s"] = rate(run_exported)
    result["file_bytes"] = path.stat().st_size
    return result


TOLERANCE = 1e-4  # the largest difference of an exported model's outputs from the model's that passes


def export_command(cfg) -> dict[str, Any]:
    """``python -m capsexp.export``: export, then check and time the file against the model."""
    from capsexp.locations import shown_path
    from capsexp.use.inference import load

    model = load(cfg.ckpt_path)
    for note in model.notes:
        log.info(f"Checkpoint: {note}")
    format = str(cfg.format)
    path = Path(cfg.paths.output_dir) / f"model{FORMATS.get(format, '')}"
    count = int(cfg.check_images)
    # Read once: the first two trace the graph, all of them check it.
    images, which = example_images(model, max(count, 2), cfg.paths.data_dir)
    log.info(f"Exporting {model.describe()} to {format}")
    export(model, format, path, images=images)
    log.info(
        f"Written: {shown_path(path)} ({path.stat().st_size / 2**20:.1f} MiB) and {path.with_suffix('.json').name}"
    )
    if count <= 0:
        return {}
    result = compare(model, format, path, images[:count])
    worst = max(value for key, value in result.items() if key.startswith("max_abs"))
    log.info(
        f"Checked on {which}: largest difference from the model {worst:.2e} "
        f"({'within' if worst <= TOLERANCE else 'OUTSIDE'} {TOLERANCE:g}); the same predicted classes: "
        f"{'yes' if result['predictions_equal'] else 'NO'}; {result['eager_images_per_s']:,.0f} images/s eager, "
        f"{result['exported_images_per_s']:,.0f} exported ({'ONNX Runtime' if format == 'onnx' else 'TorchScript'}, "
        f"CPU, batches of {len(images)})"
    )
    (path.parent / "check.json").write_text(json.dumps({"images": which, **result}, indent=2) + "\n")
    if worst > TOLERANCE:
        raise ExportError(
            f"the exported model's outputs differ from the model's by {worst:.2e} (more than {TOLERANCE:g})"
        )
    return result
