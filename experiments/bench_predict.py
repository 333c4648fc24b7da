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

- **people's files**: the same models on 500 MNIST test digits as PNG files and redrawn as people's files
  come (``peoples_files.py``: dark ink on light paper, anywhere on a 200x200 page, 40 to 200 pixels high,
  JPEG), with ``fit=conventions`` (the default) and ``fit=plain``; blank pages and noise, which no digit is
  in; and phone photos stored sideways with their EXIF orientation against their upright copies.
- **lighting**: LeNet5 and ``model=capsnet_small`` on 200 MNIST test digits as 28x28 PNG files and as
  phone photos of paper (``peoples_files.py``'s ``write_photographed``: a vignette and a spot, a falloff or a
  shadow across the page, tinted and ruled paper, four inks, 200x200 to 1000x750, JPEG, EXIF), the gap
  between the two, per lighting, and each page on which no ink was found, with its line; blank photos.
- **figures**: ``capsexp.predict`` on 500 PNG files with ``explain=8`` against ``explain=false``
  (alternating rounds, medians): the prediction pass of each, and the figures' drawing apart.
- **start-up**: ``python -m capsexp.predict`` as a user runs it, in a new process: the seconds to its first
  output line, and to the error of a missing checkpoint.

Each part's figures are kept in ``bench_predict.json`` beside the page, which is written from it, so that
``--parts`` reruns some parts and keeps the others (each part names its code and date).

    python experiments/bench_predict.py                          # every part: about 25 minutes on 2 cores
    python experiments/bench_predict.py --parts people figures startup
    python experiments/bench_predict.py --parts lighting --models lenet5 capsnet_small [--runs NAME=RUN ...]

``--runs`` takes models already trained by the commands the page names (``NAME=<run folder>``) instead of
training them again.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import datetime
import io
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from omegaconf import open_dict

from capsexp.config.hydra_setup import register
from capsexp.data import MNISTDataModule
from capsexp.records.machine import describe, describe_text
from capsexp.records.revision import describe as describe_revision
from capsexp.records.revision import short
from capsexp.use.export import Exported, export, runner
from capsexp.use.inference import load
from capsexp.use.predict import predict
from mnist_image_folder import write_split
from peoples_files import (
    LIGHTING,
    SIDES,
    write_blank_photos,
    write_no_digit,
    write_people_files,
    write_photographed,
    write_pngs,
    write_sideways,
)
from timing import Stopwatch

PROJECT_ROOT = Path(__file__).resolve().parents[1]  # the checkout (experiments/ run only there)

RESULTS = PROJECT_ROOT / "experiments" / "results" / "bench_predict.md"
PARTS = ("speed", "people", "lighting", "figures", "startup")
PEOPLE = 500  # test digits drawn as people's files
PHOTOGRAPHED = 200  # test digits photographed on unevenly lit paper (the generator was tuned on digits 5000+)
FIGURE_FILES = 500  # PNG files of the explain=8 against explain=false rounds
BATCH = 256
# Each model's training here: long enough to be a real model, short enough for the benchmark.
MODELS = {
    "lenet5": ["model=lenet5", "trainer.max_steps=1000"],
    "capsnet": ["model=capsnet", "trainer.max_steps=150"],
    "capsnet_small": ["model=capsnet_small", "trainer.max_steps=400"],
}
DEFAULT_MODELS = ("lenet5", "capsnet")  # the lighting part's are lenet5 and capsnet_small
# Shorter than an epoch, so never validated: predict takes the run's last.ckpt (its log says so).
TRAINING = ["data=mnist", "trainer.max_epochs=1", "test=false", "callbacks.progress_bar=null"]


def train(name: str, folder: Path) -> Path:
    run = folder / "runs" / name
    command = [sys.executable, "-m", "capsexp", *MODELS[name], *TRAINING, f"hydra.run.dir={run}"]
    print(" ".join(command[1:]), flush=True)
    subprocess.run(command, check=True, cwd=PROJECT_ROOT, capture_output=True)
    return run


def predict_config(run: Path, images: Path, output: Path, *overrides: str):
    from capsexp.config.hydra_setup import compose

    cfg = compose([f"ckpt_path={run}", f"images={images}", "lines=0", "explain=0", *overrides], "predict")
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
        "accuracy": accuracy,
        "forward": forward,
        "predict": through_predict,
        "decoding": decoding,
        "rates": rates,
        "sizes": {format: size for format, (_, size) in exported.items()},
        "differences": differences,
        "checkpoint_bytes": model.checkpoint.stat().st_size,
    }


