"""A routing's verdict: the controls (another image's couplings, the first iteration, uniform and random coupling,
no capsule layer, a CNN of matched size), the measures of whether routing routes (couplings that depend on the
image, dead capsules, poses that move with the input), and ``experiment=routing_verdict +routing=<name>`` run
for a package's routing from the command line."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch

from capsexp.callbacks.equivariance import Equivariance, equivariance_error
from capsexp.callbacks.routing_diagnostics import RoutingDiagnostics
from capsexp.config.hydra_setup import compose
from capsexp.config.instantiation import build_model
from capsexp.config.verdict_arms import reference_cells, verdict_arms
from capsexp.errors import ConfigError
from capsexp.nn import DynamicRouting
from capsexp.nn.functional import image_dependence, shuffled_couplings, uniform_distance
from capsexp.nn.routers import DynamicRouter, ShuffledCouplings
from capsexp.records.events import read_scalars
from tests.helpers import TINY_EM_CAPS
from tests.test_routing_plugins import _capsexp, plugin  # noqa: F401 (a fixture)


def squash_by_hand(s: torch.Tensor) -> torch.Tensor:
    """Eq. 1 of Sabour et al. 2017: |s|^2 / (1 + |s|^2) * s / |s|."""
    norm2 = (s * s).sum(-1, keepdim=True)
    return norm2 / (1 + norm2) * s / norm2.sqrt()


def test_each_image_is_routed_by_the_couplings_found_for_the_image_before_it():
    generator = torch.Generator().manual_seed(0)
    votes = torch.randn(3, 4, 2, 5, generator=generator)
    couplings = torch.softmax(torch.randn(3, 4, 2, generator=generator), dim=-1)
    routed = shuffled_couplings(votes, couplings)
    for image, source in ((0, 2), (1, 0), (2, 1)):
        s = (couplings[source][:, :, None] * votes[image]).sum(dim=0)  # sum_i c_ij u_hat_j|i, (J, D)
        torch.testing.assert_close(routed.poses[image], squash_by_hand(s))
        torch.testing.assert_close(routed.assignment[image], couplings[source])
    torch.testing.assert_close(routed.activations, routed.poses.norm(dim=-1))


def test_the_shuffled_control_routes_by_its_routings_couplings_and_its_gradient_crosses_images():
    router = ShuffledCouplings(DynamicRouter(DynamicRouting(iterations=3)))
    votes = torch.randn(3, 6, 4, 8, generator=torch.Generator().manual_seed(1), requires_grad=True)
    children = torch.zeros(3, 6, 8)
    routed = router(votes, children, children.norm(dim=-1))
    own = DynamicRouter(DynamicRouting(iterations=3))(votes, children, children.norm(dim=-1))
    torch.testing.assert_close(routed.assignment, own.assignment.roll(1, dims=0))
    assert routed.poses[0].norm() > 0 and not torch.allclose(routed.poses, own.poses)
    (gradient,) = torch.autograd.grad(routed.poses[0].sum(), votes)
    assert gradient[2].abs().sum() > 0  # image 0's parents read image 2's couplings, made of image 2's votes
    assert router.routing.iterations == 3 and router.score_kind == "capsule length"


def test_image_dependence_and_distance_from_uniform_cell_by_cell():
    assignment = torch.tensor([[[1.0, 0.0, 0.0], [0.2, 0.3, 0.5]], [[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]]])
    # Child 0 moves between the images (TV 0.5 each way); child 1 is the same in both (static).
    torch.testing.assert_close(image_dependence(assignment), torch.tensor([[0.5, 0.0], [0.5, 0.0]]))
    uniform = [[2 / 3, 0.5 * (2 / 15 + 1 / 30 + 1 / 6)], [1 / 3, 0.5 * (2 / 15 + 1 / 30 + 1 / 6)]]
    torch.testing.assert_close(uniform_distance(assignment), torch.tensor(uniform))


def test_dead_capsules_are_those_never_active_on_any_test_batch(monkeypatch):
    diagnostics = RoutingDiagnostics()
    diagnostics._test_sums, diagnostics._test_peaks = {"digits": {}}, {"digits": {}}
    first = torch.tensor([[0.5, 0.0, 0.005, 0.0], [0.0, 0.0, 0.0, 0.0]])
    second = torch.tensor([[0.0, 0.2, 0.0, 0.0], [0.0, 0.0, 0.01, 0.0]])  # child 2 never above 0.01
    parents = torch.tensor([[0.3, 0.0], [0.2, 0.0]])
    couplings = torch.full((2, 4, 2), 0.5)
    for children in (first, second):
        diagnostics._measure("digits", children, parents, couplings, None, None)
    written = {}
    writer = type("Writer", (), {"add_scalar": lambda self, tag, value, step: written.__setitem__(tag, value)})()
    monkeypatch.setattr("capsexp.callbacks.routing_diagnostics.tensorboard_writer", lambda trainer: writer)
    diagnostics.on_test_epoch_end(type("Trainer", (), {"global_step": 7})(), None)
    assert written["routing/digits/test_dead_children"] == 0.5  # children 2 and 3 of 4
    assert written["routing/digits/test_dead_parents"] == 0.5
    assert (
        written["routing/digits/test_image_dependence"] == 0.0
        and written["routing/digits/test_uniform_distance"] == 0.0
    )


def test_the_equivariance_error_is_zero_for_poses_moved_by_one_map_per_class_and_not_for_one_map_for_all():
    generator = torch.Generator().manual_seed(2)
    poses = torch.randn(400, 4, generator=generator)
    classes = torch.arange(400) % 2
    maps = torch.randn(2, 4, 4, generator=generator)
    moved = torch.einsum("ni,nij->nj", poses, maps[classes])
    assert equivariance_error(poses, moved, classes) < 1e-3
    # One map for both classes: a map per class fits it too.
    assert equivariance_error(poses, torch.einsum("ni,ij->nj", poses, maps[0]), classes) < 1e-3
    unrelated = torch.randn(400, 4, generator=generator)
    assert equivariance_error(poses, unrelated, classes) > 0.5
    # Class 1 moved by no map: the error pools the classes' residuals over their changes, each class fitted
    # on its even-numbered images and judged on its odd-numbered ones.
    mixed = moved.clone()
    mixed[classes == 1] = unrelated[classes == 1]
    per_class, changes = [], []
    for k in (0, 1):
        of_k = classes == k
        per_class.append(equivariance_error(poses[of_k], mixed[of_k], torch.zeros(int(of_k.sum()))))
        changes.append((mixed[of_k][1::2] - poses[of_k][1::2]).pow(2).sum().item())
    assert per_class[0] < 1e-3 and per_class[1] > 0.5
    pooled = (per_class[0] * changes[0] + per_class[1] * changes[1]) / sum(changes)
    assert equivariance_error(poses, mixed, classes) == pytest.approx(pooled, rel=1e-4)


def test_the_equivariance_transforms_shift_right_and_rotate_filling_with_the_background():
    images = torch.zeros(1, 1, 9, 9)
    images[0, 0, 4, 2] = 1.0
    moved = Equivariance(shift=2, degrees=90).transforms(images)
    assert moved["shift_2px"][0, 0, 4, 4] == 1.0 and moved["shift_2px"].sum() == 1.0
    rotated = moved["rotation_90deg"][0, 0]
    assert rotated[6, 4] == pytest.approx(1.0, abs=1e-5)  # counter-clockwise: left of centre goes below it


@pytest.mark.parametrize(
    "routing,arms",
    [
        ("dynamic", "routing,shuffled,uniform,random,plain_head,cnn"),
        ("em", "routing,shuffled,first_iteration,uniform,random,plain_head,cnn"),
        ("sinkhorn", "routing,shuffled,uniform,random,plain_head,cnn"),  # its first iteration: uniform coupling
        ("attention", "routing,shuffled,first_iteration,uniform,random,plain_head,cnn"),
        ("self", "routing,shuffled,uniform,random,plain_head,cnn"),  # no iterations
        ("uniform", "routing,random,plain_head,cnn"),
        ("random", "routing,uniform,plain_head,cnn"),
    ],
)
def test_a_verdicts_arms_leave_out_what_repeats_another_arm_for_its_routing(routing, arms):
    assert verdict_arms(routing) == arms


def test_a_verdict_of_no_routing_says_which_there_are():
    with pytest.raises(ConfigError, match=r"\+routing=sinkorn: no such routing; one of: .*sinkhorn"):
        verdict_arms("sinkorn")


def test_the_references_cells_are_each_routings_own_arms_then_the_controls_once():
    assert reference_cells(["em", "dynamic"]) == (
        "em-routing,em-shuffled,em-first_iteration,dynamic-routing,dynamic-shuffled,uniform,random,plain_head,cnn"
    )
    with pytest.raises(ConfigError, match=r"\+routing=sinkorn: no such routing"):
        reference_cells(["em", "sinkorn"])
    with pytest.raises(ConfigError, match="uniform: a control every routing's verdict runs already"):
        reference_cells(["uniform", "em"])


@pytest.mark.parametrize(
    "cell,target,couplings,iterations",
    [
        ("vb-shuffled", "capsexp.nn.VBRouting", "shuffled", 3),
        ("em_paper-first_iteration", "capsexp.nn.EMRouting", "own", 1),
        ("sinkhorn-routing", "capsexp.nn.SinkhornRouting", "own", None),
        ("random", "capsexp.nn.RandomRouting", "own", None),
    ],
)
def test_a_reference_cell_composes_its_verdict_arm_with_its_routing(cell, target, couplings, iterations):
    config = compose(["experiment=routing_reference", "study=quick", f"+arm/routing_verdict={cell}"])
    assert config.model.net.routing._target_ == target and config.model.net.couplings == couplings
    if iterations is not None:
        assert config.model.net.routing.iterations == iterations
    # The routing's own defaults otherwise: as model/routing=<name> gives them.
    name = cell.partition("-")[0]
    own = compose(["model=capsnet", f"model/routing={name}"]).model.net.routing
    assert {k: v for k, v in config.model.net.routing.items() if k != "iterations"} == {
        k: v for k, v in own.items() if k != "iterations"
    }
    assert config.trainer.max_steps == -1 and config.trainer.max_epochs == 1  # the quick budget, one epoch


@pytest.mark.parametrize("budget", ["quick", "full"])
def test_the_cnn_is_matched_to_the_capsule_nets_classifier_within_one_per_cent(budget):
    def parameters(arm: str, without_decoder: bool) -> int:
        config = compose(
            ["experiment=routing_verdict", "+routing=dynamic", f"+arm/routing_verdict={arm}", f"study={budget}"]
        )
        net = build_model("model", config.model).net
        return sum(p.numel() for name, p in net.named_parameters() if not (without_decoder and "decoder" in name))

    capsules, cnn = parameters("routing", True), parameters("cnn", False)
    assert abs(cnn - capsules) / capsules < 0.01, (capsules, cnn)
    assert abs(parameters("plain_head", True) - capsules) / capsules < 0.01


TINY_VERDICT = [
    "trainer.max_steps=2",
    "trainer.val_check_interval=2",
    "trainer.limit_val_batches=2",
    "trainer.limit_test_batches=2",
    "data.batch_size=20",
    "data.val_size=60",
    "data.verify_checksums=false",
    "callbacks.progress_bar=null",
    "callbacks.equivariance.images=40",
]


def tiny_sweep(environment_of_plugin: dict, tmp_path: Path, *arguments: str) -> Path:
    """The folder of a study's sweep at the quick budget cut to :data:`TINY_VERDICT`, run from the command
    line with the plugin's routing installed; the sweep must succeed."""
    sweep = tmp_path / "sweep"
    data = os.environ.get("CAPSEXP_DATA_DIR") or str(Path(__file__).parents[2] / "shared" / "data")
    environment = {**environment_of_plugin, "CAPSEXP_DATA_DIR": data, "OMP_NUM_THREADS": "1"}
    ran = _capsexp(environment, "-m", *arguments, "study=quick", *TINY_VERDICT, f"hydra.sweep.dir={sweep}")
    assert ran.returncode == 0, ran.stderr[-3000:]
    return sweep


