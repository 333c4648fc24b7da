"""trainer.precision=auto: bf16 where the equivalence page backs the model config with its routing and bf16
is native, float32 elsewhere; the default optimizer's fused update is torch's default update."""

from __future__ import annotations

import pytest
import torch
from hydra.utils import instantiate

from capsexp.config import precision
from capsexp.config.precision import resolve
from tests.helpers import compose_config

DYNAMIC, UNIFORM = "capsexp.nn.DynamicRouting", "capsexp.nn.UniformRouting"
SMALL, LENET5, EM = ("capsnet_small", DYNAMIC), ("lenet5", None), ("em_caps_small", "capsexp.nn.EMRouting")


@pytest.fixture
def machine(monkeypatch):
    """Set what the machine has: ``machine(cpu_bf16=..., gpu=..., gpu_bf16=...)``; capsnet_small with dynamic
    routing and LeNet5 are backed by the page (whatever the page says today: these tests are of the choice,
    not of the page)."""
    monkeypatch.setattr(precision, "BF16_MODELS", {"capsnet_small": DYNAMIC, "lenet5": None})

    def set_machine(cpu_bf16: bool = False, gpu: bool = False, gpu_bf16: bool = False) -> None:
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: cpu_bf16)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: gpu_bf16)

    return set_machine


def test_auto_trains_the_backed_models_in_bf16_where_it_is_native(machine):
    machine(cpu_bf16=True)
    for model in (SMALL, LENET5):
        chosen = resolve("auto", *model, "cpu")
        assert chosen.lightning == "bf16-mixed" and model[0] in chosen.reason
    assert resolve("auto", *SMALL, "auto").lightning == "bf16-mixed"  # no GPU: the CPU decides


def test_auto_keeps_float32_for_other_models_routings_and_where_bf16_is_not_native(machine):
    machine(cpu_bf16=True, gpu=True, gpu_bf16=False)
    assert resolve("auto", *EM, "cpu").lightning == "32-true"  # not backed by the page
    assert "em_caps_small" in resolve("auto", *EM, "cpu").reason
    assert resolve("auto", "capsnet_small", UNIFORM, "cpu").lightning == "32-true"  # a routing the page did not run
    assert resolve("auto", "capsnet", DYNAMIC, "cpu").lightning == "32-true"  # another size of the same net
    assert resolve("auto", None, None, "cpu").lightning == "32-true"  # a run that cannot name its model
    assert resolve("auto", *SMALL, "gpu").lightning == "32-true"  # a GPU without bf16
    assert resolve("auto", *SMALL, "auto").lightning == "32-true"  # auto finds that GPU
    assert resolve("auto", *SMALL, "mps").lightning == "32-true"  # not measured
    machine(cpu_bf16=False)
    assert resolve("auto", *LENET5, "cpu").lightning == "32-true"  # an AVX2-only CPU
    assert "not native" in resolve("auto", *LENET5, "cpu").reason
    machine(gpu=True, gpu_bf16=True)
    assert resolve("auto", *SMALL, "auto").lightning == "bf16-mixed"


def test_a_precision_given_by_name_runs_as_given(machine):
    machine(cpu_bf16=True)
    assert resolve("32-true", *SMALL, "cpu").lightning == "32-true"
    assert resolve("bf16-mixed", *EM, "cpu").lightning == "bf16-mixed"
    assert resolve("16-mixed", *LENET5, "cpu").reason == ""


def test_the_default_optimizer_makes_torchs_default_adam_update():
    """Fused Adam (one kernel per parameter) against torch.optim.Adam's default implementation, three steps
    from the same weights with the config's lr and betas: the same weights to float32 rounding."""
    optimizer_node = compose_config(["model=capsnet_small"]).model.optimizer
    assert optimizer_node.fused is True
    nets = []
    for fused in (True, False):
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(12, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))
        if fused:
            optimizer = instantiate(optimizer_node)(net.parameters())
        else:
            optimizer = torch.optim.Adam(net.parameters(), lr=optimizer_node.lr, betas=tuple(optimizer_node.betas))
        torch.manual_seed(1)
        for _ in range(3):
            optimizer.zero_grad()
            net(torch.randn(16, 12)).pow(2).sum().backward()
            optimizer.step()
        nets.append(net)
    torch.manual_seed(0)
    start = torch.nn.Sequential(torch.nn.Linear(12, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))
    for fused, default, initial in zip(nets[0].parameters(), nets[1].parameters(), start.parameters(), strict=True):
        torch.testing.assert_close(fused, default, rtol=0, atol=1e-6)
        assert (fused - initial).abs().max() > 1e-3  # the steps moved the weights (3 x lr)
