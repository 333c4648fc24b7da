"""The checks every routing algorithm should pass, for a routing's author to run from their own tests:

    from capsexp.testing import RoutingContract

    class TestMyRouting(RoutingContract):
        routing = MyRouting(iterations=3)

pytest collects the ``test_*`` methods of :class:`RoutingContract` for that class. Each routes random
votes through the router a fully connected capsule layer builds for ``routing``
(:class:`capsexp.nn.RoutingCapsules`: I children of ``in_dim`` dimensions, J parents of ``out_dim``),
called as every router is,

    router(votes (B, I, J, D), children (B, I, in_dim), child_activations (B, I)) -> Routed

and checks one convention of the capsule literature (docs/own_routing.md says where each comes from). A
failed check says which case failed and its likely cause. A method that legitimately differs says so by a
class attribute, with its reason in the docs; the checks it opts out of are reported skipped, with the
attribute that skips them:

- ``assignment_sums_to_one`` (True): each child's assignment over the parents sums to 1 (Sabour et al.
  2017's couplings, a softmax over parents; EM's responsibilities). False for a method whose couplings
  are bounded one by one instead (a "none of the above" parent takes a share; max-min normalisation maps
  each onto its bounds);
- ``children_interchangeable`` (True): the children's order does not matter. False for a router with
  learned parameters of its own per child (self routing's routing weights, efficient routing's priors);
- ``draws`` (False): True for a method that draws at random at every call (random couplings): the checks
  that compare two calls compare them under the same seed, and those that cannot (the children's or the
  batch's order, float32 against float64, export) are not run;
- ``gradient_through_couplings`` (True): the votes' gradient flows through the couplings too, as
  through the parents' weighted sums (Sabour et al. 2017 and Hinton et al. 2018 backpropagate through the
  routing iterations). False for a routing that holds its couplings constant in the backward pass on
  purpose (dynamic routing's ``detach_agreement=true``, EM's ``detach_responsibilities=true``, as some
  public ports do): the votes' gradient is then checked to be there but not compared with finite
  differences;
- ``float64_tolerance`` (1e-3): how far float32 may be from float64 on ill-conditioned votes.

One check reads the routing's options instead: where they declare ``coupled_parents = True``
(:class:`~capsexp.config.routing_options.Routing`), the parents must be Eq. 1's of the assignment returned.

The sizes are unequal (I=7 children of 5 dimensions, J=4 parents of 6, batch 3), so that a transposed axis
does not go unnoticed.

That the routing trains in capsexp's nets, from the command line as a user runs it:
:func:`assert_trains` (``assert_trains("em_caps_small", "<your routing>", tmp_path)``), on a few hundred
synthetic digits written as MNIST's official IDX files (:func:`write_synthetic_mnist`).

For a study's results page, :func:`assert_page_rebuilds` checks that its kept runs write it again, byte for
byte.
"""

from capsexp.testing.contract import EXTREME_VOTES, RoutingContract
from capsexp.testing.runs import assert_page_rebuilds, assert_trains, synthetic_digits, write_synthetic_mnist

__all__ = [
    "EXTREME_VOTES",
    "RoutingContract",
    "assert_page_rebuilds",
    "assert_trains",
    "synthetic_digits",
    "write_synthetic_mnist",
]
