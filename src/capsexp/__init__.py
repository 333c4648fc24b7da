"""capsexp: capsule-network experiments with PyTorch Lightning and Hydra."""

import importlib
import os
from pathlib import Path

# Transparent huge pages for PyTorch's large CPU allocations (a documented c10 switch). PyTorch reads
# it at its first allocation of 2 MiB or more, so setting it here works for the CLI and for a script
# that imports capsexp before allocating large tensors. Fresh 4 KiB-page buffers cost a page fault
# per 4 KiB: for the 94 MB vote tensors of CapsNet that was 30 ms each, a third of the capsule layers'
# time on a 2-core CPU. THP_MEM_ALLOC_ENABLE=0 in the environment turns it off.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

__version__ = "0.1.0"

# The repository root (src/capsexp/__init__.py -> two levels up): conf/, data/ and logs/ live there.
PROJECT_ROOT = Path(__file__).resolve().parents[2]
CONFIG_DIR = PROJECT_ROOT / "conf"


def load(path: str | os.PathLike, device: str = "cpu"):
    """The trained model of a checkpoint or run folder, ready to predict (:func:`capsexp.run.inference.load`)::

    model = capsexp.load("logs/train/runs/<time>")
    predictions = model.predict(["digit.png", "photo.jpg"])
    """
    # Imported by name when called: the root package is what every layer imports (for CONFIG_DIR), so a
    # static import of the run layer here would close a cycle through it, and would load torch and
    # Lightning for anyone importing capsexp.nn alone.
    return importlib.import_module("capsexp.run.inference").load(path, device)
