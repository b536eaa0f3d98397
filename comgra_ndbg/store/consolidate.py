"""Merging segment files into one, and consolidating a closed recording into files under a size cap.

A merge reads its inputs, concatenates them and writes the result under a final name before it deletes
them (``write_segment``: temporary name, fsync, rename), so a crash leaves at most inputs that the merged
file covers. It holds the inputs' smaller tables and their concatenation in memory; the value pools and
summary tables, most of a segment's bytes, are read from the inputs slab by slab as the merged file is
written (``file_tables``), and the merged file is built on disk (``disk_image``). Nothing merges more than
the writer's ``max_file_bytes`` of array bytes into one file.

``consolidate`` is what ``close()`` does with the files left: runs of neighbours under the cap
(``merger.group_under_cap``) each become one file, the last of them ``recording.h5`` (``complete``); when
there is more than one, its ``parts`` attribute lists every file's sequence, which is how a reader tells
a closed recording in several files from one still written (``live.consolidated``). A continued trial's
old ``recording.h5`` that is not merged with newer files is renamed into a part, as it is: an atomic rename,
no copy, whatever its size (its own ``complete`` and ``parts`` then say nothing; only the newest file's do).
"""
from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import h5py

from comgra_ndbg.store import schema
from comgra_ndbg.store.live import FINAL_LEVEL
from comgra_ndbg.store.merger import Segment, group_under_cap
from comgra_ndbg.store.paged_image import PAGE
from comgra_ndbg.store.segment import (concat, fsync_directory, read_segment, segment_name, temporary_image, write_file,
                                       write_segment)

__all__ = ["Attributes", "merge_files", "consolidate", "promote"]

Attributes = Callable[..., dict]
"""``attributes(sequence, covers, level, *, complete, parts)``: the root attributes of a file of the writer."""


def merge_files(directory: Path, inputs: list[Segment], level: int, attributes: Attributes, *,
                complete: bool = False, parts: tuple[int, ...] = ()) -> Segment:
    """Write one file of ``level`` holding ``inputs`` (``recording.h5`` with ``complete``, naming the
    recording's ``parts``), then delete them once it is in place; returns the new file. Holds their smaller
    tables in memory, and reads their value pools and summary tables as it writes them."""
    contents, covers = [], []
    for segment in inputs:
        with h5py.File(segment.path, "r", rdcc_nbytes=0) as f:
            contents.append(read_segment(f, lazy=True))
            covers.extend(int(v) for v in f.attrs[schema.ATTR_COVERS])
    sequence = max(segment.sequence for segment in inputs)
    out = directory / (schema.FINAL_NAME if complete else segment_name(sequence, level))
    merged = concat(contents)
    contents.clear()  # the merged copy is all that is needed from here on: one copy less at the peak
    write_segment(out, merged, attributes(sequence, tuple(sorted(covers)), level, complete=complete, parts=parts),
                  consume=True)
    for segment in inputs:
        if segment.path != out:
            segment.path.unlink(missing_ok=True)
    return Segment(sequence, out, sum(segment.nbytes for segment in inputs))


def consolidate(directory: Path, inputs: list[Segment], max_bytes: float, attributes: Attributes,
                merge: Callable[..., Segment] | None = None) -> None:
    """Turn the live files ``inputs`` (oldest first, at least one) into the closed recording: one
    ``recording.h5``, or, when they hold more than ``max_bytes``, one file per run of neighbours under it
    (a run of one file stays as it is), the last ``recording.h5`` naming them all in ``parts``. Each merge
    joins one run. ``merge(inputs, level, complete=..., parts=...)`` defaults to
    :func:`merge_files`."""
    if merge is None:
        def merge(run: list[Segment], level: int, **options: object) -> Segment:
            return merge_files(directory, run, level, attributes, **options)

    runs = group_under_cap(inputs, max_bytes)
    parts = tuple(run[-1].sequence for run in runs) if len(runs) > 1 else ()
    for run in runs[:-1]:
        if len(run) > 1:
            merge(run, FINAL_LEVEL)
        elif run[0].path.name == schema.FINAL_NAME:  # a continued trial's old final file: a part now
            os.replace(run[0].path, directory / segment_name(run[0].sequence, FINAL_LEVEL))
            fsync_directory(directory)
    if len(runs[-1]) == 1:
        promote(directory, runs[-1][0], attributes, parts=parts)
    else:
        merge(runs[-1], FINAL_LEVEL, complete=True, parts=parts)


def promote(directory: Path, segment: Segment, attributes: Attributes, *, parts: tuple[int, ...] = ()) -> None:
    """Make one file ``recording.h5``: its bytes with the attributes of the complete file, renamed into place
    (crash-safe like ``write_segment``), instead of reading and recompressing all of it. The copy is made
    in the temporary file, through a ``DiskImage`` as ``write_segment`` builds its files."""
    out = directory / schema.FINAL_NAME
    if segment.path == out and _names_parts(out, parts):  # a continued trial that recorded nothing new
        return
    with temporary_image(out) as image:
        with open(segment.path, "rb") as source:
            for page in iter(lambda: source.read(PAGE), b""):
                image.write(page)
        image.seek(0)
        with h5py.File(image, "r+") as f:
            covers = tuple(int(v) for v in f.attrs[schema.ATTR_COVERS])
            if schema.ATTR_PARTS in f.attrs:
                del f.attrs[schema.ATTR_PARTS]
            for key, value in attributes(segment.sequence, covers, FINAL_LEVEL, complete=True, parts=parts).items():
                f.attrs[key] = value
        write_file(out, image)
    if segment.path != out:
        segment.path.unlink(missing_ok=True)


def _names_parts(path: Path, parts: tuple[int, ...]) -> bool:
    """Whether ``path`` is a complete file naming exactly ``parts`` (none, for a recording in one file)."""
    with h5py.File(path, "r") as f:
        found = tuple(int(v) for v in f.attrs.get(schema.ATTR_PARTS, ()))
        return bool(f.attrs.get(schema.ATTR_COMPLETE, False)) and found == parts
