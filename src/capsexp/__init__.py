"""capsexp: capsule-network experiments with PyTorch Lightning and Hydra."""

import os
from pathlib import Path

# Transparent huge pages for PyTorch's large CPU allocations (a documented c10 switch). PyTorch reads
# it at its first allocation of 2 MiB or more, so setting it here works for the CLI and for a script
# that imports capsexp before allocating large tensors. Fresh 4 KiB-page buffers cost a page fault
# per 4 KiB: for the 94 MB vote tensors of CapsNet that was 30 ms each, a third of the capsule layers'
# time on a 2-core CPU. THP_MEM_ALLOC_ENABLE=0 in the environment turns it off.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

from omegaconf import OmegaConf

__version__ = "0.1.0"

# The repository root (src/capsexp/__init__.py -> two levels up): conf/, data/ and logs/ live there.
PROJECT_ROOT = Path(__file__).resolve().parents[2]
CONFIG_DIR = PROJECT_ROOT / "conf"

# ${project_root:} in the configs; registered on import so that any composition (CLI, tests,
# notebooks using hydra.compose) resolves it.
if not OmegaConf.has_resolver("project_root"):
    OmegaConf.register_new_resolver("project_root", lambda: str(PROJECT_ROOT))
# ${stereo_channels:${data.stereo}}: smallNORB's input channels for its stereo mode.
if not OmegaConf.has_resolver("stereo_channels"):
    OmegaConf.register_new_resolver("stereo_channels", lambda stereo: 2 if stereo == "both" else 1)


def _store_routing_options() -> None:
    """``model/routing=em`` and ``model/routing=dynamic``: the routing options of the capsule nets
    (``model.net.routing``), taken from the defaults of :class:`capsexp.nn.EMRouting` and
    :class:`capsexp.nn.DynamicRouting` (their one home) rather than restated in YAML files. They are
    read from :mod:`capsexp.routing_options`, which does not import torch."""
    from dataclasses import asdict

    from hydra.core.config_store import ConfigStore

    from capsexp.routing_options import DynamicRouting, EMRouting

    for name, options in (("em", EMRouting), ("dynamic", DynamicRouting)):
        node = {"_target_": f"capsexp.nn.{options.__name__}", **asdict(options())}
        ConfigStore.instance().store(group="model/routing", name=name, node=node, package="model.net.routing")


_store_routing_options()
