"""SmallNORBDataModule on small files written in the official format; downloads from a loopback server."""

from __future__ import annotations

import gzip
import hashlib
import http.server
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from capsexp.data import SmallNORBDataModule, base, smallnorb
from capsexp.data.affnist import download_affnist
from capsexp.data.base import md5sum
from capsexp.data.norb_format import SMALLNORB_FILES, write_matrix
from capsexp.data.smallnorb import PREFIX
from capsexp.errors import CorruptDatasetError, DatasetNotFoundError
from tests.helpers import (
    NORB_COUNT,
    TINY_EM_CAPS,
    TINY_RUN,
    FakeTrainer,
    norb_arrays,
    run_cli_in_process,
    scalars,
    write_norb,
)

COUNT = NORB_COUNT


def prepared(data_dir: Path, **kwargs) -> SmallNORBDataModule:
    options = dict(batch_size=12, val_size=12, verify_checksums=False, download=False)
    datamodule = SmallNORBDataModule(data_dir, **{**options, **kwargs})
    datamodule.prepare_data()
    datamodule.setup("fit")
    return datamodule


@pytest.mark.parametrize("stereo,channels,factor", [("both", 2, 1), ("left", 1, 1), ("split", 1, 2)])
def test_reads_plain_and_gz_files_in_each_stereo_mode(norb_dir, stereo, channels, factor):
    datamodule = prepared(norb_dir, stereo=stereo)
    assert len(datamodule.data_train) + len(datamodule.data_val) == factor * COUNT
    assert len(datamodule.data_test) == factor * COUNT
    images, _ = next(iter(datamodule.train_dataloader()))
    assert images.shape == (12, channels, 48, 48) and images.dtype == torch.uint8
    assert datamodule.dims == (channels, 32, 32)
    assert set(datamodule.data_test.extras) == {"instance", "elevation", "azimuth", "lighting"}
    # The training split came from the training file (seed 0), the test split from the testing one.
    test_info = norb_arrays(1)["info"]
    assert torch.equal(datamodule.data_test.extras["lighting"][::factor], torch.from_numpy(test_info[:, 3]).long())


def test_downsampling_is_2x2_averaging(norb_dir):
    datamodule = prepared(norb_dir, stereo="both")
    raw = torch.from_numpy(norb_arrays(1)["dat"][:2]).float()
    expected = torch.nn.functional.avg_pool2d(raw, 2).round().to(torch.uint8)
    assert torch.equal(datamodule.data_test.images[:2], expected)


def test_crops_jitter_and_standardisation(norb_dir):
    datamodule = prepared(norb_dir)
    datamodule.trainer = trainer = FakeTrainer()
    batch = (datamodule.data_test.images[:12], datamodule.data_test.targets[:12])
    evaluated, _ = datamodule.on_after_batch_transfer(batch, 0)
    assert evaluated.shape == (12, 2, 32, 32)
    assert torch.allclose(evaluated, datamodule.on_after_batch_transfer(batch, 0)[0])  # centre crop: fixed
    flat = evaluated.flatten(1)
    assert torch.allclose(flat.mean(1), torch.zeros(12), atol=1e-5)
    assert torch.allclose(flat.std(1, unbiased=False), torch.ones(12), atol=1e-4)
    trainer.training = True
    trained = []
    for step in (0, 0, 1):
        trainer.global_step = step
        trained.append(datamodule.on_after_batch_transfer(batch, 0)[0])
    assert trained[0].shape == (12, 2, 32, 32) and not torch.allclose(trained[0], trained[2])
    assert torch.equal(trained[0], trained[1])  # drawn from the step: a resumed run jitters alike
    # An attack perturbs the pixels (centre crop, in [0, 1]) and differentiates through the
    # standardisation: the two steps together are the batch the net sees.
    trainer.training = False
    pixels, _ = datamodule.pixel_batch(batch, 0)
    assert pixels.min() >= 0 and pixels.max() <= 1 and pixels.std() > 0
    assert torch.equal(datamodule.input_transform(pixels), evaluated)


