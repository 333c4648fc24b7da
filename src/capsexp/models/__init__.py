"""Pure ``torch.nn`` networks: no Lightning, no Hydra."""

from capsexp.models.baseline_cnn import BaselineCNN
from capsexp.models.capsnet import CapsNet, CapsNetOutput
from capsexp.models.em_caps import MatrixCapsNet, MatrixCapsNetOutput
from capsexp.models.lenet5 import LeNet5

__all__ = ["BaselineCNN", "CapsNet", "CapsNetOutput", "LeNet5", "MatrixCapsNet", "MatrixCapsNetOutput"]
