"""The official affNIST test set (Tieleman 2013, https://www.cs.toronto.edu/~tijmen/affNIST/): the
10,000 MNIST test digits, each under 32 random affine maps, on 40x40 images.

The files are the 32 MATLAB files of ``32x/transformed/test_batches.zip`` (``1.mat`` .. ``32.mat``),
each a struct ``affNISTdata`` whose ``image`` is 1600 x N uint8 (one 40x40 image per column, in row-major
order: the reading of every public port) and ``label_int`` 1 x N. They live in
``<data_dir>/affNIST/test_batches/``; the zip is downloaded and unpacked there when missing (where
downloading is allowed). The affNIST page publishes no checksums: every file is checked for its
structure (struct and fields, shapes, dtype, label range) instead, and the md5 of the files read is
logged so that a results page can state which copy it used.
"""

from __future__ import annotations

import logging
import zipfile
from pathlib import Path

import numpy as np
import torch

from capsexp.data.base import DownloadFailed, download, md5sum
from capsexp.errors import CorruptDatasetError, DatasetNotFoundError

log = logging.getLogger(__name__)

AFFNIST_URL = "https://www.cs.toronto.edu/~tijmen/affNIST/32x/transformed/test_batches.zip"
AFFNIST_SIZE = 40  # affNIST images are 40x40
TEST_BATCHES = 32  # 1.mat .. 32.mat, one affine map of every MNIST test digit each


def affnist_folder(data_dir: Path) -> Path:
    return data_dir / "affNIST" / "test_batches"


def batch_files(data_dir: Path, batches: int) -> list[Path]:
    """The first ``batches`` of the official test files, in order."""
    return [affnist_folder(data_dir) / f"{index}.mat" for index in range(1, batches + 1)]


def download_affnist(data_dir: Path, url: str = AFFNIST_URL) -> None:
    """Download the test batches' zip and unpack it into ``<data_dir>/affNIST/`` (it holds ``test_batches/``)."""
    target = affnist_folder(data_dir).parent
    target.mkdir(parents=True, exist_ok=True)
    archive = target / "test_batches.zip"
    if not archive.exists():
        log.info("downloading %s (about 100 MB)", url)
        try:
            download(url, archive)
        except DownloadFailed as error:
            raise DatasetNotFoundError(
                f"affNIST: download of {url} failed: {error}\n"
                f"Download it elsewhere and unpack it into {target} (it holds test_batches/1.mat .. 32.mat)."
            ) from None
    try:
        with zipfile.ZipFile(archive) as bundle:
            bundle.extractall(target)
    except zipfile.BadZipFile:
        raise CorruptDatasetError(f"{archive}: not a valid zip file; delete it and download it again") from None


def read_batch(path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """One official test file as (images (N, 1, 40, 40) uint8, labels (N,) int64), checked."""
    from scipy.io import loadmat  # scipy loads slowly and only affNIST needs it
    from scipy.io.matlab import MatReadError

    try:
        contents = loadmat(path, simplify_cells=True)
    except (MatReadError, ValueError, TypeError, OSError, NotImplementedError) as error:
        raise CorruptDatasetError(f"{path}: not a MATLAB file as affNIST's ({error})") from None
    data = contents.get("affNISTdata")
    if not isinstance(data, dict) or not {"image", "label_int"} <= data.keys():
        raise CorruptDatasetError(
            f"{path}: no struct affNISTdata with fields image and label_int, as affNIST's files have"
        )
    images, labels = np.asarray(data["image"]), np.atleast_1d(np.asarray(data["label_int"]))
    pixels = AFFNIST_SIZE * AFFNIST_SIZE
    if images.ndim != 2 or images.shape[0] != pixels or images.dtype != np.uint8:
        raise CorruptDatasetError(
            f"{path}: affNISTdata.image is {images.dtype} {images.shape}; affNIST's is uint8 ({pixels}, N), "
            f"one {AFFNIST_SIZE}x{AFFNIST_SIZE} image per column"
        )
    if labels.shape != (images.shape[1],):
        raise CorruptDatasetError(f"{path}: {labels.size} labels (label_int) for {images.shape[1]} images")
    if labels.size and not (labels.min() >= 0 and labels.max() <= 9):
        raise CorruptDatasetError(f"{path}: label_int outside 0-9 ({labels.min()}..{labels.max()})")
    image_tensor = torch.from_numpy(np.ascontiguousarray(images.T)).view(-1, 1, AFFNIST_SIZE, AFFNIST_SIZE)
    return image_tensor, torch.from_numpy(labels.astype(np.int64))


def ensure_affnist_files(data_dir: Path, batches: int, download: bool) -> list[Path]:
    """The first ``batches`` official test files, downloaded first where missing and allowed; a
    :class:`DatasetNotFoundError` naming the missing ones otherwise."""
    files = batch_files(data_dir, batches)
    missing = [path for path in files if not path.exists()]
    if missing and download:
        download_affnist(data_dir)
        missing = [path for path in files if not path.exists()]
    if missing:
        listed = "\n".join(f"  {path.name}" for path in missing[:5]) + ("\n  ..." if len(missing) > 5 else "")
        raise DatasetNotFoundError(
            f"affNIST test set not found: {len(missing)} of the {batches} files asked for are missing in "
            f"{affnist_folder(data_dir)}:\n{listed}\n"
            f"{'Downloading is off (data.download=false). ' if not download else ''}"
            f"Unpack {AFFNIST_URL} into {affnist_folder(data_dir).parent}, or test on fewer files "
            f"(data.affnist_batches), or leave affnist out of data.extra_test_sets."
        )
    return files


def read_affnist_test(data_dir: Path, batches: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``batches`` official test files concatenated (``batches`` x 10,000 images)."""
    files = ensure_affnist_files(data_dir, batches, download=False)
    parts = [read_batch(path) for path in files]
    log.info(
        "affNIST test set: %d images from %d files; md5 %s",
        sum(len(labels) for _, labels in parts),
        len(files),
        ", ".join(f"{path.name} {md5sum(path)}" for path in files),
    )
    return torch.cat([images for images, _ in parts]), torch.cat([labels for _, labels in parts])
