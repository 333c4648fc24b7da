"""``ckpt_path=<run folder>``: resume a run from its latest state, with its config, into its folder.

Before Hydra composes, a run folder given as ``ckpt_path`` (``logs/<task>/runs/<time>``, or a job
folder of a multirun) becomes the run's own overrides (its ``.hydra/overrides.yaml``), then the ones
given now (the later value of a key wins, so ``trainer.max_epochs=20`` extends a run),
``ckpt_path=<folder>/checkpoints/last.ckpt`` and ``hydra.run.dir=<folder>``: training continues with
the same config, and its checkpoints, log and TensorBoard curves go on in the same place.
``ckpt_path=last`` does the same for the newest run of the task that saved a state.

With ``train=false`` the run is tested, not resumed: a run folder means its recorded best checkpoint,
and the overrides of the run that trained it (recorded in the checkpoint itself, so a lone ``.ckpt``
carries them) come before the ones given now. The test writes a folder of its own
(:func:`test_run_arguments`).
"""

from __future__ import annotations

import logging
from pathlib import Path

import yaml

from capsexp.errors import CheckpointError
from capsexp.locations import LAST_CHECKPOINT, OVERRIDES, is_relaunched, is_setting
from capsexp.overrides import hydra_value, is_override, key, value, with_value
from capsexp.records.checkpoints import peek
from capsexp.records.run_record import RunRecord

log = logging.getLogger(__name__)

MULTIRUN_FLAGS = ("-m", "--multirun")


def _is_ckpt_path(argument: str) -> bool:
    return is_override(argument) and key(argument) == "ckpt_path"


def task_folder(arguments: list[str], where: str) -> Path:
    """``<log_dir>/<task_name>``, as this command's overrides set the log folder and task;
    :class:`CheckpointError` naming ``where`` when Hydra refuses an override."""
    from omegaconf import OmegaConf

    from capsexp.config.hydra_setup import compose

    overrides = [a for a in arguments if is_override(a) and not _is_ckpt_path(a) and not key(a).startswith("hydra.")]
    try:
        cfg = compose(overrides)
        return Path(OmegaConf.select(cfg, "paths.log_dir")) / str(cfg.task_name)
    except Exception as error:  # an override Hydra refuses: its reason, not a traceback
        reason = str(error).splitlines()[0]
        raise CheckpointError(f"{where}: the log folder cannot be found ({reason})") from None


def latest_run(arguments: list[str]) -> Path:
    """The newest run folder of this command's task (``logs/<task_name>/runs/<time>``) that holds
    a ``last.ckpt``."""
    runs = task_folder(arguments, "ckpt_path=last") / "runs"
    found = sorted(path.parent.parent for path in runs.glob(f"*/{LAST_CHECKPOINT}"))
    if not found:
        raise CheckpointError(f"ckpt_path=last: no run under {runs} holds {LAST_CHECKPOINT}")
    return found[-1]  # folders are named by their start time


def _test_only(arguments: list[str]) -> bool:
    """Whether the command line says ``train=false`` (its last ``train=`` wins)."""
    given = [value(a) for a in arguments if is_override(a) and key(a) == "train"]
    return bool(given) and given[-1].lower() == "false"


def test_run_arguments(arguments: list[str], path: Path, where: str) -> list[str]:
    """``train=false ckpt_path=<checkpoint, run or job folder>``: the checkpoint (a folder's recorded best),
    after the overrides of the run that trained it (from the checkpoint's own record, else its run
    folder's ``.hydra/overrides.yaml``; its data's folders where they exist here, no other location, not
    the task's name), then the ones given now, which win. No ``hydra.run.dir``: the test writes a folder
    of its own, and the trained run's files stay as they are."""
    from capsexp.records.checkpoints import RECORDED, checkpoint_of  # torch: only for a test-only run

    file, note = checkpoint_of(path, where)
    if note and RECORDED not in note:  # a run folder whose best checkpoint is not recorded
        log.warning(f"{where}: testing {note}")
    saved = [o for o in _trained_overrides(file) if _relaunched_here(o) and key(o) not in ("train", "ckpt_path")]
    return [*_before(saved, [a for a in arguments if not _is_ckpt_path(a)]), f"ckpt_path={hydra_value(file)}"]