@pytest.mark.parametrize(
    "viewpoint,column,trained", [("azimuth", "azimuth", {30, 32, 34, 0, 2, 4}), ("elevation", "elevation", {0, 1, 2})]
)
def test_novel_viewpoint_splits(norb_dir, viewpoint, column, trained):
    familiar = prepared(norb_dir, viewpoint=viewpoint, familiar=True, val_size=6)
    novel = prepared(norb_dir, viewpoint=viewpoint, familiar=False, val_size=6)
    train_values = set(torch.cat([familiar.data_train.extras[column], familiar.data_val.extras[column]]).tolist())
    assert train_values == trained
    assert set(familiar.data_test.extras[column].tolist()) == trained
    assert set(novel.data_test.extras[column].tolist()).isdisjoint(trained)
    assert len(familiar.data_test) + len(novel.data_test) == COUNT
    # Both from one run: the familiar viewpoints first, the novel ones as the test set "novel".
    both = prepared(norb_dir, viewpoint=viewpoint, familiar=True, val_size=6, extra_test_sets=["novel"])
    assert both.test_set_names == ["", "novel"]
    first, second = both.test_dataloader()
    assert sum(len(b[1]) for b in first) == len(familiar.data_test)
    assert torch.equal(torch.cat([b[1] for b in second]), novel.data_test.targets)


def test_the_novel_test_set_needs_the_familiar_viewpoints_protocol(norb_dir):
    for wrong in ({}, {"viewpoint": "azimuth", "familiar": False}):
        with pytest.raises(ValueError, match=r"needs data\.viewpoint=azimuth or elevation and data\.familiar=true"):
            SmallNORBDataModule(data_dir=norb_dir, extra_test_sets=["novel"], **wrong)


def test_cache_is_built_once_and_rebuilt_when_a_source_changes(norb_dir):
    datamodule = prepared(norb_dir)
    cache = datamodule.cache_path
    built = cache.stat().st_mtime_ns
    prepared(norb_dir)
    assert cache.stat().st_mtime_ns == built, "an up-to-date cache must not be rebuilt"
    changed = norb_arrays(1)["dat"].copy()
    changed[0] = 255
    write_matrix(norb_dir / "smallnorb" / f"{PREFIX['test']}-dat.mat", changed)
    rebuilt = prepared(norb_dir)
    assert cache.stat().st_mtime_ns != built
    assert int(rebuilt.data_test.images[0].min()) == 255


@pytest.mark.parametrize(
    "damage,message",
    [
        (lambda raw: b"\x00" * 4 + raw[4:], "not a NORB matrix file"),
        (lambda raw: raw[:-100], "truncated"),
    ],
)
def test_bad_files_name_the_file(norb_dir, damage, message):
    path = norb_dir / "smallnorb" / f"{PREFIX['test']}-dat.mat"
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(CorruptDatasetError, match=f"testing-dat.mat.*{message}|testing-dat.mat: magic.*{message}"):
        prepared(norb_dir)


def test_wrong_dims_and_values_name_the_file(norb_dir):
    write_matrix(norb_dir / "smallnorb" / f"{PREFIX['test']}-info.mat", np.zeros((COUNT, 3), dtype=np.int32))
    with pytest.raises(CorruptDatasetError, match=r"testing-info.mat: shape \(108, 3\), expected \(108, 4\)"):
        prepared(norb_dir)
    write_matrix(norb_dir / "smallnorb" / f"{PREFIX['test']}-info.mat", np.full((COUNT, 4), 40, dtype=np.int32))
    with pytest.raises(CorruptDatasetError, match=r"testing-info.mat: instance outside 0-9"):
        prepared(norb_dir)


def test_checksums_are_checked_by_default(norb_dir):
    with pytest.raises(CorruptDatasetError, match=r"md5 differs.*verify_checksums=false"):
        prepared(norb_dir, verify_checksums=True)


