"""Every model recipe, composed as ``python -m capsexp model=<name> data=mnist`` composes it, pinned whole:
net, routing, objective, optimizer, schedule and margin. The expected values are written here from the
sources the configs cite (the papers, the authors' code and answers, and capsexp's results pages for
its own deviations), not read from the YAML or the constructors, so that a changed default anywhere
(a YAML file, a constructor, a routing option, a group's option) fails here by name.

MNIST's geometry: 1 channel, 28x28, 10 classes, one object per image."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from capsexp.locations import CONFIG_DIR
from tests.helpers import compose_config

CLASSIFIER = {"_target_": "capsexp.lit.Classifier", "num_classes": 10, "compile": False}
CONSTANT_LR: dict = {}  # model/lr_scheduler=none: the Classifier builds no scheduler


def adam(lr: float) -> dict:
    """torch's Adam with its own betas and no weight decay, fused (the same update in one kernel per parameter:
    tests/test_precision.py); only the rate differs between recipes."""
    return {
        "_target_": "torch.optim.Adam",
        "_partial_": True,
        "lr": lr,
        "betas": [0.9, 0.999],
        "weight_decay": 0.0,
        "fused": True,
    }


def exponential_decay(decay_steps: int, staircase: bool) -> dict:
    """lr x 0.96^(step / decay_steps), stepped every training step (tf.train.exponential_decay)."""
    scheduler = {
        "_target_": "capsexp.lit.schedulers.exponential_decay",
        "_partial_": True,
        "decay_rate": 0.96,
        "decay_steps": decay_steps,
        "staircase": staircase,
    }
    return {"scheduler": scheduler, "interval": "step", "frequency": 1}


def linear_margin(duration: float, unit: str) -> dict:
    """The spread loss's margin from 0.2 to 0.9 (Hinton et al. 2018, section 3.1), linearly."""
    return {"_target_": "capsexp.lit.margin.LinearMargin", "start": 0.2, "end": 0.9, "duration": duration, "unit": unit}


# Hinton, Sabour & Frosst 2018, Procedure 1 and the authors' OpenReview answers: 3 iterations, final
# inverse temperature 0.01, costs as written; capsexp adds a variance floor of 1e-4 (no value given).
EM_ROUTING_PAPER = {
    "_target_": "capsexp.nn.EMRouting",
    "iterations": 3,
    "final_lambda": 0.01,
    "sigma_eps": 1e-4,
    "cost_normalization": "none",
    "route_per_window": False,
    "learn_inverse_temperature": False,
    "detach_responsibilities": False,
    "e_step_temperature": 1.0,
}
# capsexp's EM routing (docs/em_training.md): 2 iterations (em_routing_ablation_quick), standardised costs
# with a learned factor on lambda, final lambda 10 (em_training_quick), the layer's floor (0.01 in the
# matrix-capsule layers, Gritzman 2019),
# each window routed on its own, the E-step at temperature 4 (em_routing_ablation_quick).
EM_ROUTING_CAPSEXP = {
    **EM_ROUTING_PAPER,
    "iterations": 2,
    "final_lambda": 10.0,
    "sigma_eps": None,
    "cost_normalization": "standardize",
    "route_per_window": True,
    "learn_inverse_temperature": True,
    "e_step_temperature": 4.0,
}


def matrix_capsnet(a: int, b: int, c: int, d: int, routing: dict, conv1_norm: bool, primary_norm: bool = False) -> dict:
    """Hinton et al. 2018, section 4: conv1 A channels, B primary capsule types, ConvCaps1 C and ConvCaps2
    D types, 3x3 kernels, 4x4 pose matrices, coordinate addition in the class capsules."""
    return {
        "_target_": "capsexp.models.MatrixCapsNet",
        "in_channels": 1,
        "num_classes": 10,
        "conv_channels": a,
        "primary_types": b,
        "conv_caps1_types": c,
        "conv_caps2_types": d,
        "kernel_size": 3,
        "pose_size": 4,
        "image_size": 28,
        "routing": routing,
        "coordinate_addition": True,
        "conv1_norm": conv1_norm,  # not in the paper; capsexp's recipe (yl-1993/Matrix-Capsules-EM-PyTorch)
        "primary_norm": primary_norm,  # the VB authors' PrimaryCapsules2d
        "weight_std": None,
        "backbone": "conv",
    }


def em_recipe(net: dict, lr: float, lr_scheduler: dict, margin: dict) -> dict:
    return {
        **CLASSIFIER,
        "lr_multipliers": None,
        "net": net,
        "objective": {"_target_": "capsexp.lit.SpreadLoss", "margin": 0.2},  # the margin's start
        "optimizer": adam(lr),
        "lr_scheduler": lr_scheduler,
        "margin": margin,
    }


