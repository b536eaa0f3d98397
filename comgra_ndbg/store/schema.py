"""The recording's file format: names, field layout, dtypes and version, in one place.

Writer, reader, tests and ``docs/format.md`` all import these names, so a change of layout is a change
here (and a bump of ``FORMAT_VERSION``), never a string edited in several files.

A recording of one trial is a directory of HDF5 *segment* files. Each segment is written to a temporary
name, closed, flushed to disk and renamed, so a file that carries a final name is complete and never
written again. A merged segment lists, in its ``covers`` attribute, the sequence numbers of the segments
it replaces; readers ignore any segment covered by another. ``close()`` merges everything into
``recording.h5``. See ``docs/format.md``.

Version 2 added, without changing anything version 1 readers rely on: checksums (HDF5's Fletcher-32 filter
on every numeric dataset, a CRC-32 attribute on every text dataset, metadata checksums of the HDF5 1.10
object headers), the ``recording_id`` attribute that tells a trial's own files from foreign ones, the
append-only ``log`` table, float64 element values of float64 tensors, shapes of any rank in
``snapshot/shape`` and the writer's lock file. Readers read versions 1 and 2.
"""
from __future__ import annotations

import numpy as np

FORMAT_VERSION = 2
FORMAT_NAME = "comgra_ndbg.recording"

# ---- files -------------------------------------------------------------------------------------------
SEGMENT_PREFIX = "seg-"
SEGMENT_SUFFIX = ".h5"
TEMP_SUFFIX = ".tmp"
FINAL_NAME = "recording.h5"
LOCK_NAME = "writer.lock"  # held (flock) by the writing process; pid, host, heartbeat and last sequence inside
LIBVER = ("v110", "v110")  # HDF5 1.10 object headers and superblock: their metadata carries checksums

# ---- root attributes -----------------------------------------------------------------------------------
ATTR_FORMAT = "format"
ATTR_FORMAT_VERSION = "format_version"
ATTR_TRIAL = "trial"
ATTR_SEQUENCE = "sequence"  # this file's own sequence number (the largest it covers)
ATTR_COVERS = "covers"  # int64 array: sequence numbers whose content this file holds
ATTR_LEVEL = "level"  # 0 for a flushed segment, n+1 for a merge of level-n segments
ATTR_COMPLETE = "complete"  # True only on the file written by close()
ATTR_CREATED = "created"  # unix time the recorder was opened
ATTR_LIBRARY_VERSION = "library_version"
ATTR_CONFIG = "config"  # JSON of the recorder's settings
ATTR_RECORDING_ID = "recording_id"  # (version 2) the same in every file of one trial, kept when it is resumed
ATTR_CHECKSUM = "crc32"  # (version 2) dataset attribute of text datasets: see ``store/checksums.py``

# ---- tensor table: one row per recorded tensor name (cumulative, ids are stable across segments) ---
TENSORS = "tensors"
TENSOR_COLUMNS = ("name", "node", "role", "module", "dtype", "shape", "batched", "bounds_low", "bounds_high")

# ---- series table: one row per (tensor, kind); the id is the column index in the summary data -------
SERIES = "series"
SERIES_TENSOR = "series/tensor"  # int32 id into the tensor table
SERIES_KIND = "series/kind"  # utf-8 kind: value, grad, update, or grad:<gradient set>

KIND_VALUE = "value"
KIND_GRAD = "grad"
KIND_UPDATE = "update"
GRAD_SET_SEPARATOR = ":"

# ---- steps: one row per recorded step ------------------------------------------------------------------
STEPS = "steps"
STEPS_STEP = "steps/step"  # int64
STEPS_TYPE = "steps/type"  # int32 index into STEP_TYPES
STEPS_ITERATIONS = "steps/iterations"  # int32 number of iterations the step ran
STEPS_TIME = "steps/time"  # float64 unix time at finish_step
STEPS_FLAGS = "steps/flags"  # uint8 bit set, see FLAG_*
STEPS_REASON = "steps/reason"  # utf-8: why the step was recorded
STEP_TYPES = "step_types"  # utf-8 list, cumulative

