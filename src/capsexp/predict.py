"""Predict with a trained model: ``python -m capsexp.predict ckpt_path=<checkpoint or run folder>
images=<file | folder | glob> [top_k=3] [explain=8] [trainer.accelerator=gpu]`` (``conf/predict.yaml``;
docs/predict.md). Writes ``predictions.csv``, ``summary.md`` and per-image figures into its folder,
``logs/predict/runs/<time>/``."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from capsexp.config import hydra_setup
from capsexp.config.command_line import options_help
from capsexp.errors import CapsexpError, report
from capsexp.locations import CONFIG_DIR, quote_locations

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
            from capsexp.run.checkpoints import read_checkpoint

            read_checkpoint(cfg.ckpt_path, f"ckpt_path={cfg.ckpt_path}")  # its message for a missing file
        found = image_files(str(cfg.images))
        skipped = f" ({len(found.skipped):,} other files skipped)" if found.skipped else ""
        log.info(f"{len(found.files):,} images to predict on{skipped}; loading the model of {cfg.ckpt_path}")
        from capsexp.use.predict import predict

        predict(cfg, found)
    except CapsexpError as error:
        report(error)


def cli() -> None:
    """The entry point: a location typed as capsexp printed it (a run folder named by its overrides, with
    ``=`` and ``,``) quoted for Hydra (:mod:`capsexp.locations`), then :func:`main`."""
    if any(argument in ("--help", "-h") for argument in sys.argv[1:]):
        print(options_help(CONFIG_DIR / "predict.yaml"), end="")
        return
    sys.argv[1:] = quote_locations(sys.argv[1:])
    main()


if __name__ == "__main__":
    cli()