# capsexp's EM training recipe: Adam at a peak of 1e-2 (3e-3 on the small net), cosine decay to 0 over
# the run, the margin ramp over the first 35% of it (em_margin_run_quick).
COSINE = {
    "scheduler": {"_target_": "capsexp.lit.schedulers.cosine_decay", "_partial_": True},
    "interval": "step",
    "frequency": 1,
}
# The authors' training recipe: Adam at 3e-3, lr x 0.96 every 20,000 steps, the margin over 10 epochs.
PAPER_SCHEDULE = {
    "lr": 0.003,
    "lr_scheduler": exponential_decay(20000, staircase=True),
    "margin": linear_margin(10, "epoch"),
}
CAPSEXP_SCHEDULE = {"lr_scheduler": COSINE, "margin": linear_margin(0.35, "run")}

RECIPES = {
    # LeCun et al. 1998's layers; capsexp trains it with Adam at 1e-3, constant.
    "lenet5": {
        **CLASSIFIER,
        "net": {"_target_": "capsexp.models.LeNet5", "in_channels": 1, "num_classes": 10, "image_size": 28},
        "objective": {"_target_": "capsexp.lit.CrossEntropy"},
        "optimizer": adam(1e-3),
        "lr_scheduler": CONSTANT_LR,
    },
    # Sabour et al. 2017, section 5: conv 256, 256, 128 (5x5, stride 1), fully connected 328, 192, dropout,
    # softmax with cross-entropy. No optimiser given: Adam at 1e-4, constant (docs/baseline_cnn.md).
    "baseline_cnn": {
        **CLASSIFIER,
        "net": {
            "_target_": "capsexp.models.BaselineCNN",
            "in_channels": 1,
            "num_classes": 10,
            "image_size": 28,
            "conv_layers": [256, 256, 128],
            "hidden_sizes": [328, 192],
            "dropout": 0.5,
        },
        "objective": {"_target_": "capsexp.lit.CrossEntropy"},
        "optimizer": adam(1e-4),
        "lr_scheduler": CONSTANT_LR,
    },
    # Sabour et al. 2017, sections 4-5: conv1 256@9x9, 32 PrimaryCaps types of 8D, 16D DigitCaps, 3 routing
    # iterations, margin loss m+ 0.9, m- 0.1, lambda 0.5, reconstruction SSE x 0.0005; the official code's
    # Adam at 1e-3 decayed by 0.96 every 2,000 steps, smoothly.
    "capsnet": {
        **CLASSIFIER,
        "net": {
            "_target_": "capsexp.models.CapsNet",
            "in_channels": 1,
            "image_size": 28,
            "num_classes": 10,
            "reconstruction": True,
            "objects": 1,
            "routing": {
                "_target_": "capsexp.nn.DynamicRouting",
                "iterations": 3,
                "detach_agreement": False,
                "none_of_the_above": False,
                "logit_scale": 1.0,
            },
            "backbone": "conv",
            "head": "capsules",
            "class_scores": "activations",
            "conv_channels": 256,
            "primary_types": 32,
            "primary_dim": 8,
            "pose_dim": 16,
            "capsule_bias": None,  # the paper's parameter count: no capsule biases
            "official_init": False,
            "shared_transform": False,
            "couplings": "own",  # its routing's own couplings for every image
        },
        "objective": {
            "_target_": "capsexp.lit.CapsuleLoss",
            "m_pos": 0.9,
            "m_neg": 0.1,
            "lambda_": 0.5,
            "recon_weight": 0.0005,
        },
        "optimizer": adam(1e-3),
        "lr_scheduler": exponential_decay(2000, staircase=False),
    },
    "capsnet_small": None,  # set below: capsnet's recipe, with conv1 64 channels and 8 PrimaryCaps types
    "capsnet_cifar10": None,  # set below
    "capsnet_official": None,  # set below
    # The large net (A=B=C=D=32) and the small one (A=64, B=8, C=D=16), each under capsexp's recipe and
    # under the paper's.
    "em_caps": em_recipe(matrix_capsnet(32, 32, 32, 32, EM_ROUTING_CAPSEXP, True), lr=0.01, **CAPSEXP_SCHEDULE),
    "em_caps_small": em_recipe(matrix_capsnet(64, 8, 16, 16, EM_ROUTING_CAPSEXP, True), lr=0.003, **CAPSEXP_SCHEDULE),
    "em_caps_paper": em_recipe(matrix_capsnet(32, 32, 32, 32, EM_ROUTING_PAPER, False), **PAPER_SCHEDULE),
    "em_caps_small_paper": em_recipe(matrix_capsnet(64, 8, 16, 16, EM_ROUTING_PAPER, False), **PAPER_SCHEDULE),
}


