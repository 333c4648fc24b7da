"""The command line: ``python -m capsexp [hydra overrides]`` (also installed as ``capsexp``)."""

from __future__ import annotations

import contextlib
import logging
import sys

import hydra
from omegaconf import DictConfig

from capsexp.config import hydra_setup
from capsexp.config.command_line import check_group_overrides, list_sweep_jobs
from capsexp.errors import CapsexpError, report
from capsexp.locations import CONFIG_DIR, quote_locations
from capsexp.overrides import is_override, key
from capsexp.run.resume import expand_run_folder
from capsexp.run.slurm import resume_if_restarted

log = logging.getLogger("capsexp")

# Before Hydra composes (here, and in the processes of a launcher, which import this module; those of
# Hydra's launchers also get the ConfigStore of the process that started them, nets included).
hydra_setup.register_routing()


@hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="config")
def main(cfg: DictConfig) -> float | None:
    """Run one job; return ``cfg.optimized_metric`` for Hydra sweepers (Optuna maximises it)."""
    # Imported here: `--help`, `--cfg job` and the command-line checks answer without importing torch.
    from capsexp.config.config_check import check_config
    from capsexp.run.sweep_resume import continue_job
    from capsexp.run.train import run

    try:
        check_config(cfg)
        cfg, recorded = continue_job(cfg)  # a job of a sweep run again: finished before, or a state to go on from
        return optimized_metric(cfg, recorded if recorded is not None else run(cfg))
    except CapsexpError as error:
        report(error)


def optimized_metric(cfg: DictConfig, metrics: dict[str, float]) -> float | None:
    """The value of ``cfg.optimized_metric`` for the sweeper. A run that never validated has none: a
    warning, unless a sweeper (Optuna) needs the value, which makes it an error."""
    metric_name = cfg.get("optimized_metric")
    if not metric_name or (metric_name not in metrics and not cfg.get("train")):
        return None  # nothing to optimise in a test-only run (train=false ckpt_path=...)
    if metric_name not in metrics:
        logged = ", ".join(sorted(name for name in metrics if "/" in name)) or "none"
        if any(name.startswith("val/") for name in metrics):
            problem, advice = "is not a metric this run logs", f"choose one of: {logged}"
        else:
            max_steps = cfg.trainer.get("max_steps", -1)
            below = f", below trainer.max_steps={max_steps}" if max_steps and max_steps > 0 else ""
            problem = "was not logged: the run never validated"
            advice = (
                f"validate before the run ends (trainer.val_check_interval=N, a number of steps{below}; "
                f"trainer.limit_val_batches not 0) or optimise a metric it logs (optimized_metric=test/acc)"
            )
        if _sweeper_needs_metric():
            raise CapsexpError(
                f"optimized_metric={metric_name} {problem}, and the sweeper needs its value.\nTo get one, {advice}"
            )
        log.warning(f"optimized_metric={metric_name} {problem} (only a sweeper needs it); to get it, {advice}")
        return None
    log.info(f"{metric_name} = {metrics[metric_name]:.4f}")
    return metrics[metric_name]


def _sweeper_needs_metric() -> bool:
    """True for a multirun driven by a sweeper that optimises (any but Hydra's basic sweeper and capsexp's
    resumable one, which is the basic sweeper)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return False
    hydra_cfg = HydraConfig.get()
    target = str(hydra_cfg.sweeper.get("_target_", ""))
    return hydra_cfg.mode == RunMode.MULTIRUN and not target.endswith(("BasicSweeper", ".ResumableSweeper"))


# What may set hydra.mode (MULTIRUN without -m): the search configs (conf/hparams_search/), and whatever an
# experiment or a hydra/ option chooses. Without one of these on the command line, no config sets it.
_MODE_SETTERS = ("hparams_search", "experiment", "hydra.mode", "hydra/")


@contextlib.contextmanager
def _mode_from_the_flag(arguments: list[str]):
    """Hydra composes the whole config once only to read ``hydra.mode`` before composing it again to run
    (most of a second, at every command). Where nothing on the command line can set it, the mode is the
    command line's (``-m`` or not), as Hydra takes it when no config sets one: that first composition is
    skipped. ``Hydra.get_mode`` returning None is Hydra's own "no mode configured"."""
    from hydra._internal.hydra import Hydra

    mode_set = any(is_override(a) and key(a).startswith(_MODE_SETTERS) for a in arguments)
    if mode_set or {"--config-name", "-cn"} & {*arguments}:
        yield
        return
    composing = Hydra.get_mode
    Hydra.get_mode = lambda self, config_name, overrides: None
    try:
        yield
    finally:
        Hydra.get_mode = composing


def cli() -> None:
    """The entry point: locations quoted as Hydra needs them (a run folder's name as capsexp printed it:
    :mod:`capsexp.locations`), group options checked before Hydra composes (its message lists the
    search path; ours names the option and the choices) and a run folder given as ``ckpt_path`` expanded
    (:mod:`capsexp.run.resume`; a restarted SLURM job's own folder: :mod:`capsexp.run.slurm`), then :func:`main`."""
    if sys.argv[1:] in (["--version"], ["-V"]):  # capsexp's, where Hydra's own flag would name Hydra's
        from importlib.metadata import version  # the installed distribution's, as runs record it

        print(f"capsexp {version('capsexp')}")
        return
    try:
        arguments = quote_locations(sys.argv[1:])
        check_group_overrides(arguments, CONFIG_DIR)
        if list_sweep_jobs(arguments, CONFIG_DIR):  # -m with --cfg: the sweep's jobs, none run
            return
        sys.argv[1:] = expand_run_folder(resume_if_restarted(arguments))
    except CapsexpError as error:
        report(error)
    hydra_setup.register()  # the nets' nodes: imports torch, after the checks that answer without it
    with _mode_from_the_flag(sys.argv[1:]):
        main()
    from capsexp.results.sweep_page import FAILED

    if FAILED:  # a multirun whose after-sweep steps failed: its jobs finished, the command did not
        print(f"\nerror: {', '.join(FAILED)} failed after the sweep (the jobs' results stay)", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    cli()
