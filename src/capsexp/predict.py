"""Predict with a trained model: ``python -m capsexp.predict ckpt_path=<checkpoint or run folder>
images=<file | folder | glob> [top_k=3] [explain=8] [trainer.accelerator=gpu]`` (``conf/predict.yaml``;
docs/predict.md). Writes ``predictions.csv``, ``summary.md`` and per-image figures into its folder,
``logs/predict/runs/<time>/``."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from capsexp import CONFIG_DIR
from capsexp.config import hydra_setup
from capsexp.errors import CapsexpError, report

hydra_setup.register_routing()  # the resolvers conf/hydra/default.yaml calls


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="predict")
def main(cfg: DictConfig) -> None:
    from capsexp.run.predict import predict  # torch and Lightning: after Hydra has read the command line

    try:
        predict(cfg)
    except CapsexpError as error:
        report(error)


if __name__ == "__main__":
    main()
