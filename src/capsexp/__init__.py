"""capsexp: capsule-network experiments with PyTorch Lightning and Hydra."""

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
