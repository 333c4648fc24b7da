"""capsexp: capsule-network experiments with PyTorch Lightning and Hydra."""

from pathlib import Path

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