def people(name: str, run: Path, digits: np.ndarray, labels: np.ndarray, folder: Path) -> dict:
    """Accuracy on the digits as PNGs and redrawn as people's files (conventions, plain); how many files
    without a digit are flagged; sideways photos against their upright copies."""
    pngs = write_pngs(digits, labels, folder / f"{name}_pngs")
    drawn = write_people_files(digits, labels, folder / f"{name}_people")
    upright, sideways = write_sideways(digits[:100], labels[:100], folder / f"{name}_photos")
    empty = write_no_digit(folder / f"{name}_no_digit")

    def run_on(images: Path, tag: str, *overrides: str) -> dict:
        return predict(predict_config(run, images, folder / f"out_{name}_{tag}", *overrides))

    on_pngs = run_on(pngs, "png")
    result = {
        "png": on_pngs["accuracy"],
        "people": run_on(drawn, "people")["accuracy"],
        "people_plain": run_on(drawn, "plain", "fit=plain")["accuracy"],
        "upright": run_on(upright, "upright")["accuracy"],
        "sideways": run_on(sideways, "sideways")["accuracy"],
    }
    classes = {}
    for tag in ("upright", "sideways"):
        with open(folder / f"out_{name}_{tag}" / "predictions.csv") as handle:
            rows = [line.split(",") for line in handle.read().splitlines()[1:]]
        classes[tag] = {row[0]: row[1] for row in rows}
    result["sideways_agree"] = sum(classes["upright"][k] == v for k, v in classes["sideways"].items()) / len(
        classes["sideways"]
    )
    no_digit = run_on(empty, "no_digit")
    result["no_digit"] = {"files": no_digit["images"], "absent": no_digit["absent"]}
    result["presence_threshold"] = no_digit["presence_threshold"]
    result["png_absent"] = on_pngs["absent"]
    return result


def lighting(name: str, run: Path, digits: np.ndarray, labels: np.ndarray, folder: Path) -> dict:
    """Accuracy on the digits as PNGs and photographed on unevenly lit paper, per lighting; the pages on
    which no ink was found, and whether their printed lines say so; blank photos."""
    pngs = write_pngs(digits, labels, folder / f"{name}_lit_pngs")
    photos = folder / f"{name}_lit"
    drawn = write_photographed(digits, labels, photos)
    blank = write_blank_photos(folder / f"{name}_lit_blank")

    def run_on(images: Path, tag: str) -> tuple[dict, list[dict], str]:
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            result = predict(predict_config(run, images, folder / f"lit_{name}_{tag}", "lines=all"))
        with open(folder / f"lit_{name}_{tag}" / "predictions.csv", newline="") as handle:
            return result, list(csv.DictReader(handle)), printed.getvalue()

    on_pngs = run_on(pngs, "png")[0]
    result, rows, printed = run_on(photos, "photos")
    kinds = {what["file"]: what for what in drawn}
    per_kind = {
        kind: [int(row["correct"]) for row in rows if kinds[row["file"]]["lighting"] == kind] for kind in LIGHTING
    }
    no_ink = [row["file"] for row in rows if "no ink found" in row["notes"]]
    said = [line for line in printed.splitlines() if "[no ink found" in line]
    _, blank_rows, blank_printed = run_on(blank, "blank")
    return {
        "png": on_pngs["accuracy"],
        "photos": result["accuracy"],
        "per_lighting": {kind: [sum(v), len(v)] for kind, v in per_kind.items()},
        "ruled": [
            sum(int(r["correct"]) for r in rows if kinds[r["file"]]["ruled"]),
            sum(kinds[r["file"]]["ruled"] for r in rows),
        ],
        "no_ink": no_ink,
        "no_ink_said_on_line": len(said),
        "blank_pages": len(blank_rows),
        "blank_no_ink": sum("no ink found" in row["notes"] for row in blank_rows),
        "blank_said_on_line": sum("[no ink found" in line for line in blank_printed.splitlines()),
        "files": len(rows),
    }


def figures(run: Path, digits: np.ndarray, labels: np.ndarray, rounds: int, folder: Path) -> dict:
    """The prediction pass with explain=8 against explain=false, alternating; the figures' time apart."""
    images = write_pngs(digits, labels, folder / "figure_pngs")
    passes: dict[str, list[float]] = {"explain=8": [], "explain=false": []}
    drawing = []
    for number in range(rounds):
        for setting in passes:
            result = predict(predict_config(run, images, folder / f"figures_{number}_{setting}", setting))
            passes[setting].append(result["seconds"])
            if setting == "explain=8":
                drawing.append(result["figure_seconds"])
    return {"passes": passes, "drawing": drawing, "files": len(digits)}


