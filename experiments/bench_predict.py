"""How fast a trained model predicts on image files, and how fast its exported copies run; writes
experiments/results/bench_predict.md.

For LeNet5 and CapsNet (``model=capsnet``, the paper's size), each trained briefly on MNIST here (the
rates do not depend on the weights; the page gives the accuracy they reached):

- **predict against the forward pass**: ``python -m capsexp.predict`` on the 10,000 MNIST test digits
  written as PNG files (decoding, fitting, the model, the CSV rows), in images/s, against the rate of the
  model's batched forward pass alone on the same images already decoded (batches of 256, no gradient).
  The two alternate, round after round, so that the shared machine's noise hits both; medians.
- **eager against exported**: the model (the last preprocessing step included) against its ONNX file run
  by ONNX Runtime and its TorchScript file, on the same 10,000 decoded images in batches of 256, in
  images/s (alternating, medians), with the files' sizes and the largest difference of their scores.

    python experiments/bench_predict.py            # about 13 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from omegaconf import open_dict

from capsexp.config.hydra_setup import register
from capsexp.data import MNISTDataModule
from capsexp.locations import PROJECT_ROOT
from capsexp.results.machine import describe, describe_text
from capsexp.results.revision import describe as describe_revision
from capsexp.results.revision import short
from capsexp.use.export import Exported, export, runner
from capsexp.use.inference import load
from capsexp.use.predict import predict
from mnist_image_folder import write_split
from timing import Stopwatch

RESULTS = PROJECT_ROOT / "experiments" / "results" / "bench_predict.md"
BATCH = 256
# Each model's training here: long enough to be a real model, short enough for the benchmark.
MODELS = {
    "lenet5": ["model=lenet5", "trainer.max_steps=1000"],
    "capsnet": ["model=capsnet", "trainer.max_steps=150"],
}
# Shorter than an epoch, so never validated: predict takes the run's last.ckpt (its log says so).
TRAINING = ["data=mnist", "trainer.max_epochs=1", "test=false", "callbacks.progress_bar=null"]


def train(name: str, folder: Path) -> Path:
    run = folder / "runs" / name
    command = [sys.executable, "-m", "capsexp", *MODELS[name], *TRAINING, f"hydra.run.dir={run}"]
    print(" ".join(command[1:]), flush=True)
    subprocess.run(command, check=True, cwd=PROJECT_ROOT, capture_output=True)
    return run


def predict_config(run: Path, images: Path, output: Path):
    from hydra import compose, initialize_config_dir

    from capsexp.locations import CONFIG_DIR

    with initialize_config_dir(str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("predict", [f"ckpt_path={run}", f"images={images}", "lines=0", "explain=0"])
    with open_dict(cfg):
        cfg.paths.output_dir = str(output)
    return cfg


def rate(function, inputs: torch.Tensor) -> float:
    """Images/s of ``function`` over ``inputs`` in batches of BATCH."""
    with torch.inference_mode(), Stopwatch() as watch:
        for start in range(0, len(inputs), BATCH):
            function(inputs[start : start + BATCH])
    return len(inputs) / watch.seconds


def bench(name: str, run: Path, images: Path, decoded: torch.Tensor, labels: torch.Tensor, rounds: int, folder: Path):
    model = load(run)
    inputs = model.inputs(decoded)
    predicted = torch.cat([model.forward(inputs[s : s + BATCH]).classes for s in range(0, len(inputs), BATCH)])
    accuracy = float((predicted == labels).float().mean())
    files = sorted(images.rglob("*.png"), key=str)
    forward, through_predict, decoding = [], [], []
    for number in range(rounds):
        forward.append(rate(lambda batch: model.module(batch), inputs))
        with Stopwatch() as watch:  # what one decoding process gives: Pillow, then fitted (model.read)
            for path in files[:2000]:
                model.read(path)
        decoding.append(2000 / watch.seconds)
        result = predict(predict_config(run, images, folder / f"predict_{name}_{number}"))
        through_predict.append(result["images"] / result["seconds"])
        assert abs(result["accuracy"] - accuracy) < 1e-9, (result["accuracy"], accuracy)
    exported = {}
    module = Exported(model).eval()
    for format in ("onnx", "torchscript"):
        path = export(model, format, folder / f"{name}.{format}")
        exported[format] = (runner(format, path), path.stat().st_size)
    with torch.no_grad():
        eager_scores = torch.cat([module(decoded[s : s + BATCH])[0] for s in range(0, len(decoded), BATCH)])
        differences = {
            format: float(
                (torch.cat([run_file(decoded[s : s + BATCH])[0] for s in range(0, len(decoded), BATCH)]) - eager_scores)
                .abs()
                .max()
            )
            for format, (run_file, _) in exported.items()
        }
    rates: dict[str, list[float]] = {"eager": [], "onnx": [], "torchscript": []}
    for _ in range(rounds):
        rates["eager"].append(rate(module, decoded))
        for format, (run_file, _) in exported.items():
            rates[format].append(rate(run_file, decoded))
    return {
        "model": model,
        "accuracy": accuracy,
        "forward": forward,
        "predict": through_predict,
        "decoding": decoding,
        "rates": rates,
        "sizes": {format: size for format, (_, size) in exported.items()},
        "differences": differences,
        "checkpoint_bytes": model.checkpoint.stat().st_size,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    register()
    started = datetime.datetime.now()
    with tempfile.TemporaryDirectory() as temporary:
        folder = Path(temporary)
        from capsexp.config.hydra_setup import compose

        data = MNISTDataModule(data_dir=compose().paths.data_dir)
        data.prepare_data()
        data.setup("test")
        write_split(data.data_test.images, data.data_test.targets, folder / "digits")
        decoded, labels = data.data_test.images, data.data_test.targets
        results = {
            name: bench(name, train(name, folder), folder / "digits", decoded, labels, args.rounds, folder)
            for name in args.models
        }
    args.output.write_text(page(results, started, args.rounds))
    print(args.output.read_text())


def page(results: dict, started: datetime.datetime, rounds: int) -> str:
    median = statistics.median
    lines = [
        "# Predicting on image files, and the exported models",
        "",
        f"- Machine: {describe_text(describe())}; torch's default threads (2);",
        "  `capsexp.predict` with its defaults (batches of 256, one process decoding images beside the model).",
        f"- Code: `{short(describe_revision())}`; run {started:%Y-%m-%d}. Command:",
        f"  `python experiments/bench_predict.py` ({rounds} rounds, medians; the machine is shared, so rates vary).",
        "- Images: the 10,000 MNIST test digits written as 28x28 grey PNG files, in class folders (so predict also",
        "  reports the accuracy, which equals the model's on the decoded digits: checked).",
        "",
        "## Predicting on files against the model's forward pass",
        "",
        "| model | test accuracy | forward pass (images/s) | `capsexp.predict` on the PNG files (images/s) | ratio |"
        " decoding alone, one process (images/s) |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, result in results.items():
        forward, through = median(result["forward"]), median(result["predict"])
        training = " ".join(o for o in MODELS[name] if "max_steps" in o)
        lines.append(
            f"| `model={name}` ({training}) | {100 * result['accuracy']:.2f}% | {forward:,.0f} | {through:,.0f} |"
            f" {through / forward:.2f} | {median(result['decoding']):,.0f} |"
        )
    lines += [""]
    for name, result in results.items():
        forward, through, decoding = (median(result[key]) for key in ("forward", "predict", "decoding"))
        if decoding < forward:  # decoding, not the model, bounds the rate
            lines.append(
                f"For `{name}`, decoding a PNG file with Pillow and fitting it ({decoding:,.0f} images/s in one "
                f"process) costs more than the model's forward pass ({forward:,.0f} images/s on both cores): with "
                f"2 cores shared by the decoding process and the model, predict reaches {through:,.0f} images/s, "
                f"{through / forward:.2f} of the forward pass. It would take a decoder faster than Pillow's or "
                "more cores for files to keep up with a net this small."
            )
        else:
            lines.append(
                f"For `{name}`, the model costs more than decoding ({forward:,.0f} against {decoding:,.0f} "
                f"images/s): predict runs at {through / forward:.2f} of the forward pass."
            )
    lines += [
        "",
        "The forward pass: the net on the decoded digits already on the device, batches of 256, no gradient. "
        "`capsexp.predict`: from the first file read to the last CSV row written (Lightning's `Trainer.predict`, "
        "PNG decoding in one worker process, fitting, the model, the rows), the model already loaded.",
        "",
        "Every round's rates (images/s):",
        "",
    ]
    for name, result in results.items():
        lines.append(
            f"- `{name}`: forward {', '.join(f'{r:,.0f}' for r in result['forward'])}; "
            f"predict {', '.join(f'{r:,.0f}' for r in result['predict'])}; "
            f"decoding {', '.join(f'{r:,.0f}' for r in result['decoding'])}"
        )
    lines += [
        "",
        "## Eager against exported",
        "",
        "| model | checkpoint | ONNX file | TorchScript file | eager (images/s) | ONNX Runtime | TorchScript |"
        " largest score difference (ONNX, TorchScript) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
    ]
    for name, result in results.items():
        rates, sizes, diff = result["rates"], result["sizes"], result["differences"]
        lines.append(
            f"| `{name}` | {result['checkpoint_bytes'] / 2**20:.1f} MiB | {sizes['onnx'] / 2**20:.1f} MiB |"
            f" {sizes['torchscript'] / 2**20:.1f} MiB | {median(rates['eager']):,.0f} |"
            f" {median(rates['onnx']):,.0f} ({median(rates['onnx']) / median(rates['eager']):.2f}x) |"
            f" {median(rates['torchscript']):,.0f} ({median(rates['torchscript']) / median(rates['eager']):.2f}x) |"
            f" {diff['onnx']:.1e}, {diff['torchscript']:.1e} |"
        )
    lines += [
        "",
        "Each rate includes the graph's preprocessing step (uint8 to [0, 1]); ONNX Runtime on the CPU execution "
        "provider with its default threads. The checkpoint holds the optimizer's state too (Adam: twice the "
        "weights), which the exported files do not.",
        "",
        "What this does not show: GPU rates (no GPU here), other batch sizes, or models other than these two.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
