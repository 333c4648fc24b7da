"""The NORB binary matrix format (the smallNORB ``.mat`` files), read and written.

Layout (all little-endian): int32 magic (the element type), int32 ndim, then max(3, ndim) int32 dims
(padded with 1 when ndim < 3), then the elements in row-major order. smallNORB uses two types:
``*-dat.mat`` uint8 (N, 2, 96, 96) stereo pairs, ``*-cat.mat`` int32 (N,) categories and
``*-info.mat`` int32 (N, 4) instance, elevation, azimuth, lighting. Files may be gzipped.
"""

from __future__ import annotations

import gzip
import os
import struct
import zlib
from pathlib import Path

import numpy as np

from capsexp.errors import CorruptDatasetError

# The element types of the NORB format that smallNORB uses.
MAGIC_TO_DTYPE = {0x1E3D4C55: np.dtype("u1"), 0x1E3D4C54: np.dtype("<i4")}
DTYPE_TO_MAGIC = {dtype: magic for magic, dtype in MAGIC_TO_DTYPE.items()}
OTHER_MAGICS = {0x1E3D4C51: "float32", 0x1E3D4C52: "packed", 0x1E3D4C53: "float64", 0x1E3D4C56: "int16"}

# The six official files with the md5 of their .gz and of their content
# (from ../shared/data/README.md, which took them from two public loaders).
SMALLNORB_FILES = {
    "smallnorb-5x46789x9x18x6x2x96x96-training-dat.mat": (
        "66054832f9accfe74a0f4c36a75bc0a2",
        "8138a0902307b32dfa0025a36dfa45ec",
    ),
    "smallnorb-5x46789x9x18x6x2x96x96-training-cat.mat": (
        "23c8b86101fbf0904a000b43d3ed2fd9",
        "fd5120d3f770ad57ebe620eb61a0b633",
    ),
    "smallnorb-5x46789x9x18x6x2x96x96-training-info.mat": (
        "51dee1210a742582ff607dfd94e332e3",
        "19faee774120001fc7e17980d6960451",
    ),
    "smallnorb-5x01235x9x18x6x2x96x96-testing-dat.mat": (
        "e4ad715691ed5a3a5f138751a4ceb071",
        "e9920b7f7b2869a8f1a12e945b2c166c",
    ),
    "smallnorb-5x01235x9x18x6x2x96x96-testing-cat.mat": (
        "5aa791cd7e6016cf957ce9bdb93b8603",
        "fd5120d3f770ad57ebe620eb61a0b633",
    ),
    "smallnorb-5x01235x9x18x6x2x96x96-testing-info.mat": (
        "a9454f3864d7fd4bb3ea7fc3eb84924e",
        "7c5b871cc69dcadec1bf6a18141f5edc",
    ),
}


def _open(path: Path):
    return gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")


def read_header(path: str | os.PathLike) -> tuple[np.dtype, tuple[int, ...]]:
    """The element type and shape a NORB matrix file announces; validates the magic and the dims."""
    path = Path(path)
    try:
        with _open(path) as handle:
            head = handle.read(8)
            if len(head) < 8:
                raise CorruptDatasetError(f"{path}: truncated header ({len(head)} bytes)")
            magic, ndim = struct.unpack("<ii", head)
            if magic not in MAGIC_TO_DTYPE:
                kind = (
                    f"a {OTHER_MAGICS[magic]} matrix, not used by smallNORB"
                    if magic in OTHER_MAGICS
                    else "not a NORB matrix file"
                )
                raise CorruptDatasetError(f"{path}: magic {magic & 0xFFFFFFFF:#010x}: {kind}")
            if not 1 <= ndim <= 16:
                raise CorruptDatasetError(f"{path}: {ndim} dimensions announced, expected 1 to 16")
            raw_dims = handle.read(4 * max(3, ndim))
            if len(raw_dims) < 4 * max(3, ndim):
                raise CorruptDatasetError(f"{path}: truncated header (dimensions)")
    except (OSError, EOFError, zlib.error) as error:
        raise CorruptDatasetError(f"{path}: cannot read ({error}); the file is corrupted") from None
    dims = struct.unpack(f"<{max(3, ndim)}i", raw_dims)[:ndim]
    if any(dim < 0 for dim in dims):
        raise CorruptDatasetError(f"{path}: negative dimension in {dims}")
    return MAGIC_TO_DTYPE[magic], tuple(dims)


def read_matrix(path: str | os.PathLike, expected_shape: tuple[int | None, ...] | None = None) -> np.ndarray:
    """Read a NORB matrix file (plain or ``.gz``) into a numpy array, checking its exact size.

    ``expected_shape``: the shape the file must have; ``None`` entries match any size.
    Raises :class:`~capsexp.errors.CorruptDatasetError` naming the file on any mismatch.
    """
    path = Path(path)
    dtype, shape = read_header(path)
    if expected_shape is not None and (
        len(shape) != len(expected_shape)
        or any(e is not None and e != s for e, s in zip(expected_shape, shape, strict=True))
    ):
        raise CorruptDatasetError(f"{path}: shape {shape}, expected {expected_shape}")
    header_size = 8 + 4 * max(3, len(shape))
    expected_bytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    try:
        with _open(path) as handle:
            handle.seek(header_size)  # a forward seek: gzip files support it too
            payload = handle.read(expected_bytes + 1)
    except (OSError, EOFError, zlib.error) as error:
        raise CorruptDatasetError(f"{path}: cannot read ({error}); the file is truncated or corrupted") from None
    if len(payload) != expected_bytes:
        what = "truncated" if len(payload) < expected_bytes else "longer than its header announces"
        raise CorruptDatasetError(f"{path}: {what} ({len(payload)} data bytes, header announces {expected_bytes})")
    return np.frombuffer(payload, dtype=dtype).reshape(shape)


def write_matrix(path: str | os.PathLike, array: np.ndarray) -> Path:
    """Write ``array`` (uint8 or int32) as a NORB matrix file; gzipped when ``path`` ends in ``.gz``."""
    path = Path(path)
    array = np.ascontiguousarray(array)
    dtype = np.dtype("u1") if array.dtype == np.uint8 else np.dtype("<i4") if array.dtype.kind == "i" else None
    if dtype is None:
        raise ValueError(f"smallNORB files hold uint8 or int32, got {array.dtype}")
    dims = list(array.shape) + [1] * (3 - array.ndim)
    header = struct.pack(f"<ii{len(dims)}i", DTYPE_TO_MAGIC[dtype], array.ndim, *dims)
    data = header + array.astype(dtype, copy=False).tobytes()
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)
    return path
