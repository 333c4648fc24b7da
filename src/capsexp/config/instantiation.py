"""Building a config node: ``hydra.utils.instantiate``, with the errors of a value the config check
cannot judge alone turned into a :class:`~capsexp.errors.ConfigError` naming the node; Lightning's
notices kept off the console while its objects are built."""

from __future__ import annotations

import logging
from typing import Any

from hydra.errors import InstantiationException
from hydra.utils import instantiate as hydra_instantiate
from lightning.fabric.utilities.exceptions import MisconfigurationException
from omegaconf import DictConfig

from capsexp.errors import ConfigError

# What a trainer error is usually about.
TRAINER_DEVICE_KEYS = ("accelerator", "devices", "num_nodes", "strategy", "precision")


def instantiate(key: str, node: Any, **kwargs: Any) -> Any:
    """``hydra.utils.instantiate`` of the config node at ``key``; a constructor's ValueError or
    Lightning's MisconfigurationException (a value the config check cannot judge alone: an image too
    small for a net, a GPU asked for on a machine without one) becomes a :class:`ConfigError` naming
    the node. The constructors' own messages name their class and argument (:mod:`capsexp.config.arguments`)."""
    try:
        return hydra_instantiate(node, **kwargs)
    except InstantiationException as error:
        cause = error.__cause__
        if isinstance(cause, (ValueError, MisconfigurationException)) and not isinstance(cause, ConfigError):
            message = f"{cause}\n  raised building {key} ({node.get('_target_')})"
            if key == "trainer":
                message += "\n  " + " ".join(f"trainer.{name}={node.get(name)}" for name in TRAINER_DEVICE_KEYS)
            raise ConfigError(message) from error
        raise


def build_model(key: str, node: Any) -> Any:
    """The LightningModule of a ``model`` config node (``key`` names it in messages), its arguments
    plain lists and dicts, not OmegaConf containers: Lightning saves them in checkpoints as
    hyperparameters, and checkpoints load with ``torch.load(weights_only=True)``."""
    return instantiate(key, node, _convert_="partial")


def instantiate_all(group_key: str, group: DictConfig | None, extra: dict[str, dict] | None = None) -> list[Any]:
    """Instantiate every entry of a ``callbacks`` or ``logger`` node; ``null`` entries are skipped,
    so ``callbacks.progress_bar=null`` removes one. ``extra``: more arguments for the entries whose
    class has that name (``{"TensorBoardLogger": {"purge_step": 40}}``)."""
    return [
        instantiate(f"{group_key}.{name}", node, **(extra or {}).get(str(node._target_).rsplit(".", 1)[-1], {}))
        for name, node in (group or {}).items()
        if node is not None and "_target_" in node
    ]


# Lightning's notices at INFO (GPU/TPU available, the seed, a tip advertising a cloud logger, "fit
# stopped"): capsexp's own lines say what a run does; Lightning's warnings still show.
LIGHTNING_NOTICES = (
    "lightning.pytorch.utilities.rank_zero",
    "lightning.fabric.utilities.rank_zero",
    "lightning.fabric.utilities.seed",
)


def quiet_lightning_notices() -> None:
    """Lightning's INFO notices (:data:`LIGHTNING_NOTICES`) off the console and the log file."""
    for name in LIGHTNING_NOTICES:
        logging.getLogger(name).setLevel(logging.WARNING)
