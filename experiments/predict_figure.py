"""The per-image figure shown in docs/predict.md: ``explain_figure`` of one MNIST test digit for a trained
checkpoint, as ``python -m capsexp.predict ... explain=1`` draws it.

    python experiments/predict_figure.py logs/train/runs/<time> --index 0 --output docs/images/predict_explain.png

The docs' figure: ``model=capsnet_small data=mnist trainer.max_steps=1500`` (seed 1234), ``--index 8``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import capsexp
from capsexp.data import MNISTDataModule
from capsexp.use.explain import explain_figure


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", help="a run folder or a .ckpt file of a model trained on MNIST")
    parser.add_argument(
        "--index", type=int, default=0, help="the MNIST test image to explain (its index in the test set)"
    )
    parser.add_argument("--output", type=Path, default=Path("docs/images/predict_explain.png"))
    args = parser.parse_args(argv)
    model = capsexp.load(args.checkpoint)
    data = MNISTDataModule(data_dir=model.config.data.data_dir)
    data.prepare_data()
    data.setup("test")
    image, label = data.data_test.images[args.index], int(data.data_test.targets[args.index])
    predictions = model.predict(image)
    figure = explain_figure(model, predictions, 0, f"MNIST test image no. {args.index}, label {label}")
    figure.savefig(args.output, dpi=80)
    print(f"{args.output}: {model.describe()}; predicted {predictions.names[0]}")


if __name__ == "__main__":
    main()