@pytest.mark.slow
def test_the_verdict_of_a_packages_routing_runs_from_the_command_line_on_a_tiny_budget(plugin, tmp_path):  # noqa: F811
    sweep = tiny_sweep(plugin, tmp_path, "experiment=routing_verdict", "+routing=mean_agreement", "seed=1")
    jobs = sorted(path for path in sweep.iterdir() if path.is_dir() and (path / ".hydra").is_dir())
    assert len(jobs) == 6, jobs  # the routing, shuffled, uniform, random, the plain head, the CNN (no iterations)
    measured = {}
    for job in jobs:
        overrides = (job / ".hydra" / "overrides.yaml").read_text()
        arm = next(line.split("=")[-1] for line in overrides.splitlines() if "arm/routing_verdict" in line)
        measured[arm] = {tag: values[-1].value for tag, values in read_scalars(job).items()}
    for arm in ("routing", "shuffled", "uniform", "random", "plain_head"):
        assert math.isfinite(measured[arm]["test/acc_affine_mnist"]), arm
        assert "equivariance/shift_2px/error" in measured[arm], arm
    for arm in ("routing", "shuffled"):
        assert "routing/digits/test_image_dependence" in measured[arm]
    assert measured["uniform"]["routing/digits/test_image_dependence"] == 0.0  # 1/J for every image
    assert "equivariance/shift_2px/error" not in measured["cnn"] and "test/acc" in measured["cnn"]