def first_line_seconds(command: list[str]) -> tuple[float, float, str]:
    """Seconds from starting ``command`` to its first output line, and to its end; that line."""
    started = time.perf_counter()
    process = subprocess.Popen(command, cwd=PROJECT_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    first = ""
    while not first.strip():
        first = process.stdout.readline()
        if not first and process.poll() is not None:
            break
    to_first = time.perf_counter() - started
    process.communicate()
    return to_first, time.perf_counter() - started, first.strip()


def startup(run: Path, digits: np.ndarray, labels: np.ndarray, rounds: int, folder: Path) -> dict:
    """``python -m capsexp.predict`` in a new process: to its first line, and a missing checkpoint's error."""
    images = write_pngs(digits, labels, folder / "startup_pngs")
    first, total, error = [], [], []
    line = ""
    for number in range(rounds):
        out = f"hydra.run.dir={folder / f'startup_{number}'}"
        to_first, to_end, line = first_line_seconds(
            [sys.executable, "-m", "capsexp.predict", f"ckpt_path={run}", f"images={images}", "explain=0", out]
        )
        first.append(to_first)
        total.append(to_end)
        missing = [sys.executable, "-m", "capsexp.predict", "ckpt_path=missing/run", f"images={images}"]
        error.append(first_line_seconds(missing)[1])
    line = line.split(" - ", 1)[-1].split(";")[0]  # its first words: no path of this machine
    return {"first_line": first, "total": total, "error": error, "line": line, "files": len(digits)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS), choices=list(MODELS))
    parser.add_argument("--runs", nargs="*", default=[], help="NAME=<run folder>: a model trained already")
    parser.add_argument("--parts", nargs="+", default=list(PARTS), choices=list(PARTS))
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    register()
    kept = args.output.with_suffix(".json")
    results = json.loads(kept.read_text()) if kept.exists() else {}
    stamp = {
        "code": short(describe_revision()),
        "date": f"{datetime.datetime.now():%Y-%m-%d}",
        "machine": describe_text(describe()),
        "rounds": args.rounds,
    }
    with tempfile.TemporaryDirectory() as temporary:
        folder = Path(temporary)
        from capsexp.config.hydra_setup import compose

        data = MNISTDataModule(data_dir=compose().paths.data_dir)
        data.prepare_data()
        data.setup("test")
        decoded, labels = data.data_test.images, data.data_test.targets
        digits, numbers = decoded[:, 0].numpy(), labels.numpy()
        if "speed" in args.parts:
            write_split(decoded, labels, folder / "digits")
        given = dict(item.split("=", 1) for item in args.runs)
        runs = {name: Path(given[name]) if name in given else train(name, folder) for name in args.models}
        for name, run in runs.items():
            if "speed" in args.parts:
                results.setdefault("speed", {})[name] = {
                    **bench(name, run, folder / "digits", decoded, labels, args.rounds, folder),
                    **stamp,
                }
            if "lighting" in args.parts:
                results.setdefault("lighting", {})[name] = {
                    **lighting(name, run, digits[:PHOTOGRAPHED], numbers[:PHOTOGRAPHED], folder),
                    **stamp,
                }
            if "people" in args.parts:
                results.setdefault("people", {})[name] = {
                    **people(name, run, digits[:PEOPLE], numbers[:PEOPLE], folder),
                    **stamp,
                }
        capsnet = runs.get("capsnet")
        if capsnet is not None and "figures" in args.parts:
            figure_digits = digits[:FIGURE_FILES], numbers[:FIGURE_FILES]
            results["figures"] = {**figures(capsnet, *figure_digits, max(args.rounds, 5), folder), **stamp}
        if capsnet is not None and "startup" in args.parts:
            results["startup"] = {**startup(capsnet, digits[:500], numbers[:500], max(args.rounds, 5), folder), **stamp}
    kept.write_text(json.dumps(results, indent=1) + "\n")
    args.output.write_text(page(results))
    print(args.output.read_text())


