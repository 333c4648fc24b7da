"""The NORB binary matrix format: round trips, the official header layout, and every bad-file error."""

from __future__ import annotations

import gzip
import struct

import numpy as np
import pytest

from capsexp.data.norb_format import SMALLNORB_FILES, read_header, read_matrix, write_matrix
from capsexp.errors import CorruptDatasetError


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_round_trip_of_the_three_smallnorb_file_kinds(tmp_path, suffix):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(6, 2, 96, 96), dtype=np.uint8)
    categories = np.array([0, 1, 2, 3, 4, 0], dtype=np.int32)
    info = rng.integers(0, 9, size=(6, 4)).astype(np.int32)
    for name, array in [("dat", images), ("cat", categories), ("info", info)]:
        path = write_matrix(tmp_path / f"x-{name}.mat{suffix}", array)
        read = read_matrix(path)
        assert read.dtype == array.dtype and np.array_equal(read, array)


def test_header_bytes_follow_the_official_layout(tmp_path):
    path = write_matrix(tmp_path / "cat.mat", np.arange(5, dtype=np.int32))
    raw = path.read_bytes()
    # int32 magic, ndim = 1, three dims padded with 1, then little-endian int32 data.
    assert struct.unpack("<5i", raw[:20]) == (0x1E3D4C54, 1, 5, 1, 1)
    assert raw[20:] == np.arange(5, dtype="<i4").tobytes()
    path = write_matrix(tmp_path / "dat.mat", np.zeros((2, 2, 3, 3), dtype=np.uint8))
    assert struct.unpack("<6i", path.read_bytes()[:24]) == (0x1E3D4C55, 4, 2, 2, 3, 3)
    assert read_header(path) == (np.dtype("u1"), (2, 2, 3, 3))


def test_wrong_magic_names_the_file(tmp_path):
    path = tmp_path / "bad.mat"
    path.write_bytes(struct.pack("<5i", 0x12345678, 1, 3, 1, 1) + bytes(12))
    with pytest.raises(CorruptDatasetError, match=r"bad.mat: magic 0x12345678: not a NORB matrix file"):
        read_matrix(path)
    path.write_bytes(struct.pack("<5i", 0x1E3D4C51, 1, 3, 1, 1) + bytes(12))
    with pytest.raises(CorruptDatasetError, match="float32 matrix, not used by smallNORB"):
        read_matrix(path)


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_truncated_or_overlong_data_names_the_file(tmp_path, suffix):
    path = write_matrix(tmp_path / f"dat.mat{suffix}", np.zeros((3, 2, 4, 4), dtype=np.uint8))
    raw = gzip.decompress(path.read_bytes()) if suffix else path.read_bytes()
    for bad, message in [
        (raw[:-7], "truncated"),
        (raw + b"\0", "longer than its header"),
        (raw[:10], "truncated header"),
    ]:
        path.write_bytes(gzip.compress(bad) if suffix else bad)
        with pytest.raises(CorruptDatasetError, match=f"dat.mat{suffix}.*{message}"):
            read_matrix(path)


def test_corrupted_gzip_and_wrong_shape(tmp_path):
    path = write_matrix(tmp_path / "info.mat.gz", np.zeros((4, 4), dtype=np.int32))
    assert read_matrix(path, expected_shape=(None, 4)).shape == (4, 4)
    with pytest.raises(CorruptDatasetError, match=r"info.mat.gz: shape \(4, 4\), expected \(None, 3\)"):
        read_matrix(path, expected_shape=(None, 3))
    path.write_bytes(path.read_bytes()[:12])
    with pytest.raises(CorruptDatasetError, match=r"info.mat.gz"):
        read_matrix(path)


def test_writer_rejects_types_smallnorb_does_not_use(tmp_path):
    with pytest.raises(ValueError, match="uint8 or int32"):
        write_matrix(tmp_path / "x.mat", np.zeros(3, dtype=np.float32))


def test_the_official_file_table():
    assert len(SMALLNORB_FILES) == 6
    assert all(len(gz) == 32 and len(raw) == 32 for gz, raw in SMALLNORB_FILES.values())
    # The training and testing category files are identical once unpacked.
    training, testing = (
        SMALLNORB_FILES[f"smallnorb-5x{ids}x9x18x6x2x96x96-{split}-cat.mat"][1]
        for ids, split in [("46789", "training"), ("01235", "testing")]
    )
    assert training == testing
