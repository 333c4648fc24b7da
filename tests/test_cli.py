"""End to end through ``python -m capsexp``: outputs, TensorBoard scalars, resuming."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from capsexp.records.events import load_events
from tests.helpers import TINY_RUN, hparams_summary, run_cli_in_process, scalars


def test_train_test_and_resume(mnist_dir, tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    # 240 training images / batch 20 = 12 steps per epoch.
    result = run_cli_in_process(
        *TINY_RUN, f"paths.data_dir={mnist_dir}", "trainer.max_epochs=2", f"hydra.run.dir={first}"
    )
    assert result.returncode == 0, result.stderr[-3000:]

    assert (first / ".hydra" / "config.yaml").exists() and (first / ".hydra" / "overrides.yaml").exists()
    checkpoints = {p.name for p in (first / "checkpoints").glob("*.ckpt")}
    assert "last.ckpt" in checkpoints and len(checkpoints) == 2, checkpoints  # last + best by val/acc
    logged = scalars(first)
    for tag in ["train/loss_step", "train/acc", "val/loss", "val/acc", "val/acc_best", "test/acc", "lr-Adam"]:
        assert tag in logged, (tag, sorted(logged))
    assert [s.step for s in logged["val/acc"]] == [11, 23]
    # 24 steps of LeNet5 on the synthetic digits reach about 70% (chance: 10%).
    assert logged["test/acc"][-1].value > 0.4
    assert "val/acc_best = " in result.stderr + result.stdout
    # The run's folder, said when it starts and when it ends (with the command that opens it).
    said = [line for line in (result.stderr + result.stdout).splitlines() if "Run folder: " in line]
    assert [line.split("Run folder: ")[1] for line in said] == [
        str(first),
        f"{first} (TensorBoard: python -m capsexp.tensorboard {first})",
    ]

    last = first / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["global_step"] == 24
    result = run_cli_in_process(
        *TINY_RUN, f"paths.data_dir={mnist_dir}", "trainer.max_epochs=3", f"ckpt_path={last}", f"hydra.run.dir={second}"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert torch.load(second / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 36
    train_steps = [s.step for s in scalars(second)["train/loss_step"]]
    assert min(train_steps) >= 24, "the resumed run must continue from step 24, not restart at 0"


def test_debug_fast_is_a_short_run_that_leaves_a_result_compare_reads(mnist_dir, tmp_path):
    """A few batches of each loop, then what a real run leaves: event files with a validation and a
    test, a checkpoint, and a page from capsexp.compare."""
    from capsexp.results.compare import compare

    run = tmp_path / "run"
    result = run_cli_in_process(*TINY_RUN, f"paths.data_dir={mnist_dir}", "debug=fast", f"hydra.run.dir={run}")
    assert result.returncode == 0, result.stderr[-3000:]
    logged = scalars(run)
    assert [s.step for s in logged["train/loss_step"]] == [0, 1, 2, 3, 4]  # five steps
    assert len(logged["val/acc"]) == 1 and "test/acc" in logged
    assert (run / "checkpoints" / "last.ckpt").is_file()
    assert "never validated" not in result.stderr + result.stdout
    page = (compare(run).output / "README.md").read_text()
    assert "debug=fast | 1 |" in page


def test_the_baseline_cnn_trains_from_the_command_line_and_stops_at_the_threshold(mnist_dir, tmp_path):
    widths = ["model.net.conv_layers=[4,4]", "model.net.hidden_sizes=[16]"]  # the paper's is 35.4M parameters
    result = run_cli_in_process(
        *TINY_RUN,
        "model=baseline_cnn",
        *widths,
        "model.optimizer.lr=0.001",  # a small net's rate: the default suits the paper's widths
        f"paths.data_dir={mnist_dir}",
        "trainer.max_epochs=5",
        "trainer.val_check_interval=2",  # 6 validations an epoch of 12 steps
        "callbacks=[default,stop_at_accuracy]",
        "callbacks.stop_at_accuracy.stopping_threshold=0.15",  # chance is 0.1
        f"hydra.run.dir={tmp_path}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    logged = scalars(tmp_path)
    accuracies = [s.value for s in logged["val/acc"]]
    assert all(a <= 0.15 for a in accuracies[:-1]) and accuracies[-1] > 0.15, accuracies
    # Stopped at the first validation above the threshold, even within the first epoch.
    assert max(s.step for s in logged["train/loss_step"]) < logged["val/acc"][-1].step + 2
    assert "test/acc" in logged


@pytest.mark.slow  # one real MNIST epoch (about 30 s): make test-all
def test_lenet5_reaches_97_5_percent_on_real_mnist_in_one_epoch(real_mnist_dir, tmp_path):
    """The README's first command; about 20 s on 2 CPU cores."""
    result = run_cli_in_process(
        "model=lenet5",
        "data=mnist",
        "trainer.max_epochs=1",
        f"paths.data_dir={real_mnist_dir}",
        "trainer.accelerator=cpu",
        "callbacks.progress_bar=null",
        f"hydra.run.dir={tmp_path}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    test_acc = scalars(tmp_path)["test/acc"][-1].value
    assert test_acc >= 0.975, test_acc


def test_capsnet_on_rotated_mnist_logs_each_angle_and_the_figures(mnist_dir, tmp_path):
    result = run_cli_in_process(
        *TINY_RUN,
        f"paths.data_dir={mnist_dir}",
        "model=capsnet",
        "data=rotated_mnist",
        "data.test_rotations=[0,45]",
        "trainer.max_epochs=1",
        "model.net.conv_channels=32",
        "model.net.primary_types=8",
        f"hydra.run.dir={tmp_path}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    logged = scalars(tmp_path)
    for tag in [
        "train/margin_loss_step",
        "train/recon_loss_step",
        "test/acc",
        "test/acc_rot0",
        "test/acc_rot45",
        "lr-Adam",
    ]:
        assert tag in logged, (tag, sorted(logged))
    events = load_events(tmp_path, images=0)
    images = events.Tags()["images"]
    assert "val/reconstructions" in images and "test/pose_perturbation_0" in images
    # The perturbation figure: 16 rows (pose dims) x 11 columns (steps) of 28x28 digits shown 3 times
    # larger (84 px), 3 px apart.
    figure = events.Images("test/pose_perturbation_0")[-1]
    assert (figure.height, figure.width) == (16 * 87 + 3, 11 * 87 + 3)
    # The reconstructions: 8 inputs above their 8 reconstructions, 84 px each, 6 px apart; each input
    # pixel a 3 x 3 block (nearest neighbour, no blur).
    grid = events.Images("val/reconstructions")[-1]
    assert (grid.height, grid.width) == (2 * 90 + 6, 8 * 90 + 6)
    first = np.asarray(Image.open(io.BytesIO(grid.encoded_image_string)).convert("L"))[6:90, 6:90].astype(int)
    assert first.max() > first.min() and (first == np.repeat(np.repeat(first[::3, ::3], 3, 0), 3, 1)).all()
    # What routing did, at the validation: a labelled heat map per class (two rows of five, a colour bar),
    # and the logit and coupling changes of the 3 iterations.
    couplings = events.Images("routing/digits/couplings")[-1]
    assert couplings.width >= 1000 and couplings.height >= 350
    assert all(logged[f"routing/digits/logit_change_iter{r}"][-1].value > 0 for r in (1, 2, 3))
    assert all(0 <= logged[f"routing/digits/coupling_change_iter{r}"][-1].value < 1 for r in (2, 3))
    assert all(logged[f"routing/digits/update_change_iter{r}"][-1].value >= 0 for r in (2, 3))

    # TensorBoard's HParams tab: the choices (model, data, seed, the parameter count, then the command
    # line's overrides by key; paths.data_dir and the callbacks' settings left out); every test set, the presence gap
    # and images/s among its metrics. The whole config is in hparams.yaml beside the event files.
    hparams = hparams_summary(tmp_path)
    assert list(hparams["hparams"]) == [
        "model",
        "data",
        "model/routing",
        "seed",
        "model/params",
        *sorted(
            {
                *(o.split("=")[0].replace(".", "/") for o in TINY_RUN if not o.startswith("callbacks.")),
                "data/test_rotations",
                "trainer/max_epochs",
                "model/net/conv_channels",
                "model/net/primary_types",
            }
        ),
    ]
    assert hparams["hparams"]["model"] == "capsnet" and hparams["hparams"]["data"] == "rotated_mnist"
    assert hparams["hparams"]["model/routing"] == "dynamic"  # chosen by the model config, shown all the same
    assert hparams["hparams"]["data/test_rotations"] == "[0, 45]" and hparams["hparams"]["seed"] == 1234
    assert hparams["hparams"]["model/params"] > 0
    assert (tmp_path / "hparams.yaml").is_file() and "routing:" in (tmp_path / "hparams.yaml").read_text()
    assert hparams["metrics"][:2] == ["val/acc_best", "test/acc"]
    assert {"val/presence_gap", "perf/train_images_per_s"} <= set(hparams["metrics"])
    # Locations are not hyperparameters: no machine's paths in a run's event files.
    assert not [k for k in hparams["hparams"] if k.endswith(("data_dir", "default_root_dir", "dirpath"))]
    assert not [v for v in hparams["hparams"].values() if str(tmp_path) in str(v)]
    assert {"val/acc_best", "test/acc", "test/acc_rot0", "test/acc_rot45"} <= set(hparams["metrics"])
    assert set(hparams["metrics"]) <= set(logged), "every HParams column must have its scalar"


@pytest.mark.parametrize(
    ("problem", "status", "message"),
    [
        ([], 1, "MNIST"),  # no dataset in the data dir
        (["data.val_size=999999999"], 2, "data.val_size=999999999: must be less than the 300 training images"),
    ],
    ids=["missing data", "validation set larger than the data"],
)
def test_a_run_that_fails_before_its_first_step_leaves_no_tensorboard_run(
    mnist_dir, tmp_path, problem, status, message
):
    data_dir = mnist_dir if problem else tmp_path / "empty"
    run = tmp_path / "run"
    result = run_cli_in_process(
        *TINY_RUN, f"paths.data_dir={data_dir}", "data.download=false", *problem, f"hydra.run.dir={run}"
    )
    output = result.stdout + result.stderr
    assert result.returncode == status, output[-3000:]
    assert message in output and "Traceback" not in output
    assert f"Run folder: {run}" in output
    assert "failed before its first step: its logger files were removed" in output
    assert (run / ".hydra" / "config.yaml").is_file()  # the record of what was asked
    assert not list(run.rglob("events.out.tfevents.*")) and not (run / "hparams.yaml").exists()


def test_a_progress_bar_or_model_summary_set_to_null_is_not_replaced_by_lightnings(mnist_dir, tmp_path, monkeypatch):
    """TINY_RUN drops both: Lightning's default bar (tqdm) and summary do not start in their place; a
    summary left in does."""
    from lightning.pytorch.callbacks import ModelSummary, TQDMProgressBar

    started = []
    monkeypatch.setattr(ModelSummary, "on_fit_start", lambda self, *a: started.append(type(self).__name__))
    monkeypatch.setattr(TQDMProgressBar, "on_train_start", lambda self, *a: started.append(type(self).__name__))
    common = [*TINY_RUN, f"paths.data_dir={mnist_dir}", "trainer.max_steps=1", "trainer.limit_val_batches=1"]
    quiet = run_cli_in_process(*common, "trainer.limit_test_batches=1", f"hydra.run.dir={tmp_path / 'quiet'}")
    assert quiet.returncode == 0, quiet.stderr[-3000:]
    assert started == []
    summary = run_cli_in_process(
        *common,
        "trainer.limit_test_batches=1",
        "+callbacks.model_summary._target_=lightning.pytorch.callbacks.ModelSummary",
        f"hydra.run.dir={tmp_path / 'summary'}",
    )
    assert summary.returncode == 0, summary.stderr[-3000:]
    assert started == ["ModelSummary"]


def test_the_mode_is_read_from_the_flag_only_where_no_config_can_set_it():
    """Hydra composes a whole config just to read hydra.mode; capsexp skips that where nothing on the
    command line can set it. Hydra's method keeps the signature replaced, and is put back after."""
    import inspect

    from hydra._internal.hydra import Hydra

    from capsexp.__main__ import _mode_from_the_flag

    original = Hydra.get_mode
    assert list(inspect.signature(original).parameters) == ["self", "config_name", "overrides"]
    with _mode_from_the_flag(["model=lenet5", "seed=1,2"]):
        assert Hydra.get_mode(None, "config", ["model=lenet5"]) is None
    assert Hydra.get_mode is original
    for setter in (
        "hparams_search=optuna",
        "experiment=routing_comparison",
        "+hydra.mode=MULTIRUN",
        "hydra/sweeper=optuna",
    ):
        with _mode_from_the_flag(["model=lenet5", setter]):
            assert Hydra.get_mode is original, setter