def page(results: dict) -> str:
    median = statistics.median
    parts = [results[part] for part in ("people", "lighting", "speed") if part in results] + [
        results[part] for part in ("figures", "startup") if part in results
    ]
    stamps = sorted({f"`{s['code']}` ({s['date']}, {s['machine']})" for part in parts for s in _stamps(part)})
    lines = [
        "# Predicting on image files: people's files, start-up, figures, speed, and the exported models",
        "",
        f"- Machine and code of each part: {'; '.join(stamps)}.",
        "  torch's default threads (2); `capsexp.predict` with its defaults (batches of 256, one process decoding",
        "  images beside the model) unless a part says otherwise.",
        "- Command: `python experiments/bench_predict.py` (every part; `--parts people figures startup` reruns",
        "  those and keeps the others, from `bench_predict.json` beside this page). Medians; the machine is shared.",
        "- Models: " + ", ".join(f"`{' '.join(overrides)}`" for overrides in MODELS.values()) + ", each trained here "
        "on MNIST (`" + " ".join(TRAINING) + "`).",
        "",
    ]
    if "people" in results:
        lines += [
            "## People's files",
            "",
            f"The first {PEOPLE} MNIST test digits, as 28x28 PNG files and redrawn as people's files come "
            f"(`experiments/peoples_files.py`: dark ink on light paper, anywhere on a 200x200 page, "
            f"{SIDES[0]} to {SIDES[1]} pixels high, JPEG), in class folders, so `capsexp.predict` gives the accuracy:",
            "",
            "| model | PNG files | people's files (`fit=conventions`, the default) | people's files, `fit=plain` |"
            " photos stored sideways (EXIF), against their upright copies | blank pages and noise flagged |",
            "| --- | ---: | ---: | ---: | --- | --- |",
        ]
        for name, result in results["people"].items():
            flagged = result["no_digit"]
            no_digit = (
                f"{flagged['absent']} of {flagged['files']}; false flags: {result['png_absent']} of the "
                f"{PEOPLE} PNG digits"
                if result["presence_threshold"] is not None
                else "no presence threshold (softmax)"
            )
            lines.append(
                f"| `{name}` | {100 * result['png']:.1f}% | **{100 * result['people']:.1f}%** |"
                f" {100 * result['people_plain']:.1f}% | {100 * result['sideways']:.1f}% against"
                f" {100 * result['upright']:.1f}%; the same class for {100 * result['sideways_agree']:.0f}% |"
                f" {no_digit} |"
            )
        lines += [
            "",
            "`fit=conventions` inverts dark ink on light paper and frames the ink as MNIST framed its digits "
            "(a 20x20 box, centred by its mass in 28x28); `fit=plain` resizes the page alone. "
            "The photos: 100 of the redrawn digits saved turned by 90 degrees with EXIF orientation 6, "
            "and upright; a sideways file is the turned image encoded as JPEG anew, so its pixels differ a little "
            "from the upright file's once turned back, and a digit near a decision may change class. Blank pages "
            "(paper grey, JPEG) and images of uniform random pixels, 10 of each: a capsule model flags an image where "
            "no class capsule reaches the margin loss's midpoint, 0.5; its false flags are the MNIST digits (as PNG "
            "files) it found no class in.",
            "",
            "What this does not show: real photographs (lighting gradients, shadows, ruled paper), handwriting "
            "other than MNIST's writers', several digits on a page, fully trained models (these trained for the "
            "steps above, short of an epoch), or models other than these two.",
            "",
        ]
    if "lighting" in results:
        lines += _lighting(results["lighting"])
    if "startup" in results:
        result = results["startup"]
        lines += [
            "## Start-up",
            "",
            f"`python -m capsexp.predict` on {result['files']} PNG files in a new process, as a user runs it "
            f"({len(result['first_line'])} runs): its first line after **{median(result['first_line']):.1f} s** "
            f"(`{result['line']}`), the whole command {median(result['total']):.1f} s; the error of a missing "
            f"checkpoint after **{median(result['error']):.1f} s**. The first line comes before torch and "
            "Lightning load: the options are checked and the files listed without them.",
            "",
            f"Every run (s): first line {_listed(result['first_line'], 1)}; whole command "
            f"{_listed(result['total'], 1)}; error {_listed(result['error'], 1)}.",
            "",
        ]
    if "figures" in results:
        result = results["figures"]
        with_figures, without = (median(result["passes"][key]) for key in ("explain=8", "explain=false"))
        lines += [
            "## Figures",
            "",
            f"`model=capsnet` on {result['files']} PNG files, `explain=8` against `explain=false`, alternating "
            f"({len(result['drawing'])} rounds): the prediction pass takes {with_figures:.2f} s against "
            f"{without:.2f} s (medians, {with_figures / without:.2f}x; the rounds' ranges, below, "
            f"{'overlap: no measurable difference' if _overlap(result['passes']) else 'do not overlap'}); the 8 "
            "figures are drawn after it, from a second pass over those 8 images, in "
            f"{median(result['drawing']):.1f} s, reported apart.",
            "",
            f"Every round (s): explain=8 {', '.join(f'{v:.2f}' for v in result['passes']['explain=8'])}; "
            f"explain=false {', '.join(f'{v:.2f}' for v in result['passes']['explain=false'])}; figures "
            f"{', '.join(f'{v:.1f}' for v in result['drawing'])}.",
            "",
        ]
    if "speed" in results:
        lines += _speed(results["speed"])
    lines += [
        "What this does not show: GPU rates (no GPU here), other batch sizes, large photos (the rates are for "
        "28x28 PNG files), `num_workers` other than 1, or other thread counts.",
        "",
    ]
    return "\n".join(lines)


