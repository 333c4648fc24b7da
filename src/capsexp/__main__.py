"""The command line: ``python -m capsexp [hydra overrides]`` (also installed as ``capsexp``)."""

from __future__ import annotations

import logging
import os
import sys

# Transparent huge pages for PyTorch's large CPU allocations (a documented c10 switch, read once, at
# the first allocation, hence before torch is imported). Fresh 4 KiB-page buffers cost a page fault
# per 4 KiB: for the 94 MB vote tensors of CapsNet that was 30 ms each, a third of the capsule layers'
# time on a 2-core CPU. THP_MEM_ALLOC_ENABLE=0 in the environment turns it off.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from capsexp import CONFIG_DIR  # noqa: E402
from capsexp.errors import CapsexpError  # noqa: E402

log = logging.getLogger("capsexp")


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="config")
def main(cfg: DictConfig) -> float | None:
    """Run one job; return ``cfg.optimized_metric`` for Hydra sweepers (Optuna maximises it)."""
    # Imported here so that `--help`, `--cfg job` and config errors answer without loading torch.
    from capsexp.train import run

    try:
        return optimized_metric(cfg, run(cfg))
    except CapsexpError as error:
        # A message that says what to do; a traceback would bury it.
        print(f"\nerror: {error}", file=sys.stderr)
        sys.exit(1)


def optimized_metric(cfg: DictConfig, metrics: dict[str, float]) -> float | None:
    metric_name = cfg.get("optimized_metric")
    if not metric_name or (metric_name not in metrics and not cfg.get("train")):
        return None  # nothing to optimise in a test-only run (train=false ckpt_path=...)
    if metric_name not in metrics:
        raise CapsexpError(
            f"optimized_metric={metric_name!r} was not logged; logged metrics: {', '.join(sorted(metrics))}"
        )
    log.info(f"{metric_name} = {metrics[metric_name]:.4f}")
    return metrics[metric_name]


if __name__ == "__main__":
    main()
