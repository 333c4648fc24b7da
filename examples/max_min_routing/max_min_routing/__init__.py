"""Max-min normalised routing's options, free of torch (capsexp's command line reads them before it imports
torch); the routing itself is ``max_min_routing.routing``."""

from dataclasses import dataclass
from typing import ClassVar

from capsexp.config.routing_options import Routing


@dataclass(frozen=True)
class MaxMinRouting(Routing):
    iterations: int = 3
    lower: float = 0.0
    upper: float = 1.0
    router: ClassVar[str] = "max_min_routing.routing:max_min_routing"
    coupled_parents: ClassVar[bool] = True  # squash of the weighted votes, its length the activation