@pytest.mark.parametrize("routing", ["em", "dynamic"])  # EM's own matrix router; a CapsNet router, window by window
def test_every_routing_layer_of_a_matrix_capsule_net_reports_its_dead_capsules_and_the_class_layer_its_dependence(
    routing, monkeypatch
):
    config = compose(["model=em_caps_small", f"model/routing={routing}", *TINY_EM_CAPS])
    module = build_model("model", config.model).eval()
    written = {}
    writer = type("Writer", (), {"add_scalar": lambda self, tag, value, step: written.__setitem__(tag, value)})()
    monkeypatch.setattr("capsexp.callbacks.routing_diagnostics.tensorboard_writer", lambda trainer: writer)
    trainer = type("Trainer", (), {"global_step": 3})()
    diagnostics = RoutingDiagnostics()
    diagnostics.on_test_epoch_start(trainer, module)
    for index in range(2):  # two batches of the plain test set, then one of another set (left out)
        diagnostics.on_test_batch_start(trainer, module, None, index, 0)
        with torch.no_grad():
            module.net(torch.rand(3, 1, 28, 28, generator=torch.Generator().manual_seed(index)))
    diagnostics.on_test_batch_start(trainer, module, None, 0, 1)
    with torch.no_grad():
        module.net(torch.zeros(3, 1, 28, 28))
    diagnostics.on_test_epoch_end(trainer, module)
    for layer in ("conv_caps1", "conv_caps2", "class_caps"):
        for side in ("children", "parents"):
            assert 0.0 <= written[f"routing/{layer}/test_dead_{side}"] <= 1.0, (layer, side)
    assert 0.0 < written["routing/class_caps/test_image_dependence"] <= 1.0


