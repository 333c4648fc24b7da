"""capsexp: capsule-network experiments with PyTorch Lightning and Hydra.

The root package is a facade: ``capsexp.load`` and the folder of capsexp's configs (``CONFIG_DIR``)
are imported when first used, so ``import capsexp`` loads neither torch nor any of the
package's rooms, and no module of the package imports this one.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

# Transparent huge pages for PyTorch's large CPU allocations (a documented c10 switch). PyTorch reads
# it at its first allocation of 2 MiB or more, so setting it here works for the CLI and for a script
# that imports capsexp before allocating large tensors. Fresh 4 KiB-page buffers cost a page fault
# per 4 KiB, which on CapsNet's large vote tensors costs more than the routing arithmetic written into
# them (docs/speed.md). THP_MEM_ALLOC_ENABLE=0 in the environment turns it off.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

__version__ = "0.1.0"

if TYPE_CHECKING:
    from capsexp.locations import CONFIG_DIR
    from capsexp.use.inference import load

__all__ = ["CONFIG_DIR", "__version__", "load"]


def __getattr__(name: str) -> Any:
    """``capsexp.load`` (:func:`capsexp.use.inference.load`): a checkpoint or run folder as a model that
    predicts on images::

        model = capsexp.load("logs/train/runs/<time>")
        predictions = model.predict(["digit.png", "photo.jpg"])

    and the folder of capsexp's configs, ``capsexp.CONFIG_DIR``."""
    if name == "load":
        from capsexp.use.inference import load

        return load
    if name == "CONFIG_DIR":
        from capsexp import locations

        return getattr(locations, name)
    raise AttributeError(f"module 'capsexp' has no attribute {name!r}")
