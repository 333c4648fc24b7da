"""The machine a run ran on, written beside its config (``machine.yaml``), so that a results page
rebuilt elsewhere from the committed runs still names the machine that produced its figures."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import yaml

MACHINE_FILE = "machine.yaml"


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux, else what ``platform`` knows)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def describe() -> dict[str, object]:
    """CPU, its vector instructions as torch uses them (AVX2, AVX512: they decide, e.g., whether bf16 is
    fast), cores, GPUs (name per device) and torch version of this process's machine."""
    import torch

    gpus = (
        [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    )
    return {
        "cpu": cpu_name(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cores": os.cpu_count(),
        "gpus": gpus,
        "torch": torch.__version__.split("+")[0],
    }


def describe_text(machine: dict[str, object]) -> str:
    """One line for a page: ``AMD EPYC 7B13 (AVX2), 2 cores, CPU only, torch 2.14.1``."""
    gpus = machine.get("gpus") or []
    devices = f"{len(gpus)} x {gpus[0]}" if gpus else "CPU only"
    capability = f" ({machine['cpu_capability']})" if machine.get("cpu_capability") else ""
    return f"{machine['cpu']}{capability}, {machine['cores']} cores, {devices}, torch {machine['torch']}"


def write_machine(run_folder: Path, precision: str | None = None) -> None:
    """The machine, and the precision the run trains in there (``trainer.precision=auto`` decides it per
    machine and model)."""
    found = describe() | ({"precision": precision} if precision else {})
    (run_folder / MACHINE_FILE).write_text(yaml.safe_dump(found, sort_keys=False))


def read_machine(run_folder: Path) -> dict[str, object] | None:
    """What :func:`write_machine` recorded in ``run_folder``; None for a run without the record."""
    path = run_folder / MACHINE_FILE
    return yaml.safe_load(path.read_text()) if path.exists() else None