def test_missing_files_without_network_name_folder_and_files(tmp_path):
    with pytest.raises(DatasetNotFoundError) as error:
        prepared(tmp_path)
    message = str(error.value)
    assert str(tmp_path / "smallnorb") in message and all(name in message for name in SMALLNORB_FILES)
    assert "\nDownloading is off (data.download=false).\n" in message and "CAPSEXP_DATA_DIR" in message
    first = next(iter(SMALLNORB_FILES))
    with pytest.raises(DatasetNotFoundError) as error:  # the reason, not the exception's wrapping
        prepared(tmp_path, download=True, base_url="http://127.0.0.1:9//")
    assert f"\nDownload of http://127.0.0.1:9/{first}.gz failed: [Errno 111] Connection refused\n" in str(error.value)
    assert not list((tmp_path / "smallnorb").glob("*"))


# ---- download from a loopback HTTP server ----------------------------------------------------
class Server:
    def __init__(
        self, directory: Path, truncate: str | None = None, watch: Path | None = None, stall: str | None = None
    ):
        truncated = truncate
        self.seen_while_serving: list[list[str]] = []  # the files in ``watch`` halfway through each file
        seen = self.seen_while_serving

        class Handler(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, directory=str(directory), **kwargs)

            def log_message(self, *args):
                pass

            def copyfile(self, source, outputfile):
                if watch is None:
                    return super().copyfile(source, outputfile)
                body = source.read()
                outputfile.write(body[: len(body) // 2])
                outputfile.flush()
                time.sleep(0.2)  # the client has written the first half by now
                seen.append(sorted(path.name for path in watch.iterdir()))
                outputfile.write(body[len(body) // 2 :])

            def do_GET(self):
                # Announce the whole file, send a tenth of it, then hang up (an interrupted download) or
                # first fall silent for 2 s (a stalled server).
                for name, silent_s in ((truncated, 0), (stall, 2)):
                    if name and self.path.endswith(name):
                        body = (directory / name).read_bytes()
                        self.send_response(200)
                        self.send_header("Content-Length", str(len(body)))
                        self.end_headers()
                        self.wfile.write(body[: len(body) // 10])
                        self.wfile.flush()
                        time.sleep(silent_s)
                        self.close_connection = True
                        return
                super().do_GET()

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def served(tmp_path: Path) -> Path:
    """The six files gzipped, as the official site serves them."""
    folder = write_norb(tmp_path / "source", gz=False) / "smallnorb"
    for path in folder.glob("*.mat"):
        path.with_name(path.name + ".gz").write_bytes(gzip.compress(path.read_bytes()))
        path.unlink()
    return folder


def test_download_from_the_configured_url(served, tmp_path):
    with Server(served) as server:
        datamodule = prepared(tmp_path / "data", download=True, base_url=server.url)
    assert len(datamodule.data_test) == COUNT
    assert sorted(p.name for p in (tmp_path / "data" / "smallnorb").glob("*.gz")) == sorted(
        f"{name}.gz" for name in SMALLNORB_FILES
    )


def test_corrupted_download_is_detected_and_not_kept(served, tmp_path):
    with Server(served) as server, pytest.raises(CorruptDatasetError, match="downloaded file's md5 differs"):
        prepared(tmp_path / "data", download=True, base_url=server.url, verify_checksums=True)
    assert not list((tmp_path / "data" / "smallnorb").glob("*.mat*"))
    assert not list((tmp_path / "data" / "smallnorb").glob("*.download"))


def test_a_download_is_written_beside_its_file_first_and_kept_when_its_md5_is_the_official_one(
    served, tmp_path, monkeypatch
):
    """Each file arrives as a temporary ``*.partial`` in the data folder (a rename into place cannot
    cross file systems), never in the system's temporary folder; checked against the official md5 of
    the .gz (here the served files' own md5s stand in for the official ones)."""
    official = {
        name: (
            md5sum(served / f"{name}.gz"),
            hashlib.md5(gzip.decompress((served / f"{name}.gz").read_bytes())).hexdigest(),
        )
        for name in SMALLNORB_FILES
    }
    monkeypatch.setattr(smallnorb, "SMALLNORB_FILES", official)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "system_temp"))
    (tmp_path / "system_temp").mkdir()
    folder = tmp_path / "data" / "smallnorb"
    folder.mkdir(parents=True)
    with Server(served, watch=folder) as server:
        datamodule = prepared(tmp_path / "data", download=True, base_url=server.url, verify_checksums=True)
    assert len(datamodule.data_test) == COUNT
    for index, seen in enumerate(server.seen_while_serving):  # each file's temporary, then the file
        assert len([name for name in seen if name.endswith(".partial")]) == 1 and len(seen) == index + 1, seen
    assert list((tmp_path / "system_temp").iterdir()) == []


def test_interrupted_download_is_not_left_behind(served, tmp_path):
    victim = f"{PREFIX['test']}-dat.mat.gz"
    size = (served / victim).stat().st_size
    with Server(served, truncate=victim) as server, pytest.raises(DatasetNotFoundError) as error:
        prepared(tmp_path / "data", download=True, base_url=server.url)
    assert f"{victim} failed: interrupted after {size // 10} of {size} bytes\n" in str(error.value)
    folder = tmp_path / "data" / "smallnorb"
    assert not (folder / victim).exists() and not list(folder.glob("*.partial"))
    # With the server fixed, the next run fetches what is still missing and works.
    with Server(served) as server:
        assert len(prepared(tmp_path / "data", download=True, base_url=server.url).data_test) == COUNT


def test_a_server_that_falls_silent_fails_the_download_after_the_timeout(served, tmp_path, monkeypatch):
    monkeypatch.setattr(base, "DOWNLOAD_TIMEOUT_S", 0.3)
    victim = f"{PREFIX['test']}-dat.mat.gz"
    (tmp_path / "data").mkdir()
    target = tmp_path / "data" / victim
    with Server(served, stall=victim) as server, pytest.raises(base.DownloadFailed, match="timed out"):
        started = time.perf_counter()
        base.download(server.url + victim, target)
    assert time.perf_counter() - started < 1.5  # not the 2 s the server stays silent
    assert list((tmp_path / "data").iterdir()) == []  # neither the file nor its partial copy


def test_an_interrupted_affnist_download_says_so_and_leaves_nothing(tmp_path):
    (tmp_path / "served").mkdir()
    (tmp_path / "served" / "test_batches.zip").write_bytes(bytes(range(256)) * 40)
    with (
        Server(tmp_path / "served", truncate="test_batches.zip") as server,
        pytest.raises(DatasetNotFoundError) as error,
    ):
        download_affnist(tmp_path / "data", server.url + "test_batches.zip")
    assert "affNIST: download of " in str(error.value) and "failed: interrupted after 1024 of 10240 bytes" in str(
        error.value
    )
    assert list((tmp_path / "data" / "affNIST").iterdir()) == []


# ---- every model trains on it through the CLI ---------------------------------------------------
@pytest.mark.parametrize(
    "model,extra",
    [
        ("lenet5", []),
        # The capsule nets, 8 s each here: make test-slow.
        pytest.param("capsnet", ["model.net.conv_channels=16", "model.net.primary_types=4"], marks=pytest.mark.slow),
        # The spread loss grows with its margin: a ramp over 600 steps keeps it near 0.2 over these 18,
        # so the loss says whether the net learns.
        pytest.param("em_caps", [*TINY_EM_CAPS, "model/margin=linear_steps"], marks=pytest.mark.slow),
    ],
)
def test_each_model_trains_on_smallnorb_through_the_cli(norb_dir, tmp_path, model, extra):
    result = run_cli_in_process(
        *TINY_RUN,
        f"paths.data_dir={norb_dir}",
        "data=smallnorb",
        f"model={model}",
        *extra,
        "data.val_size=12",
        "data.batch_size=12",
        "trainer.max_epochs=6",
        "trainer.limit_train_batches=3",
        "trainer.limit_test_batches=2",
        f"hydra.run.dir={tmp_path}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "checkpoints" / "last.ckpt").exists()
    losses = [event.value for event in scalars(tmp_path)["train/loss_step"]]
    # 18 steps: over 9, batch noise (12 images) can hide em_caps' learning.
    assert len(losses) == 18 and sum(losses[-3:]) < sum(losses[:3]), losses  # it learns
