"""The arms of a routing's verdict (``experiment=routing_verdict +routing=<name>``): the routing and the controls
that differ from it, ``${verdict_arms:<name>}`` in the experiment's sweep. An arm that would repeat another for
this routing is left out (dynamic routing stopped after its first iteration is uniform coupling; uniform
coupling's own couplings, shuffled, are uniform)."""

from __future__ import annotations

import dataclasses

from capsexp.config.routing_registry import registered
from capsexp.errors import ConfigError

# In the page's order: the routing, the controls of its couplings, then the nets without routing.
ARMS = ("routing", "shuffled", "first_iteration", "uniform", "random", "plain_head", "cnn")


def verdict_arms(routing: str) -> str:
    """The arms of ``routing``'s verdict as a sweep's value (``routing,shuffled,...``); a ConfigError naming
    the routings where ``routing`` is none of them."""
    routings = registered()
    if routing not in routings:
        raise ConfigError(f"+routing={routing}: no such routing; one of: {', '.join(routings)}")
    options = routings[routing]
    left_out = set()
    if "iterations" not in {field.name for field in dataclasses.fields(options)} or options.first_iteration_uniform:
        left_out.add("first_iteration")  # nothing to stop early, or uniform coupling again
    if routing in ("uniform", "random"):
        left_out |= {routing, "shuffled", "first_iteration"}  # the arm itself; its couplings carry no image
    return ",".join(arm for arm in ARMS if arm not in left_out)
