"""The arms of a routing's verdict (``experiment=routing_verdict +routing=<name>``): the routing and the controls
that differ from it, ``${verdict_arms:<name>}`` in the experiment's sweep. An arm that would repeat another for
this routing is left out (dynamic routing stopped after its first iteration is uniform coupling; uniform
coupling's own couplings, shuffled, are uniform).

The reference (``experiment=routing_reference``) is the verdicts of several routings in one sweep, its
controls run once for all: its cells (``${reference_cells:<routings>}``) are each routing's own arms
(``<routing>-routing``, ``<routing>-shuffled``, ``<routing>-first_iteration``), then the shared controls
(``uniform``, ``random``, ``plain_head``, ``cnn``), each an option of ``+arm/routing_verdict`` (the own
cells: :func:`own_cell_nodes`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from capsexp.config.routing_registry import registered
from capsexp.errors import ConfigError

# In the page's order: the routing, the controls of its couplings, then the nets without routing.
ARMS = ("routing", "shuffled", "first_iteration", "uniform", "random", "plain_head", "cnn")
OWN_ARMS = ARMS[:3]  # the arms that hold the routing judged; the others are the same for every routing


def verdict_arms(routing: str) -> str:
    """The arms of ``routing``'s verdict as a sweep's value (``routing,shuffled,...``); a ConfigError naming
    the routings where ``routing`` is none of them."""
    options = _options(routing, "+routing=")
    left_out = set()
    if "iterations" not in {field.name for field in dataclasses.fields(options)} or options.first_iteration_uniform:
        left_out.add("first_iteration")  # nothing to stop early, or uniform coupling again
    if routing in ("uniform", "random"):
        left_out |= {routing, "shuffled", "first_iteration"}  # the arm itself; its couplings carry no image
    return ",".join(arm for arm in ARMS if arm not in left_out)


def second_change(routing: str, arm: str) -> str:
    """Why ``routing``'s verdict arm ``arm`` differs from its ``routing`` arm in more than what the arm is named
    for, or "" where it does not. The shuffled arm gives each image another image's couplings and makes the
    parents of them as Eq. 1 does (:class:`~capsexp.nn.routers.ShuffledCouplings`): for a routing that makes
    its parents otherwise (not ``coupled_parents``), that step changes too, so a difference it shows is not
    the couplings' dependence on the image alone. A ConfigError naming the routings where ``routing`` is none."""
    if arm == "shuffled" and not _options(routing).coupled_parents:
        return (
            "the routing makes its parents from its couplings otherwise than Eq. 1 does, and its shuffled arm "
            "makes them as Eq. 1 does: that arm changes this step as well as the couplings"
        )
    return ""


def _options(routing: str, named_as: str = ""):
    """The registered options of ``routing``; a ConfigError naming the routings where it is none of them."""
    routings = registered()
    if routing not in routings:
        raise ConfigError(f"{named_as}{routing}: no such routing; one of: {', '.join(routings)}")
    return routings[routing]


def cell_name(routing: str, arm: str) -> str:
    """The reference's cell of ``routing``'s verdict arm ``arm``: its own (``em-shuffled``), or the control
    every routing shares (``uniform``)."""
    return f"{routing}-{arm}" if arm in OWN_ARMS else arm


def reference_cells(routings: Sequence[str]) -> str:
    """The reference's cells as a sweep's value: each of ``routings``' own verdict arms in turn, then the
    controls once (a ConfigError naming the routings where one is none of them)."""
    routings = list(routings)
    if not routings:
        raise ConfigError("a routing reference needs at least one routing to judge")
    controls = [arm for arm in ARMS if arm not in OWN_ARMS]
    if shared := [r for r in routings if r in controls]:
        raise ConfigError(
            f"{', '.join(shared)}: a control every routing's verdict runs already, not a routing to judge"
        )
    own = [cell_name(r, arm) for r in routings for arm in verdict_arms(r).split(",") if arm in OWN_ARMS]
    return ",".join([*own, *controls])


def own_cell_nodes(routings: Sequence[str]) -> dict[str, dict]:
    """The ``+arm/routing_verdict`` options of the reference's own cells, by name: the verdict arm
    (``conf/arm/routing_verdict/<arm>.yaml``) with the routing judged chosen as ``+routing=<name>`` chooses it."""
    return {cell_name(r, arm): {"defaults": [{"/routing": r}, arm]} for r in routings for arm in OWN_ARMS}
