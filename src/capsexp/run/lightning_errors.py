"""Lightning's errors about its own settings, named as the trainer keys that set them."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

from lightning.fabric.utilities.exceptions import MisconfigurationException

from capsexp.errors import ConfigError

# Lightning names its settings in backquotes: `val_check_interval` (300) must be less than or equal to...
_SETTING = re.compile(r"`(\w+)`")


@contextlib.contextmanager
def lightning_settings_named() -> Iterator[None]:
    """Lightning's errors from ``Trainer.fit`` about its own settings, judged against the data (a
    validation interval beyond the epoch's batches: a ValueError naming `val_check_interval`), as a
    :class:`ConfigError` naming the trainer keys, instead of a traceback through the training loop.
    A ValueError that names no Trainer argument is not Lightning's about its settings: it is raised."""
    import inspect

    from lightning.pytorch import Trainer

    try:
        yield
    except (MisconfigurationException, ValueError) as error:
        settings = inspect.signature(Trainer.__init__).parameters
        keys = [f"trainer.{name}" for name in dict.fromkeys(_SETTING.findall(str(error))) if name in settings]
        if not keys:
            raise
        raise ConfigError(f"the trainer's settings ({', '.join(keys)}) do not fit the data: {error}") from error
