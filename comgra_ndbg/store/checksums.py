"""Checksums on everything a recording stores, and how datasets are written so that they carry them.

Three layers, so that no flipped byte goes unnoticed (see ``docs/format.md``, "Guarantees"):

- **Numeric data**: every non-empty numeric dataset is chunked with HDF5's Fletcher-32 filter, so HDF5 checks
  each chunk it reads and refuses a damaged one (h5py raises ``OSError``); any HDF5 reader does this, with
  no plugin.
- **Text**: variable-length strings live in HDF5's global heap, which no filter covers; each text dataset
  carries a CRC-32 of its strings in the attribute ``crc32`` (:func:`text_checksum`).
- **Metadata**: files are written with HDF5 1.10 object headers and superblock (``schema.LIBVER``), whose
  metadata blocks carry checksums of their own, so damaged attributes or dataset layouts are refused too.

Only the flush and merge paths pay for this (computing and checking checksums while writing and reading
files); a recorded step does no extra work.
"""
from __future__ import annotations

import math
import zlib
from collections.abc import Iterable

import h5py
import numpy as np

from comgra_ndbg.store import schema

__all__ = ["text_checksum", "write_dataset", "write_slabs", "decode_text", "text_intact", "chunk_rows"]

_STR = h5py.string_dtype("utf-8")


def text_checksum(values: Iterable[object]) -> int:
    """CRC-32 of a sequence of strings: their count, then each one UTF-8 encoded and NUL terminated (names,
    notes and messages never hold a NUL: the recorder refuses them).

    >>> text_checksum(["a", "b"]) == text_checksum(["a", "b"]), text_checksum(["ab"]) == text_checksum(["a", "b"])
    (True, False)
    """
    items = [_encoded(v) for v in values]
    crc = zlib.crc32(f"{len(items)}\0".encode())
    for item in items:
        crc = zlib.crc32(item + b"\0", crc)
    return crc


def _encoded(value: object) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode("utf-8")


def decode_text(data: object) -> np.ndarray:
    """Strings read from a text dataset (bytes or str, array or scalar) as an object array of str. Bytes that
    are not UTF-8 (a damaged heap) become U+FFFD, so that the checksum, not a decoding error, reports them."""
    array = np.asarray(data, dtype=object).reshape(-1)
    return np.array([v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v) for v in array], dtype=object)


def text_intact(dataset: h5py.Dataset, values: np.ndarray | None = None) -> bool:
    """Whether a text dataset's strings match its ``crc32`` attribute (True for files written before
    version 2, which have none). ``values`` are its already decoded strings, to save reading them again."""
    expected = dataset.attrs.get(schema.ATTR_CHECKSUM)
    if expected is None:
        return True
    if values is None:
        values = decode_text(dataset[()])
    return int(expected) == text_checksum(values.tolist())


def chunk_rows(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The chunk shape of a table of ``shape`` written with checksums: whole rows, as many as make
    ``CHUNK_ELEMENTS`` elements (or fewer, for a short table). A chunk is what HDF5 filters, checksums and
    compresses in one piece, in buffers of its own as large as the chunk: rows of 17 float64 fields
    (per-sample statistics) in chunks of 16 384 rows made writing them cost 2 MiB of memory more than
    chunks of 963 rows do.

    >>> chunk_rows((100, 3)), chunk_rows((40000,)), chunk_rows((50000, 17))
    ((100, 3), (16384,), (963, 17))
    """
    return (min(shape[0], max(1, schema.CHUNK_ELEMENTS // math.prod(shape[1:]))),) + tuple(shape[1:])


def write_dataset(f: h5py.File, path: str, data: np.ndarray | str, *, text: bool) -> None:
    """Create dataset ``path`` holding ``data`` with its checksum: a ``crc32`` attribute for text, the
    Fletcher-32 filter (on chunks, with gzip where it pays) for numbers."""
    if text:
        if isinstance(data, str):  # a scalar string (a graph's JSON)
            dataset = f.create_dataset(path, data=data, dtype=_STR)
            dataset.attrs[schema.ATTR_CHECKSUM] = np.int64(text_checksum([data]))
            return
        values = np.asarray(data, dtype=object).reshape(-1)
        dataset = f.create_dataset(path, data=values, dtype=_STR)
        dataset.attrs[schema.ATTR_CHECKSUM] = np.int64(text_checksum(values.tolist()))
        return
    if data.size == 0:  # nothing to protect; HDF5 cannot chunk an empty dataset
        f.create_dataset(path, data=data)
        return
    f.create_dataset(path, data=data, **_layout(path, data.shape))


def write_slabs(f: h5py.File, path: str, shape: tuple[int, ...], dtype: np.dtype, slabs: Iterable[np.ndarray]) -> None:
    """Create dataset ``path`` of ``shape`` and ``dtype`` as ``write_dataset`` creates it for such an array,
    written from ``slabs``, its consecutive pieces along the first axis: an array that is never put
    together in one piece. Pieces of whole chunks (``chunk_rows``) are written as one write would."""
    if math.prod(shape) == 0:  # as ``write_dataset`` writes an empty array
        f.create_dataset(path, data=np.zeros(shape, dtype))
        return
    dataset = f.create_dataset(path, shape=shape, dtype=dtype, **_layout(path, shape))
    start = 0
    for slab in slabs:
        dataset[start:start + len(slab)] = slab
        start += len(slab)


def _layout(path: str, shape: tuple[int, ...]) -> dict:
    """Chunks and filters of the numeric dataset ``path`` of ``shape`` (not empty)."""
    kwargs: dict = dict(fletcher32=True)
    if path == schema.SUMMARY_DATA:
        kwargs.update(chunks=(1, shape[1], min(shape[2], schema.SUMMARY_CHUNK_ROWS)),
                      compression=schema.COMPRESSION, compression_opts=schema.COMPRESSION_LEVEL, shuffle=True)
    else:
        kwargs.update(chunks=chunk_rows(shape))
        if math.prod(shape) > 65536 and path != schema.VALUE_POOL:  # element values barely compress: stored raw
            kwargs.update(compression=schema.COMPRESSION, compression_opts=schema.COMPRESSION_LEVEL, shuffle=True)
    return kwargs
