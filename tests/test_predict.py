"""Predicting with a trained model: ``capsexp.load`` and ``python -m capsexp.predict`` bring an image
file to the net exactly as the DataModule brought its evaluation images, predict what the run's own
test step predicted, say what they did, explain an image with what the model computed, and refuse bad
inputs in a few lines."""

from __future__ import annotations

import csv
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import capsexp
from capsexp.config.instantiation import build_model, instantiate
from capsexp.config.precision import BF16_MODELS
from capsexp.errors import CheckpointError, ImageError
from capsexp.figures.couplings import position_maps
from capsexp.locations import RUN_RECORD
from capsexp.records.revision import REVISION_FILE, read_revision
from capsexp.use.explain import explain_figure
from capsexp.use.inference import TrainedModel
from tests.helpers import TINY_RUN, FakeTrainer, compose_config, run_cli_in_process, write_mnist, write_png

TINY_CAPSNET = ["model=capsnet_small", "model.net.conv_channels=16", "model.net.primary_types=4"]


def predict_cli(*overrides: str):
    from capsexp.predict import cli as main

    return run_cli_in_process(*overrides, entry=main)


def read_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def digit_folder(images: torch.Tensor, labels: torch.Tensor, folder: Path) -> Path:
    """Grey PNGs in one sub-folder per digit, as a user would lay out labelled images."""
    for index, (image, label) in enumerate(zip(images, labels.tolist(), strict=True)):
        (folder / str(label)).mkdir(parents=True, exist_ok=True)
        Image.fromarray(image[0].numpy()).save(folder / str(label) / f"{index:04d}.png")
    return folder


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> Path:
    """A tiny CapsNet trained for two steps on synthetic MNIST, tested: its run folder."""
    root = tmp_path_factory.mktemp("predict")
    data_dir = write_mnist(root / "data")
    run_dir = root / "run"
    result = run_cli_in_process(
        *TINY_RUN,
        *TINY_CAPSNET,
        f"paths.data_dir={data_dir}",
        "trainer.max_steps=2",
        "trainer.val_check_interval=2",
        f"hydra.run.dir={run_dir}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir


def untrained(overrides: list[str], tmp_path: Path) -> TrainedModel:
    """The TrainedModel of a composed config (weights untrained: preprocessing is what is tested)."""
    cfg = compose_config(overrides, tmp_path)
    return TrainedModel(
        build_model("model", cfg.model), instantiate("data", cfg.data, _convert_="all"), cfg, tmp_path, None
    )


def evaluation_batch(datamodule, count: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The DataModule's first ``count`` test images as stored, and as its test loop gives them to the net."""
    datamodule.trainer = FakeTrainer(testing=True)
    datamodule.prepare_data()
    datamodule.setup("test")
    stored = datamodule.data_test.images[:count]
    targets = datamodule.data_test.targets[:count]
    net_input = datamodule.on_after_batch_transfer((stored.clone(), targets), 0)[0]
    datamodule.trainer = None
    return stored, targets, net_input


@pytest.mark.parametrize(
    "overrides",
    [
        ["data=mnist"],
        ["data=translated_mnist"],
        ["data=mnist", "data.normalize=true"],
        ["data=cifar10", "model=lenet5"],
    ],
    ids=["mnist", "translated_mnist_40x40", "mnist_normalized", "cifar10"],
)
def test_a_png_reaches_the_net_as_the_datamodules_test_images_did(overrides, tmp_path):
    data_dir = tmp_path / "data"
    if "data=cifar10" in overrides:
        from tests.test_colour_data import write_cifar

        write_cifar(data_dir)
    else:
        write_mnist(data_dir)
    model = untrained(
        [*overrides, f"paths.data_dir={data_dir}", "data.verify_checksums=false", "data.val_size=10"], tmp_path
    )
    stored, _, expected = evaluation_batch(model.datamodule, 6)
    files = []
    for index, image in enumerate(stored):
        files.append(tmp_path / f"{index}.png")
        Image.fromarray(image.permute(1, 2, 0).squeeze(-1).numpy()).save(files[-1])
    read = [model.read(path) for path in files]
    assert all(notes == [] for _, notes in read)  # nothing done: the images are the evaluation size
    assert torch.equal(model.inputs(torch.stack([pixels for pixels, _ in read])), expected)


def test_an_rgb_image_folders_files_reach_the_net_as_its_datamodule_decodes_them(colour_folder, tmp_path):
    """Non-square RGB files (36x40): resized and centre-cropped by the one decoder both paths use."""
    model = untrained(
        ["data=image_folder", f"data.root={colour_folder}", "data.channels=3", "data.image_size=32"], tmp_path
    )
    datamodule = model.datamodule
    datamodule.data_dir = tmp_path  # its cache
    datamodule.prepare_data()
    cache = torch.load(datamodule.cache_path, weights_only=True)["all"]
    files = sorted((colour_folder / name / f) for name in ("blue", "green", "red") for f in ("000.png", "001.png"))
    index = [sorted(p for p in colour_folder.rglob("*.png")).index(f) for f in files]
    read = [model.read(path) for path in files]
    assert all(notes == ["resized (shorter side to 32, centre crop)"] for _, notes in read)
    assert torch.equal(torch.stack([pixels for pixels, _ in read]), cache["images"][index])


def test_a_digit_on_a_canvas_model_is_centred_and_other_sizes_framed_or_with_fit_plain_resized(tmp_path):
    model = untrained(["data=translated_mnist", f"paths.data_dir={tmp_path}"], tmp_path)
    digit = torch.zeros(1, 28, 28, dtype=torch.uint8)
    digit[:, 5:22, 9:18] = torch.randint(1, 256, (1, 17, 9), dtype=torch.uint8)  # light ink on black
    pixels, notes = model.read(digit)
    assert notes == ["placed at the centre of the 40x40 canvas"]
    assert torch.equal(pixels[:, 6:34, 6:34], digit) and pixels.sum() == digit.sum()
    page = torch.zeros(1, 50, 60, dtype=torch.uint8)
    page[:, 10:40, 20:35] = 200
    pixels, notes = model.read(page)
    assert pixels.shape == (1, 40, 40) and notes[1] == "placed at the centre of the 40x40 canvas"
    assert notes[0].startswith("framed as MNIST's digits: the ink's 30x15 box scaled to 20 pixels")
    model.fit = "plain"
    pixels, notes = model.read(page)
    assert pixels.shape == (1, 40, 40) and notes == ["resized (shorter side to 40, centre crop): fit=plain"]


def test_colour_is_converted_both_ways_with_a_note(tmp_path):
    grey = untrained(["data=mnist", f"paths.data_dir={tmp_path}"], tmp_path)
    grey.fit = "plain"  # random pixels have no polarity to tell: the conversion alone is checked
    rgb_file = tmp_path / "rgb.png"
    write_png(torch.randint(0, 256, (3, 28, 28), dtype=torch.uint8), rgb_file)
    pixels, notes = grey.read(rgb_file)
    expected = torch.from_numpy(np.array(Image.open(rgb_file).convert("L")))[None]
    assert torch.equal(pixels, expected) and notes[0].startswith("RGB converted to grey")
    colour = untrained(["data=cifar10", "model=lenet5", f"paths.data_dir={tmp_path}"], tmp_path)
    grey_file = tmp_path / "grey.png"
    Image.fromarray(np.full((32, 32), 77, np.uint8)).save(grey_file)
    pixels, notes = colour.read(grey_file)
    assert (
        pixels.shape == (3, 32, 32)
        and (pixels == 77).all()
        and notes == ["grey converted to RGB, as the model's training images"]
    )


def test_load_gives_the_model_that_predicts_what_its_test_step_did(trained_run, tmp_path):
    """capsexp.load(run folder) -> its best checkpoint; predicting on PNGs of the test images gives the
    classes the run's test step scored (the logged test accuracy), and the scores of its forward pass."""
    model = capsexp.load(trained_run)
    assert model.checkpoint.parent == trained_run / "checkpoints" and model.checkpoint.name != "last.ckpt"
    assert model.score_kind == "capsule length" and model.class_names == [str(d) for d in range(10)]
    datamodule = instantiate("data", model.config.data, _convert_="all")
    stored, targets, net_input = evaluation_batch(datamodule, 100)
    with torch.no_grad():
        expected = model.module(net_input).scores
    files = sorted(digit_folder(stored, targets, tmp_path / "digits").rglob("*.png"))
    predictions = model.predict(files)  # in the order given: by class folder, then by index
    order = torch.tensor([int(p.stem) for p in files])
    assert torch.allclose(predictions.scores, expected[order], atol=1e-6)
    assert torch.equal(predictions.classes, expected[order].argmax(dim=1))
    from tests.helpers import scalars

    test_acc = scalars(trained_run)["test/acc"][-1].value
    assert float((predictions.classes == targets[order]).float().mean()) == pytest.approx(test_acc, abs=1e-6)
    # structured results of a capsule model
    assert predictions.poses.shape == (100, 10, 16) and predictions.couplings.shape[::2] == (100, 10)
    assert predictions.reconstructions.shape == (100, 1, 28, 28)
    # a class's name where the net found one present, the model's word for none where it did not
    shown = zip(predictions.classes.tolist(), predictions.present.tolist(), strict=True)
    names = [str(c) if present else "no digit found" for c, present in shown]
    assert predictions.names == names


def test_a_tensor_image_is_one_image_with_or_without_its_channel(trained_run):
    """(H, W) and (1, H, W) are the same single image; (N, 1, H, W) is N images."""
    model = capsexp.load(trained_run)
    image = torch.rand(28, 28, generator=torch.Generator().manual_seed(3))
    plain, channelled = model.predict(image), model.predict(image[None])
    assert plain.scores.shape == (1, 10) and torch.equal(plain.scores, channelled.scores)
    batch = torch.stack([image[None], image.flip(0)[None]])
    assert model.predict(batch).scores.shape == (2, 10)
    # A float image in [0, 1] is read to the nearest grey level: (k + 0.6) / 255 as k + 1, not k.
    levels = torch.randint(0, 255, (1, 28, 28), generator=torch.Generator().manual_seed(5))
    read = model.predict((levels + 0.6) / 255).inputs
    assert torch.equal(read, model.predict((levels + 1).to(torch.uint8)).inputs)


def test_the_figure_of_an_image_holds_what_the_model_computed(trained_run, tmp_path):
    """The figure of the third of five images: its input, reconstruction, score bars, couplings and pose
    perturbation (its middle column, the tweak 0, is its own reconstruction), not the first image's."""
    from capsexp.figures.images import PERTURBATION_STEPS

    model = capsexp.load(trained_run)
    images = torch.randint(0, 256, (5, 1, 28, 28), dtype=torch.uint8, generator=torch.Generator().manual_seed(4))
    images[2, :, 8:20, 12:16] = 255  # a bar: unlike the noise of the others
    predictions = model.predict(images)
    index = 2
    figure = explain_figure(model, predictions, index, "an image")
    axes = {ax.get_label(): ax for ax in figure.get_axes() if ax.get_label()}
    net = model.net
    with torch.no_grad():
        output = net(predictions.inputs)
        # the couplings recomputed by the router's own forward, iteration by iteration
        children = net.primary(torch.relu(net.conv1(predictions.inputs)))
        couplings = net.digits.routed_by_iteration(children)[-1].assignment[index]
    assert not torch.allclose(output.scores[index], output.scores[0])
    assert np.allclose(axes["input"].images[0].get_array(), predictions.inputs[index, 0].numpy())
    reconstruction = output.reconstructions[index, 0].numpy()
    assert np.allclose(axes["reconstruction"].images[0].get_array(), reconstruction, atol=1e-6)
    widths = [patch.get_width() for patch in axes["scores"].patches]
    assert np.allclose(widths, output.scores[index].numpy(), atol=1e-6)
    maps = position_maps(couplings[None], net.primary.num_types)[0]
    for j in range(10):
        assert np.allclose(axes[f"couplings/{j}"].images[0].get_array(), maps[j].numpy(), atol=1e-6)
    grid = axes["pose_perturbation"].images[0].get_array()
    middle = PERTURBATION_STEPS // 2  # the first pose dimension's row, untweaked: the reconstruction
    tile = grid[1:29, 1 + middle * 29 : 29 + middle * 29, 0]  # make_grid: a 1-pixel border before each tile
    assert np.allclose(tile, reconstruction.clip(0, 1), atol=1e-5)


def test_a_checkpoint_carries_its_run_and_the_run_folder_its_revision(trained_run):
    checkpoint = torch.load(next((trained_run / "checkpoints").glob("epoch_*.ckpt")), weights_only=True)
    record = checkpoint[RUN_RECORD]
    assert record["config"]["model"]["net"]["primary_types"] == 4 and record["class_names"][3] == "3"
    revision = read_revision(trained_run)
    assert revision == record["revision"] and (trained_run / REVISION_FILE).is_file()
    assert revision["commit"] is None or len(revision["commit"]) == 40


def test_a_run_resumed_by_other_code_keeps_the_code_it_ran_before(tmp_path):
    from capsexp.records.revision import short, write_revision

    first = {"version": "0.1.0", "commit": "a" * 40, "dirty": False, "diff_sha256": None}
    second = {**first, "dirty": True, "diff_sha256": "b" * 64}
    write_revision(tmp_path, first)
    write_revision(tmp_path, first)  # resumed by the same code: nothing to keep
    assert read_revision(tmp_path) == first and short(first) == "aaaaaaa"
    write_revision(tmp_path, second)
    assert read_revision(tmp_path) == {**second, "earlier": [first]}
    assert short(read_revision(tmp_path)) == "aaaaaaa, then aaaaaaa+changes bbbbbbbb"


def test_bad_inputs_get_a_few_lines(trained_run, tmp_path):
    not_image = tmp_path / "notes.png"
    not_image.write_text("not an image")
    good = tmp_path / "good.png"
    Image.fromarray(np.zeros((28, 28), np.uint8)).save(good)
    (tmp_path / "empty").mkdir()
    torch.save({"weights": torch.zeros(2)}, tmp_path / "other.ckpt")
    cases = {
        (f"images={not_image}",): "1 of 1 files could not be read as images",
        (f"images={tmp_path / 'empty'}",): "no image files in this folder",
        (f"images={tmp_path}/*.jpeg",): "the pattern matches no file",
        (f"images={tmp_path / 'missing.png'}",): "no such file or folder",
        (f"images={good}", f"ckpt_path={tmp_path / 'other.ckpt'}"): "not a Lightning checkpoint",
        (f"images={good}", "top_k=0"): "top_k=0: must be a whole number of at least 1",
        (f"images={good}", "trainer.devices=2"): "trainer.devices=2: predict runs on one device",
    }
    for overrides, message in cases.items():
        ckpt = [] if any(o.startswith("ckpt_path") for o in overrides) else [f"ckpt_path={trained_run}"]
        result = predict_cli(*ckpt, *overrides, f"hydra.run.dir={tmp_path / 'out'}", "explain=0")
        assert result.returncode != 0 and message in result.stderr, (overrides, result.stderr[-2000:])
        assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) <= 8
    with pytest.raises(ImageError, match="not an image Pillow can read"):
        capsexp.load(trained_run).predict(not_image)
    with pytest.raises(CheckpointError, match="not a PyTorch checkpoint"):
        bad = tmp_path / "bad.ckpt"
        bad.write_bytes(pickle.dumps([1, 2]))
        capsexp.load(bad)


def readme_section() -> str:
    from tests.helpers import PROJECT_ROOT

    return (PROJECT_ROOT / "README.md").read_text().split("## Using a trained model")[1].split("\n## ")[0]


def test_the_readmes_predict_command_writes_rows_a_summary_and_figures_and_its_python_example_runs(
    trained_run, tmp_path, monkeypatch
):
    """The README's two uses of its first run's model, on 30 MNIST test digits written as PNG files in
    class folders (real MNIST where it is present, the synthetic digits otherwise): the rows are the
    model's own predictions, the summary holds their accuracy, the first lines are printed."""
    import re

    from capsexp.data import MNISTDataModule
    from tests.helpers import has_real_mnist, real_data_dir

    data_dir = real_data_dir()
    if not has_real_mnist(data_dir):
        data_dir = write_mnist(tmp_path / "data")
    stored, targets, _ = evaluation_batch(MNISTDataModule(data_dir=data_dir, verify_checksums=False), 30)
    monkeypatch.chdir(tmp_path)
    folder = digit_folder(stored, targets, tmp_path / "my_digits")
    section = readme_section().replace("logs/train/runs/<YYYY-mm-dd_HH-MM-SS-ffffff>", str(trained_run))
    command = re.search(r"python -m capsexp\.predict (.*)", section)[1].split()
    out = tmp_path / "out"
    result = predict_cli(*command, "explain=2", "lines=3", "top_k=2", f"hydra.run.dir={out}")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = read_rows(out / "predictions.csv")
    assert len(rows) == 30 and rows[0]["score_kind"] == "capsule length"
    model = capsexp.load(trained_run)
    expected = model.predict([folder / row["file"] for row in rows])
    assert [row["predicted"] for row in rows] == expected.names
    assert [float(row["top2_score"]) for row in rows] == pytest.approx([t[1][1] for t in expected.top(2)], abs=1e-4)
    accuracy = np.mean([row["predicted"] == row["label"] for row in rows])
    summary = (out / "summary.md").read_text()
    assert f"Accuracy: **{100 * accuracy:.2f}%**" in summary and "Confusion matrix" in summary
    printed = [line for line in result.stdout.splitlines() if not line.startswith("[")]  # not the log's lines
    assert len(printed) == 4 and "capsule length" in printed[0] and printed[-1].startswith("... and 27 more")
    assert len(list((out / "explain").glob("*.png"))) == 2
    # the Python example, with two of the folder's files for the two it names
    code = re.search(r"```python\n(.*?)```", section, re.S)[1]
    files = sorted(folder.rglob("*.png"))
    for shown, real in zip(re.findall(r'"(my_digits/[^"]+)"', code), files[:2], strict=True):
        code = code.replace(shown, str(real))
    namespace: dict = {}
    exec(code, namespace)
    assert len(namespace["predictions"]) == 2 and len(namespace["top"]) == 3


def test_a_run_writes_a_model_card_from_what_it_recorded(trained_run):
    from capsexp.records.revision import short
    from tests.helpers import scalars

    card = (trained_run / "model_card.md").read_text()
    logged = scalars(trained_run)
    assert card.startswith("# Model card: capsnet_small on mnist")
    assert f"| test/acc | {100 * logged['test/acc'][-1].value:.2f}% |" in card
    assert f"| val/acc_best | {100 * logged['val/acc_best'][-1].value:.2f}% |" in card
    assert "| split sizes | train 240, val 60, test 100 |" in card  # the synthetic MNIST's 300 and 100
    model = capsexp.load(trained_run)
    assert f"| parameters | {sum(p.numel() for p in model.net.parameters()):,} |" in card
    assert short(read_revision(trained_run)) in card and "primary_types=4" in card
    # trainer.precision=auto, the default: bf16 where the page backs capsnet_small and the CPU has AVX-512 BF16 or AMX
    native = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    ran = "bf16-mixed" if native and BF16_MODELS.get("capsnet_small") == "capsexp.nn.DynamicRouting" else "32-true"
    assert f"| precision | {ran} (`trainer.precision=auto`) |" in card
    assert (
        f"Precision: {ran} (auto: model=capsnet_small with DynamicRouting" in (trained_run / "capsexp.log").read_text()
    )


def test_an_image_the_model_takes_otherwise_gets_one_line_per_thing_done(trained_run, tmp_path):
    """A 50x60 RGB photo into a 28x28 grey model: converted and resized, each said once in the output and
    in its row."""
    write_png(torch.randint(0, 256, (3, 50, 60), dtype=torch.uint8), tmp_path / "photo.png")
    result = predict_cli(
        f"ckpt_path={trained_run}",
        f"images={tmp_path / 'photo.png'}",
        "fit=plain",
        f"hydra.run.dir={tmp_path / 'out'}",
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "1 of 1 images: RGB converted to grey (ITU-R 601-2 luma), as the model's training images" in result.stdout
    assert "1 of 1 images: resized (shorter side to 28, centre crop): fit=plain" in result.stdout
    (row,) = read_rows(tmp_path / "out" / "predictions.csv")
    grey = "RGB converted to grey (ITU-R 601-2 luma), as the model's training images"
    assert row["notes"] == f"{grey}; resized (shorter side to 28, centre crop): fit=plain"


def test_each_files_figure_has_its_own_name():
    from capsexp.use.predict import figure_names

    assert figure_names(["a.png", "a.jpg", "7/b.png", "c.jpeg"]) == ["a_png.png", "a_jpg.png", "7_b.png", "c.png"]
    assert figure_names(["x/a.png", "y/a.png"]) == ["x_a.png", "y_a.png"]


def test_a_predict_refused_before_its_first_batch_leaves_no_predictions_file(trained_run, tmp_path):
    """A Trainer that cannot be built (an accelerator this machine lacks) is refused before any image is
    predicted: no predictions.csv that looks like an empty result."""
    folder = tmp_path / "digits"
    folder.mkdir()
    Image.fromarray(np.zeros((28, 28), dtype=np.uint8)).save(folder / "0.png")
    out = tmp_path / "out"
    result = predict_cli(
        f"ckpt_path={trained_run}", f"images={folder}", "trainer.accelerator=cuda", f"hydra.run.dir={out}"
    )
    assert result.returncode != 0
    assert not (out / "predictions.csv").exists(), result.stderr[-2000:]


@pytest.mark.parametrize(
    "overrides,objects,kind",
    [
        (["model=lenet5"], 1, "softmax probability"),
        (["model=baseline_cnn"], 2, "sigmoid probability"),  # several objects: the loss's own sigmoid
        (["model=capsnet_small"], 1, "capsule length"),
        (["model=capsnet_small", "model/routing=sinkhorn"], 1, "class capsule activation"),
        (["model=em_caps_small"], 1, "EM activation"),
        (["model=em_caps_small", "model/routing=dynamic"], 1, "capsule length"),  # CapsNet's routing, its length
        (["model=em_caps_small", "model/routing=sinkhorn"], 1, "class capsule activation"),
    ],
)
def test_each_model_reports_the_scores_its_objective_reads(overrides, objects, kind, tmp_path):
    """What a prediction's scores are, by model and number of objects; logits become the probabilities
    their loss makes of them (by hand: logits 0 and ln 3 are 1/4 and 3/4 under softmax, 1/2 and 3/4 each
    under sigmoid)."""
    from capsexp.use.inference import reported_scores, score_kind

    cfg = compose_config([*overrides, f"paths.data_dir={tmp_path}"], tmp_path)
    assert score_kind(build_model("model", cfg.model), objects) == kind
    logits = torch.tensor([[0.0, float(np.log(3.0))]])
    expected = {"softmax probability": [[0.25, 0.75]], "sigmoid probability": [[0.5, 0.75]]}.get(kind, logits.tolist())
    torch.testing.assert_close(reported_scores(logits, kind), torch.tensor(expected))


@pytest.fixture(scope="module")
def trained_lenet5(tmp_path_factory) -> Path:
    """LeNet5 trained for 6 steps on synthetic MNIST: a model that names a class for every image."""
    root = tmp_path_factory.mktemp("lenet5")
    run_dir = root / "run"
    result = run_cli_in_process(
        *TINY_RUN, "model=lenet5", f"paths.data_dir={write_mnist(root / 'data')}", "trainer.max_steps=6",
        "trainer.val_check_interval=6", f"hydra.run.dir={run_dir}",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return run_dir


def test_a_folder_given_from_home_under_a_dot_folder_is_predicted_in_batches_row_by_row(
    trained_lenet5, tmp_path, monkeypatch
):
    """``images=~/.work/digits`` (a dot-folder, as under ~/.cache or a notebook's folders) of 30 digits in
    class folders of unequal sizes, predicted in batches of 4 (the last one short): every file read, each
    row labelled by its own folder and predicted as the model predicts it alone, the summary's confusion
    matrix cell by cell the rows' counts, and each explained figure showing its own image."""
    import collections

    from matplotlib.figure import Figure

    from capsexp.data import MNISTDataModule

    monkeypatch.setenv("HOME", str(tmp_path))
    stored, targets, _ = evaluation_batch(
        MNISTDataModule(data_dir=write_mnist(tmp_path / "data"), verify_checksums=False), 30
    )
    folder = digit_folder(stored, targets, tmp_path / ".work" / "digits")
    assert len(set(collections.Counter(targets.tolist()).values())) > 1  # unequal classes
    drawn: dict[str, np.ndarray] = {}
    save = Figure.savefig

    def recorded(figure, path, **kwargs):
        name = figure._suptitle.get_text().split(" (label ")[0]
        drawn[name] = next(ax for ax in figure.get_axes() if ax.get_label() == "input").images[0].get_array()
        return save(figure, path, **kwargs)

    monkeypatch.setattr(Figure, "savefig", recorded)
    out = tmp_path / "out"
    result = predict_cli(
        f"ckpt_path={trained_lenet5}", "images=~/.work/digits", "batch_size=4", "explain=7", "lines=0",
        "num_workers=0", f"hydra.run.dir={out}",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    rows = read_rows(out / "predictions.csv")
    assert len(rows) == 30 and "skipped" not in (out / "summary.md").read_text().lower()
    assert [row["label"] for row in rows] == [row["file"].split("/")[0] for row in rows]
    model = capsexp.load(trained_lenet5)
    alone = {row["file"]: model.predict([folder / row["file"]]) for row in rows}
    assert [row["predicted"] for row in rows] == [alone[row["file"]].names[0] for row in rows]
    assert len(set(row["predicted"] for row in rows)) > 1  # a matrix with more than one column filled
    counts = collections.Counter((row["label"], row["predicted"]) for row in rows)
    table = (out / "summary.md").read_text().split("Confusion matrix (rows: label, columns: predicted):")[1]
    lines = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith(("| label", "| ---"))]
    names = [str(d) for d in range(10)]
    cells = {line.split(" | ")[0][2:]: [int(v) for v in line.strip(" |").split(" | ")[1:]] for line in lines}
    assert cells == {label: [counts[(label, p)] for p in names] for label in names}
    assert len(drawn) >= 7  # the first 7, and the first 7 it got wrong
    for name, shown in drawn.items():
        assert np.allclose(shown, alone[name].inputs[0, 0].numpy()), name
    # The same files through the Python API in batches of 4: the scores of each image alone.
    files = [folder / row["file"] for row in rows]
    batched = model.predict(files, batch_size=4)
    assert torch.allclose(batched.scores, torch.cat([alone[row["file"]].scores for row in rows]), atol=1e-5)


def test_a_model_with_several_routing_layers_shows_the_couplings_of_its_last_to_the_classes(tmp_path):
    """EM capsules route three times (two convolutional capsule layers, then the class capsules): the
    couplings a prediction returns and its figure draws are the class capsules', one per class."""
    from capsexp.models.inspection import routing_layers
    from tests.helpers import TINY_EM_CAPS

    model = untrained(["model=em_caps_small", *TINY_EM_CAPS], tmp_path)
    assert model.routing_layer[0] == list(routing_layers(model.module))[-1] and len(routing_layers(model.module)) == 3
    images = torch.randint(0, 256, (3, 1, 28, 28), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    predictions = model.forward(model.inputs(images), couplings=True)
    assert predictions.couplings.shape[0] == 3 and predictions.couplings.shape[-1] == 10