# Ribeiro et al. 2020, fabio-deep/Variational-Capsule-Routing: src/capsnet.py CapsuleNet with src/main.py's
# defaults (arch 64, 8, 16, 16; routing_iter 3; the priors alpha0 = kappa0 = 1, Psi0 = I, nu0 = D + 1; conv1
# and PrimaryCaps batch-normalised), src/train.py (cross-entropy on the class activations, Adam at 1e-3, no
# schedule); its VariationalBayesRouting2d normalises each window on its own.
VB_ROUTING_AUTHORS = {
    "_target_": "capsexp.nn.VBRouting",
    "iterations": 3,
    "alpha0": 1.0,
    "kappa0": 1.0,
    "psi0": 1.0,
    "nu0_offset": 1.0,
    "route_per_window": True,
}
RECIPES["vb_caps"] = {
    **CLASSIFIER,
    "net": matrix_capsnet(64, 8, 16, 16, VB_ROUTING_AUTHORS, conv1_norm=True, primary_norm=True),
    "objective": {"_target_": "capsexp.lit.CrossEntropy"},
    "optimizer": adam(1e-3),
    "lr_scheduler": CONSTANT_LR,
}
RECIPES["capsnet_small"] = {
    **RECIPES["capsnet"],
    "net": {**RECIPES["capsnet"]["net"], "conv_channels": 64, "primary_types": 8},
}
# The authors' released code (research/capsules, models/layers/layers.py and variables.py): capsule biases
# initialised to 0.1 (bias_variable) and truncated-normal weights (weight_variable).
RECIPES["capsnet_official"] = {
    **RECIPES["capsnet"],
    "net": {**RECIPES["capsnet"]["net"], "capsule_bias": 0.1, "official_init": True},
    # Its margin loss a mean over batch and classes, halved (1/20 of Eq. 4 over 10 classes), beside
    # 0.0005 x the reconstruction's sum of squares: under Adam, Eq. 4 with 0.01.
    "objective": {**RECIPES["capsnet"]["objective"], "recon_weight": 0.01},
}
# Sabour et al. 2017, section 7: 64 primary capsule types and a none-of-the-above routing category.
RECIPES["capsnet_cifar10"] = {
    **RECIPES["capsnet"],
    "net": {
        **RECIPES["capsnet"]["net"],
        "primary_types": 64,
        "routing": {**RECIPES["capsnet"]["net"]["routing"], "none_of_the_above": True},
    },
}


def test_every_model_config_has_its_recipe_pinned():
    assert sorted(RECIPES) == sorted(path.stem for path in (CONFIG_DIR / "model").glob("*.yaml"))


@pytest.mark.parametrize("model", sorted(RECIPES))
def test_the_composed_recipe_is_the_one_its_sources_give(model):
    composed = OmegaConf.to_container(compose_config([f"model={model}", "data=mnist"]).model, resolve=True)
    expected = RECIPES[model]
    for key in sorted(expected.keys() | composed.keys()):  # key by key, so a failure names the part
        assert composed.get(key, "<absent>") == expected.get(key, "<absent>"), f"model={model}: {key}"


# A routing may change the recipe of the net it routes in (conf/model/routing_recipe/<routing>.yaml): VB
# routing's transformation matrices start 9-34 times smaller than EM's (Xavier's std), which Adam at em_caps's
# 1e-2 outruns (experiments/results/vb_em_caps_lr_quick/), so em_caps routed by VB trains at 3e-3.
@pytest.mark.parametrize(
    ("model", "lr"), [("em_caps", 0.003), ("em_caps_small", 0.003), ("em_caps_paper", 0.003), ("vb_caps", 1e-3)]
)
def test_vb_routing_in_an_em_net_takes_its_own_rate(model, lr):
    config = compose_config([f"model={model}", "model/routing=vb", "data=mnist"])
    composed = OmegaConf.to_container(config.model, resolve=True)
    assert composed["net"]["routing"] == VB_ROUTING_AUTHORS
    assert composed["optimizer"] == adam(lr)
    # The rest of the net's recipe is its own: only the routing and the rate changed.
    unchanged = {key: value for key, value in RECIPES[model].items() if key not in ("net", "optimizer")}
    assert {key: composed[key] for key in unchanged} == unchanged