FLAG_SUMMARY = 1
FLAG_SNAPSHOT = 2

# ---- summaries: sufficient statistics, one row per (step, iteration) -------------------------------------
SUMMARY_STEP = "summary/step"  # int64 [rows]
SUMMARY_ITERATION = "summary/iteration"  # int32 [rows]
SUMMARY_DATA = "summary/data"  # float64 [series, fields, rows]; absent = the merge identity

# Sufficient statistics. Every field merges across iterations, steps or devices by SUM, except MIN (min)
# and MAX (max). Moments cover the finite elements only; NaN and ±Inf are counted, never summed.
STAT_FIELDS = (
    "count",  # elements, finite or not
    "nan",  # NaN elements
    "inf",  # +Inf or -Inf elements
    "zeros",  # elements exactly 0
    "sum",  # Σx over finite elements
    "sum_sq",  # Σx² over finite elements
    "sum_abs",  # Σ|x| over finite elements
    "min",  # smallest finite element (+inf if none)
    "max",  # largest finite element (-inf if none)
    "units",  # units observed: non-batch positions of a batched tensor (0 for batch-less tensors)
    "dead_units",  # units that are exactly 0 for every sample of the batch
    "bounded",  # elements whose saturation bound is known (0 when no bound is known)
    "saturated",  # elements within the saturation margin of a bound
    "saturated_units",  # units saturated for every sample of the batch
)
FIELD = {name: i for i, name in enumerate(STAT_FIELDS)}
NUM_FIELDS = len(STAT_FIELDS)
MIN_FIELDS = (FIELD["min"],)
MAX_FIELDS = (FIELD["max"],)


def identity_row() -> np.ndarray:
    """The merge identity: what an absent tensor contributes (no elements, +inf min, -inf max)."""
    return _IDENTITY.copy()


_IDENTITY = np.zeros(NUM_FIELDS, dtype=np.float64)
_IDENTITY[FIELD["min"]] = np.inf
_IDENTITY[FIELD["max"]] = -np.inf


# ---- snapshots -------------------------------------------------------------------------------------------
# Pools hold the arrays of every snapshot in the segment back to back; the index says which slice is whose.
SNAP_STEP = "snapshot/step"  # int64 [snapshots]
SNAP_ITERATION = "snapshot/iteration"  # int32
SNAP_SERIES = "snapshot/series"  # int32 id into the series table
SNAP_SHAPE = "snapshot/shape"  # int64 [snapshots, max(MAX_RANK, largest rank)], -1 padded
SNAP_SAMPLES_OFFSET = "snapshot/samples_offset"  # int64 into the sample pools
SNAP_SAMPLES_COUNT = "snapshot/samples_count"  # int32 (0 for batch-less tensors)
SNAP_VALUES_OFFSET = "snapshot/values_offset"  # int64 into the value pool
SNAP_VALUES_COUNT = "snapshot/values_count"  # int64
SNAP_SUBSAMPLED = "snapshot/subsampled"  # bool: values are a strided selection; indices are stored
SNAP_INDEX_OFFSET = "snapshot/index_offset"  # int64 into the value-index pool (-1 when not subsampled)
SAMPLE_INDEX = "snapshot/sample_index"  # int64 [pool]: position of the sample in the batch
SAMPLE_CATEGORY = "snapshot/sample_category"  # utf-8 [pool]: the sample's category ("" when none was given)
SAMPLE_STATS = "snapshot/sample_stats"  # float64 [pool, NUM_FIELDS]: per-sample sufficient statistics
VALUE_POOL = "snapshot/values"  # float32 [pool] (float64 when a float64 tensor is in it): element values
VALUE_INDEX_POOL = "snapshot/value_index"  # int64 [pool]: flat element index (only for subsampled)
MAX_RANK = 8  # columns of snapshot/shape at least; a file with tensors of higher rank has more

