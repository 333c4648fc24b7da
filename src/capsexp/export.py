"""Export a trained model: ``python -m capsexp.export ckpt_path=<checkpoint, run or job folder>
format=onnx|torchscript`` (``conf/export.yaml``; docs/predict.md#export). Writes ``model.onnx`` or
``model.pt`` and ``model.json`` into its folder, ``logs/export/runs/<time>/``, and checks the file's
outputs against the model's."""

from __future__ import annotations

import hydra
from omegaconf import DictConfig

from capsexp.config import hydra_setup
from capsexp.config.command_line import command
from capsexp.errors import CapsexpError, report
from capsexp.locations import CONFIG_DIR

hydra_setup.register_routing()  # the resolvers conf/hydra/default.yaml calls


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="export")
def main(cfg: DictConfig) -> None:
    from capsexp.use.export import export_command  # torch: after Hydra has read the command line

    try:
        export_command(cfg)
    except CapsexpError as error:
        report(error)


def cli() -> None:
    """The entry point (``python -m capsexp.export``): :func:`capsexp.config.command_line.command`."""
    command(main, CONFIG_DIR / "export.yaml")


if __name__ == "__main__":
    cli()
