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
``snapshot/shape`` and the writer's lock file.

Version 3 appended the three sample-spread fields to ``STAT_FIELDS`` (rows of 17 fields instead of 14) and
changed nothing else. Readers read versions 1, 2 and 3: ``pad_fields`` widens the rows of older files with
the merge identity, so the statistics derived from the missing fields come out NaN (unknown) there.

Version 4 added the optional profiling tables ``profile/*`` (per module and profiled step) and
``process/*`` (per step: wall time and memory), written only by a recorder with ``profile=``; files of
versions 1 to 3 simply have no profile, and nothing else changed.
"""
from __future__ import annotations

import numpy as np

from comgra_ndbg.stats import fields as _fields

FORMAT_VERSION = 4
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
ATTR_PARTS = "parts"  # int64 array, on the complete file of a recording close() left in several files: their sequences
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
SENTINEL_REASON = "tiers: sentinel step (parameter values and gradients)"
"""How a sentinel step's reason begins: a summary step holding only the parameters' values and gradients,
the model's inputs and KPIs (``recorder/sentinel_steps.py``); its module outputs are absent, not estimated."""

# ---- summaries: sufficient statistics, one row per (step, iteration) -------------------------------------
SUMMARY_STEP = "summary/step"  # int64 [rows]
SUMMARY_ITERATION = "summary/iteration"  # int32 [rows]
SUMMARY_DATA = "summary/data"  # float64 [series, fields, rows]; absent = the merge identity

# Each row holds the sufficient statistics of ``STAT_FIELDS``. The layout is defined (with the merge rule of
# every field) in ``comgra_ndbg/stats/fields.py``, next to the arithmetic that fills the rows; it is part of
# the format, so it is named here too, for the writer, the reader and docs/format.md.
STAT_FIELDS = _fields.STAT_FIELDS
FIELD = _fields.FIELD
NUM_FIELDS = _fields.NUM_FIELDS
MIN_FIELDS = _fields.MIN_FIELDS
MAX_FIELDS = _fields.MAX_FIELDS
identity_row = _fields.identity_row
_IDENTITY = identity_row()


def pad_fields(data: np.ndarray, axis: int = -1) -> np.ndarray:
    """``data`` with its field axis widened to ``NUM_FIELDS``: rows written by an older format version (14
    fields in versions 1 and 2) get the merge identity's value of every field they lack, so the statistics
    derived from those fields come out NaN (unknown) rather than 0. Rows already ``NUM_FIELDS`` wide come back
    as they are.

    >>> old = np.ones((2, 14))
    >>> wide = pad_fields(old)
    >>> wide.shape, float(wide[0, FIELD["spread_count"]]), pad_fields(wide) is wide
    ((2, 17), 0.0, True)
    """
    axis %= data.ndim
    width = data.shape[axis]
    if width >= NUM_FIELDS:
        return data
    values = np.expand_dims(_IDENTITY[width:], tuple(i for i in range(data.ndim) if i != axis))
    shape = data.shape[:axis] + (NUM_FIELDS - width,) + data.shape[axis + 1:]
    return np.concatenate([data, np.broadcast_to(values, shape).astype(data.dtype)], axis=axis)


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
LOG_INVARIANT = "invariant"  # not a problem: a loop invariant NeuralDbg saw broken (detail: invariant, severity)
LOG_BUDGET = "budget"  # not a problem: what the byte budget skipped, shrank or dropped of the snapshots
LOG_REPLACED = "parameter_replaced"  # not a problem: a tracked module got a new parameter object (recorded from here)
LOG_CATEGORIES = PROBLEM_CATEGORIES + (LOG_RESUMED, LOG_INVARIANT, LOG_BUDGET, LOG_REPLACED)

# ---- modules tracked with track_module (cumulative) ------------------------------------------------------
MODULE_PATH = "modules/path"  # utf-8, e.g. "model.encoder.0"
MODULE_CLASS = "modules/class"  # utf-8, e.g. "Linear"
MODULE_PARAMETERS = "modules/parameters"  # int64: parameters directly owned by the module

# ---- dependency graph (cumulative; one entry per distinct structure) ------------------------------------
GRAPHS = "graphs"  # group; one utf-8 JSON dataset per structure hash: {"graph": ..., "positions": ...}
GRAPH_INDEX = "graph_index"  # utf-8 JSON: {step type: structure hash of its latest graph}

# ---- profiling (version 4; only with Recorder(profile=...)) -------------------------------------------------
# One row per (profiled step, module). Times are seconds, exclusive of the module's profiled children (a
# module's own work); memory in bytes; NaN where the device cannot measure a field (allocator deltas on CPU).
PROFILE_STEP = "profile/step"  # int64 [rows]
PROFILE_MODULE = "profile/module"  # utf-8 [rows]: module path, e.g. "model.encoder.0"
PROFILE_DATA = "profile/data"  # float64 [rows, len(PROFILE_FIELDS)]
PROFILE_FIELDS = (
    "calls",  # forward calls of the module in the step
    "forward_time",  # exclusive forward wall time (children's time taken out)
    "forward_inclusive",  # forward wall time including the children
    "backward_time",  # time of the autograd nodes the module's own forward created
    "saved_bytes",  # activation bytes the module's own ops keep for backward (saved tensors, parameters left out)
    "allocated_delta",  # device allocator: allocated bytes after minus before the forward call (CUDA)
    "peak_delta",  # device allocator: peak during the forward call minus allocated before (CUDA)
    "flops",  # exclusive forward FLOPs (torch.utils.flop_counter's formulas)
)
PROFILE_FIELD = {name: i for i, name in enumerate(PROFILE_FIELDS)}
# One row per step seen while profiling is on (memory is cheap: sampled every step, modules at their own policy).
PROCESS_STEP = "process/step"  # int64 [rows]
PROCESS_DATA = "process/data"  # float64 [rows, len(PROCESS_FIELDS)]
PROCESS_FIELDS = (
    "step_time",  # wall time from start_step to finish_step
    "rss",  # resident set size of the process after the step, bytes
    "device_allocated",  # device allocator's allocated bytes after the step (NaN on CPU)
    "device_peak",  # device allocator's peak allocated bytes (NaN on CPU)
    "profiled",  # 1 when the step's modules were profiled, else 0
)
PROCESS_FIELD = {name: i for i, name in enumerate(PROCESS_FIELDS)}

ROLES = ("input", "target", "output", "loss", "parameter", "intermediate")

SUMMARY_CHUNK_ROWS = 4096
CHUNK_ELEMENTS = 16384  # elements (whole rows) per chunk of every other table: the unit a checksum protects
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
