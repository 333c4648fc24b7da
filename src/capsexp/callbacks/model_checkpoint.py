"""Checkpoints that lose nothing: the best by a metric, and ``last.ckpt`` always the latest state.

Lightning's ``ModelCheckpoint(save_last=True)`` writes ``last.ckpt`` only together with a top-k save,
i.e. when the monitored metric improved: a run whose accuracy stopped improving, or whose last step
is not a validation step, ends with ``last.ckpt`` far behind its final weights. Here ``last.ckpt`` is
rewritten after every validation and at the end of fit, whatever the metric did, and every file is
written beside its destination and renamed into place, so a process killed while writing leaves
the previous file whole. SIGINT (Ctrl-C) and SIGTERM (what a cluster scheduler sends before it
pre-empts a job or at its time limit) end training after the current step, with ``last.ckpt``
holding that step; a second Ctrl-C stops at once. On SLURM, so does Lightning's requeue signal
(the job then requeues itself: :mod:`capsexp.run.slurm`). Checkpoints also hold the global random state,
so a resumed run draws what the uninterrupted one would have (the data order and augmentation are
seeded on their own: :mod:`capsexp.data.resumable`).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Any

import lightning as L
import torch
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.trainer.states import TrainerFn
from typing_extensions import override

log = logging.getLogger(__name__)

# Beside the destination, on the same file system, so the rename is atomic.
PARTIAL_SUFFIX = ".partial"
# Signals that end training after the current step, its state saved.
STOPPING_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def requeue_signal(trainer: L.Trainer) -> signal.Signals | None:
    """The signal on which Lightning requeues a SLURM job (``SLURMEnvironment(auto_requeue=True)``,
    which Lightning uses when it detects SLURM); None when it does not requeue."""
    environment = trainer._accelerator_connector.cluster_environment
    if isinstance(environment, SLURMEnvironment) and environment.auto_requeue and environment.requeue_signal:
        return signal.Signals(environment.requeue_signal)
    return None


class BestAndLastCheckpoint(ModelCheckpoint):
    """:class:`~lightning.pytorch.callbacks.ModelCheckpoint` whose ``last.ckpt`` (``save_last=True``)
    holds the state after the latest validation, and after the final step once fit ends; the best
    checkpoints by ``monitor`` are kept as ModelCheckpoint keeps them. All writes are atomic.

    Args:
        stop_on_signals: during training, SIGINT and SIGTERM (and on SLURM the requeue signal) end
            training after the current step with ``last.ckpt`` written; :attr:`stopped_by` then
            names the signal.
        *args, **kwargs: those of ModelCheckpoint.
    """

    def __init__(self, *args: Any, stop_on_signals: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stop_on_signals = stop_on_signals
        self.stopped_by: signal.Signals | None = None
        self._last_saved_step: int | None = None

    def save_latest(self, trainer: L.Trainer, even_without_last: bool = False) -> None:
        """Write ``last.ckpt`` at the current step unless it already holds this step (with
        ``save_last`` false, only if ``even_without_last``: the state of an interrupted run)."""
        if not (self.save_last or even_without_last) or trainer.sanity_checking or bool(trainer.fast_dev_run):
            return
        if self._last_saved_step == trainer.global_step and self.last_model_path:
            return
        # The loggers' files first: a run killed outright (SIGKILL, a lost machine) then holds in them
        # every step its last.ckpt holds; what they hold past it, a resumed run hides and logs again.
        for logger in trainer.loggers:
            logger.save()
        candidates = self._monitor_candidates(trainer)
        if self.save_last:
            self._save_last_checkpoint(trainer, candidates)
        else:
            self.last_model_path = self.format_checkpoint_name(candidates, self.CHECKPOINT_NAME_LAST)
            self._save_checkpoint(trainer, self.last_model_path)
            self._last_saved_step = trainer.global_step

    @override
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Here, after Lightning installed its own handlers, which it restores when the trainer ends.
        # Lightning's requeue handler saves in the middle of a step, outside the run folder.
        if self.stop_on_signals and threading.current_thread() is threading.main_thread():
            requeue = requeue_signal(trainer)
            for signum in (*STOPPING_SIGNALS, *([requeue] if requeue else [])):
                signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.stopped_by is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: stop now, without saving
        self.stopped_by = signal.Signals(signum)
        log.warning(
            f"{self.stopped_by.name} received: training stops after this step, its state saved in last.ckpt "
            "(Ctrl-C again to stop at once, without saving)"
        )

    @override
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        if self._signal_to_stop_on(trainer) is not None and not trainer.should_stop:
            self.save_latest(trainer, even_without_last=True)
            trainer.should_stop = True
            # Else Lightning trains on to trainer.min_epochs / min_steps before it stops.
            trainer.fit_loop.min_epochs = trainer.fit_loop.epoch_loop.min_steps = 0

    @override
    def state_dict(self) -> dict[str, Any]:
        # The global generators too: a model that draws from them while training (dropout) goes on
        # drawing in a resumed run what the uninterrupted one drew. Data order and augmentation
        # have their own seeds (capsexp.data.resumable).
        rng = {"torch": torch.get_rng_state()}
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state_all()
        return {**super().state_dict(), "rng_states": rng}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state_dict = dict(state_dict)
        rng = state_dict.pop("rng_states", None)
        super().load_state_dict(state_dict)
        if rng is not None:
            torch.set_rng_state(rng["torch"])
            if "cuda" in rng and torch.cuda.is_available() and len(rng["cuda"]) == torch.cuda.device_count():
                torch.cuda.set_rng_state_all(rng["cuda"])

    def _signal_to_stop_on(self, trainer: L.Trainer) -> signal.Signals | None:
        """The signal training stops on after this step, None to train on. Under DDP a signal may
        reach one process only (the scheduler's SIGTERM, Ctrl-C in the launching terminal): each
        process offers the one it received to an all-reduce, so all save and stop at the same step.

        What a process offers is read once, before the all-reduce, and only the agreed value decides:
        a handler runs between any two bytecodes, and a signal taken in after the all-reduce, acted on
        at once, would have one process save (a barrier) while the other trains on into its gradient
        all-reduce, both then waiting for ever. Such a signal stops training one step later."""
        offered = self.stopped_by
        if trainer.world_size == 1 or not self.stop_on_signals:
            return offered
        received = torch.tensor([int(offered or 0)], device=trainer.strategy.root_device)
        torch.distributed.all_reduce(received, op=torch.distributed.ReduceOp.MAX)
        if not received.item():
            return None
        agreed = offered or signal.Signals(int(received.item()))
        if self.stopped_by is None:
            self.stopped_by = agreed
        return agreed

    @override
    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        fit_loop = checkpoint.get("loops", {}).get("fit_loop", {})
        if trainer.state.fn == TrainerFn.FITTING and "combined_loader" not in fit_loop.get("state_dict", {}):
            log.warning(
                "the checkpoint holds no position of the training data (it was written by an older capsexp): "
                "if it was saved in the middle of an epoch, the rest of that epoch draws its batches anew; "
                "later epochs have the order an uninterrupted run has"
            )

    @override
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        # Where ModelCheckpoint saves at the end of the training epoch (validation once an epoch), so
        # does last.ckpt: saved here first, it would make ModelCheckpoint skip the best.
        if trainer.state.fn == TrainerFn.FITTING and not self._should_save_on_train_epoch_end(trainer):
            self.save_latest(trainer)

    @override
    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_epoch_end(trainer, pl_module)
        if self._should_save_on_train_epoch_end(trainer):
            self.save_latest(trainer)

    @override
    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.save_latest(trainer)

    @override
    def _save_last_checkpoint(self, trainer: L.Trainer, monitor_candidates: dict[str, Any]) -> None:
        super()._save_last_checkpoint(trainer, monitor_candidates)
        self._last_saved_step = trainer.global_step

    @override
    def _save_checkpoint(self, trainer: L.Trainer, filepath: str) -> None:
        partial = filepath + PARTIAL_SUFFIX
        super()._save_checkpoint(trainer, partial)
        if trainer.is_global_zero:
            os.replace(partial, filepath)
        trainer.strategy.barrier("BestAndLastCheckpoint._save_checkpoint")
        self._last_checkpoint_saved = filepath