# ---- KPIs and notes --------------------------------------------------------------------------------------
KPI_NAMES = "kpi_names"  # utf-8 list, cumulative
KPI_STEP = "kpi/step"  # int64
KPI_ID = "kpi/id"  # int32 index into KPI_NAMES
KPI_VALUE = "kpi/value"  # float64
KPI_STEP_TYPE = "kpi/type"  # int32 index into STEP_TYPES
NOTE_STEP = "notes/step"  # int64 (-1 when written outside a step)
NOTE_TIME = "notes/time"  # float64 unix time
NOTE_TEXT = "notes/text"  # utf-8

# ---- flight-recorder triggers ---------------------------------------------------------------------------
TRIGGER_STEP = "triggers/step"  # int64: the step at which a trigger fired
TRIGGER_REASON = "triggers/reason"  # utf-8: what fired, e.g. "non-finite values in 'block3' (grad)"

# ---- the log: append-only, step-level findings of the recorder (version 2) ---------------------------------
LOG_STEP = "log/step"  # int64: the step it concerns (-1 before the first step)
LOG_TIME = "log/time"  # float64 unix time
LOG_CATEGORY = "log/category"  # utf-8: one of LOG_CATEGORIES, or a category added later
LOG_SUBJECT = "log/subject"  # utf-8: what it is about (a tensor name, a trigger, a file), "" when nothing
LOG_MESSAGE = "log/message"  # utf-8: one sentence: what happened and what it means for the recording
LOG_DETAIL = "log/detail"  # utf-8: JSON object with details, "" when none

# Problems: something the run asked for is not (or not exactly) in the recording.
PROBLEM_SKIPPED_TENSOR = "skipped_tensor"  # a tensor (or its gradient) could not be summarised or snapshotted
PROBLEM_DROPPED_ROWS = "dropped_rows"  # recorded steps that never reached the disk
PROBLEM_STORAGE = "storage_error"  # a write, merge or consolidation failed (kept and retried)
PROBLEM_TRIGGER = "trigger_error"  # a flight-recorder trigger raised; it counted as not firing
PROBLEM_RECORDER = "recorder_error"  # a part of a step failed inside the recorder
PROBLEM_OVERFLOW = "overflow"  # a statistic overflowed float64 (e.g. Σx² of values near 1e300)
PROBLEM_DAMAGE = "damage"  # written by a salvage: what the damaged original had lost
PROBLEM_CATEGORIES = (PROBLEM_SKIPPED_TENSOR, PROBLEM_DROPPED_ROWS, PROBLEM_STORAGE, PROBLEM_TRIGGER,
                      PROBLEM_RECORDER, PROBLEM_OVERFLOW, PROBLEM_DAMAGE)
LOG_RESUMED = "resumed"  # not a problem: the trial was continued by a new writer (mode="a")
LOG_CATEGORIES = PROBLEM_CATEGORIES + (LOG_RESUMED,)

# ---- modules tracked with track_module (cumulative) ------------------------------------------------------
MODULE_PATH = "modules/path"  # utf-8, e.g. "model.encoder.0"
MODULE_CLASS = "modules/class"  # utf-8, e.g. "Linear"
MODULE_PARAMETERS = "modules/parameters"  # int64: parameters directly owned by the module

# ---- dependency graph (cumulative; one entry per distinct structure) ------------------------------------
GRAPHS = "graphs"  # group; one utf-8 JSON dataset per structure hash: {"graph": ..., "positions": ...}
GRAPH_INDEX = "graph_index"  # utf-8 JSON: {step type: structure hash of its latest graph}

ROLES = ("input", "target", "output", "loss", "parameter", "intermediate")

SUMMARY_CHUNK_ROWS = 4096
CHUNK_ELEMENTS = 16384  # rows per chunk of every other table: the unit a checksum protects
COMPRESSION = "gzip"
COMPRESSION_LEVEL = 1


def grad_kind(gradient_set: str | None) -> str:
    """Kind name of a gradient set: ``grad`` for the default set, ``grad:<set>`` for a named one.

    >>> grad_kind(None), grad_kind("aux_loss")
    ('grad', 'grad:aux_loss')
    """
    if gradient_set in (None, "", KIND_GRAD):
        return KIND_GRAD
    return f"{KIND_GRAD}{GRAD_SET_SEPARATOR}{gradient_set}"