def _lighting(results: dict) -> list[str]:
    lines = [
        "## Photos of paper: uneven light, shadows, tints, ruled lines",
        "",
        f"The first {PHOTOGRAPHED} MNIST test digits as 28x28 PNG files and photographed on paper "
        "(`experiments/peoples_files.py`'s `write_photographed`: each page 200x200, 600x400, 400x600 or 1000x750; "
        "white, cream, blue-tinted or grey paper, a third ruled in light blue; black, blue-pen, pencil or red ink; "
        "the digit 12 to 80% of the shorter side anywhere on the page; corners 12% darker (a vignette) times a "
        "spot of light, a falloff across the page, a shadow with a soft edge, or nothing more; sensor noise; JPEG "
        "of quality 70 to 92, a tenth PNG, a fifth grey, a quarter stored sideways with EXIF orientation 6 or 8), "
        "predicted with the defaults (`fit=conventions invert=auto`):",
        "",
        "| model | PNG files | photos of paper | gap (points) | " + " | ".join(LIGHTING) + " | ruled |"
        " pages with no ink found (said on their line) | blank photos said to have no ink |",
        "| --- | ---: | ---: | ---: |" + " ---: |" * (len(LIGHTING) + 1) + " --- | --- |",
    ]
    for name, r in results.items():
        kinds = " | ".join(f"{100 * right / max(n, 1):.0f}% of {n}" for right, n in r["per_lighting"].values())
        lines.append(
            f"| `{name}` | {100 * r['png']:.1f}% | **{100 * r['photos']:.1f}%** |"
            f" {100 * (r['png'] - r['photos']):.1f} |"
            f" {kinds} | {100 * r['ruled'][0] / max(r['ruled'][1], 1):.0f}% of {r['ruled'][1]} |"
            f" {len(r['no_ink'])} ({r['no_ink_said_on_line']} lines say so) |"
            f" {r['blank_no_ink']} of {r['blank_pages']} ({r['blank_said_on_line']} lines say so) |"
        )
    lines += [
        "",
        "Before a page's polarity and its ink's box are decided, the paper's lighting is estimated as a "
        "large-scale background (a median and a morphological closing on a coarse grid of the page) and divided "
        "out (docs/predict.md#how-an-image-reaches-the-model; the parameters in `capsexp.data.conventions.PAGE`, "
        "set on test digits 5000 to 5199 before this run). A blank photo of ruled paper reads its lines as ink "
        "where they are as dark as `faintest_ink` says ink is.",
        "",
        "What this does not show: real photographs (these pages are drawn: their lighting is a product of smooth "
        "fields and one straight shadow edge), handwriting other than MNIST's writers', perspective, blur, "
        "crumpled paper, several digits on a page, fully trained models, or other models.",
        "",
    ]
    return lines


def _overlap(passes: dict[str, list[float]]) -> bool:
    first, second = passes.values()
    return min(first) <= max(second) and min(second) <= max(first)


def _listed(values: list[float], digits: int) -> str:
    return ", ".join(f"{value:.{digits}f}" for value in values)


def _stamps(part: dict) -> list[dict]:
    """The code, date and machine stamps of a part (one, or one per model)."""
    return [part] if "code" in part else list(part.values())


def _speed(results: dict) -> list[str]:
    median = statistics.median
    lines = [
        "## Predicting on files against the model's forward pass",
        "",
        "The 10,000 MNIST test digits written as 28x28 grey PNG files, in class folders (so predict also "
        "reports the accuracy, which equals the model's on the decoded digits: checked).",
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
                f"{through / forward:.2f} of the forward pass (a faster decoder or more cores would be needed for "
                "files to keep up with a net this small: not measured here)."
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
        "Every round's rates (images/s); they vary widely from round to round on this shared machine, so take "
        "the ratios as rough:",
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
        "Medians of the rounds above; each rate includes the graph's preprocessing step (uint8 to [0, 1]); ONNX "
        "Runtime on the CPU execution provider with its default threads. A ratio within the rounds' spread (the "
        "forward pass's rounds above) is no measured difference. The checkpoint holds the optimizer's state too "
        "(Adam: twice the weights), which the exported files do not.",
        "",
    ]
    return lines


if __name__ == "__main__":
    main()