def _relaunched_here(override: str) -> bool:
    """A trained run's override a test of its checkpoint takes: what the run ran, and where its data is
    where that folder exists on this machine (a checkpoint from another machine reads this one's data)."""
    if is_setting(override):
        return True
    return is_relaunched(override) and Path(value(override)).expanduser().exists()


def _before(saved: list[str], now: list[str]) -> list[str]:
    """The saved overrides before the first one given now (after Hydra's flags), so that the new win; a
    saved override of a key given now left out (Hydra refuses a group added twice: ``+arm/net=...``)."""
    given = {key(argument) for argument in now if is_override(argument)}
    saved = [override for override in saved if key(override) not in given]
    first = next((i for i, argument in enumerate(now) if is_override(argument)), len(now))
    return [*now[:first], *saved, *now[first:]]


def _trained_overrides(file: Path) -> list[str]:
    """The command-line overrides of the run that saved ``file``: its record's, else its run folder's
    (``<run>/checkpoints/<file>``); none where neither holds them."""
    record = RunRecord.of(peek(file))  # an unreadable file: the run reads it again and says what is wrong
    recorded = record.overrides if record is not None else None
    if recorded is not None:
        return [str(o) for o in recorded]
    overrides_file = file.resolve().parent.parent / OVERRIDES
    if file.resolve().parent.name == LAST_CHECKPOINT.parent.name and overrides_file.is_file():
        return [str(o) for o in yaml.safe_load(overrides_file.read_text()) or []]
    return []


def expand_run_folder(arguments: list[str]) -> list[str]:
    """``arguments`` with a run folder given as ``ckpt_path`` expanded as the module says; any
    other ``arguments`` unchanged. :class:`CheckpointError` for a folder that is not a run's, or a
    run that saved no state."""
    given = [argument for argument in arguments if _is_ckpt_path(argument)]
    if not given:
        return arguments
    text = value(given[-1])
    where = f"ckpt_path={text}"
    folder = latest_run(arguments) if text == "last" else Path(text)
    if _test_only(arguments) and (folder.is_dir() or folder.is_file()):
        return test_run_arguments(arguments, folder, where)
    if not folder.is_dir():
        if folder.is_file():  # a checkpoint file: quoted, since a job folder's name holds "=" and ","
            return [a if a is not given[-1] else with_value(a, hydra_value(text)) for a in arguments]
        if text.lower() not in ("", "null", "none") and "${" not in text:  # refused before a run folder is made
            raise CheckpointError(
                f"{where}: no such file or folder (give a .ckpt file, a run folder logs/<task_name>/runs/<time>, "
                "or last for the latest run)"
            )
        return arguments
    overrides_file = folder / OVERRIDES
    if not overrides_file.is_file():
        found = sorted(folder.glob("*.ckpt"))
        hint = f"; or give one of its checkpoints: {', '.join(str(p) for p in found[:3])}" if found else ""
        raise CheckpointError(
            f"{where} is a folder but not a run's (no .hydra/overrides.yaml in it): give a run folder, "
            f"logs/<task_name>/runs/<time>, or a .ckpt file{hint}"
        )
    if any(argument in MULTIRUN_FLAGS for argument in arguments):
        raise CheckpointError(f"{where} resumes one run: drop -m (a sweep cannot continue in one run's folder)")
    last = folder / LAST_CHECKPOINT
    if not last.is_file():
        raise CheckpointError(f"{where}: the run saved no state to resume ({LAST_CHECKPOINT} is missing)")
    saved = [str(override) for override in yaml.safe_load(overrides_file.read_text()) or []]
    now = [argument for argument in arguments if not _is_ckpt_path(argument)]
    return [
        *_before([override for override in saved if not _is_ckpt_path(override)], now),
        f"ckpt_path={hydra_value(last)}",
        f"hydra.run.dir={hydra_value(folder)}",
    ]