@pytest.mark.parametrize(
    "arguments,said",
    [
        (["-m", "experiment=routing_verdict", "study=quick"], "judges one routing: add +routing=<name>, one of: "),
        (["-m", "experiment=routing_verdict", "+routing=em,vb"], "(given em,vb: run the study once for each)"),
        (["experiment=routing_verdict", "+routing=sinkorn"], "(did you mean routing=sinkhorn?)"),
    ],
)
def test_a_verdict_without_one_routing_is_answered_before_hydra_composes(arguments, said):
    from capsexp.config.command_line import check_group_overrides
    from capsexp.locations import CONFIG_DIR

    with pytest.raises(ConfigError) as raised:
        check_group_overrides([a for a in arguments if a != "-m"], CONFIG_DIR)
    assert said in str(raised.value) and "sinkhorn" in str(raised.value)


@pytest.mark.slow
def test_the_reference_of_two_routings_runs_their_cells_and_the_controls_once_and_judges_each(plugin, tmp_path):  # noqa: F811
    sweep = tiny_sweep(
        plugin, tmp_path, "experiment=routing_reference", "page.verdicts.routings=[mean_agreement,em]", "seed=1,2"
    )
    cells = sorted(
        path.name.removeprefix("seed=1,+arm.routing_verdict=") for path in sweep.glob("seed=1,*") if path.is_dir()
    )
    assert cells == sorted(
        ["mean_agreement-routing", "mean_agreement-shuffled", "em-routing", "em-shuffled", "em-first_iteration",
         "uniform", "random", "plain_head", "cnn"]
    )  # fmt: skip
    assert len(list(sweep.glob("seed=2,*"))) == 9
    page = (sweep / "README.md").read_text()
    # The hypotheses are those of the routings the sweep judged (its page.verdicts.routings), untested at 2 seeds.
    asked = [line.split(" | ")[0].removeprefix("| ") for line in page.splitlines() if ": it " in line]
    assert asked == [f"{r}: it {q}, on the {s}" for r in ("mean_agreement", "em") for q in ("routes", "helps")
                     for s in ("test digits", "affine digits")]  # fmt: skip
    table = page[page.index("## Declared hypotheses") :]
    rows = [line for line in table.split("\n## ")[0].splitlines() if line.startswith("| ") and ": it " in line]
    said = [line.rsplit(" | ", 1)[-1].removesuffix(" |") for line in rows]
    for asked_of, verdict in zip(asked, said, strict=True):
        if asked_of.startswith("em: it routes"):  # EM's parents are not Eq. 1's, as its shuffled arm's are
            assert verdict.startswith("not judged: the routing makes its parents from its couplings otherwise"), verdict
        else:  # a tiny run of 2 seeds, which may not learn
            assert verdict == "too few seeds to test" or " did not learn (val/acc_best " in verdict, verdict
