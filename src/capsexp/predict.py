"""Predict with a trained model: ``python -m capsexp.predict ckpt_path=<checkpoint, run or job folder>
images=<file | folder | glob> [top_k=3] [explain=8] [trainer.accelerator=gpu]`` (``conf/predict.yaml``;
docs/predict.md). Writes ``predictions.csv``, ``summary.md`` and per-image figures into its folder,
``logs/predict/runs/<time>/``."""

from __future__ import annotations

import logging
from pathlib import Path

import hydra
from omegaconf import DictConfig

from capsexp.config import hydra_setup
from capsexp.config.command_line import command
from capsexp.errors import CapsexpError, report
from capsexp.locations import CONFIG_DIR

hydra_setup.register_routing()  # the resolvers conf/hydra/default.yaml calls
log = logging.getLogger("capsexp")


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="predict")
def main(cfg: DictConfig) -> None:
    # What the command asks for is read and said before torch and Lightning load (seconds): a missing
    # file or a bad option is named at once, and the first line comes as soon as the files are listed.
    from capsexp.use.request import image_files, predict_options

    try:
        predict_options(cfg)
        if not Path(str(cfg.ckpt_path)).exists():
            from capsexp.records.checkpoints import read_checkpoint

            read_checkpoint(cfg.ckpt_path, f"ckpt_path={cfg.ckpt_path}")  # its message for a missing file
        found = image_files(str(cfg.images))
        skipped = f" ({len(found.skipped):,} other files skipped)" if found.skipped else ""
        log.info(f"{len(found.files):,} images to predict on{skipped}; loading the model of {cfg.ckpt_path}")
        from capsexp.use.predict import predict

        predict(cfg, found)
    except CapsexpError as error:
        report(error)


def cli() -> None:
    """The entry point (``python -m capsexp.predict``): :func:`capsexp.config.command_line.command`."""
    command(main, CONFIG_DIR / "predict.yaml")


if __name__ == "__main__":
    cli()
