"""Checks of the recorder's arguments, at the call, so that nothing invalid reaches the file.

What the store cannot hold must be refused where the user makes the mistake, with a typed error that says
what to do: a NUL character in a name or a note (HDF5 strings end at NUL, and one bad row used to fail every
later write of the recording), text that is not valid Unicode, a step number beyond int64, a flush interval
that is not a number. Checked once per call (names already known skip the check), so the hot path stays
lean. ``summarizable`` tells a tensor without readable values (meta, nested) from one that merely needs
converting (sparse, quantized): the first is skipped and logged, never a failure of the whole step.
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch

from comgra_ndbg.errors import InvalidArgumentError

__all__ = ["MAX_STEP", "check_name", "check_text", "check_step", "check_int", "check_positive_number",
           "check_group_path", "check_settings", "summarizable", "check_parameter_groups", "check_bounds"]

MAX_STEP = 2**63 - 1
"""The largest step number the file's int64 tables hold."""


def check_text(what: str, text: object) -> str:
    """``text`` if it is a str the recording can store: no NUL character, valid Unicode (no lone surrogate).

    >>> check_text("a note", "lr lowered to 1e-4")
    'lr lowered to 1e-4'
    >>> check_text("a note", "a" + chr(0) + "b")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    comgra_ndbg.errors.InvalidArgumentError: a note must not contain a NUL character ...
    """
    if not isinstance(text, str):
        raise InvalidArgumentError(f"{what} must be a str, got {type(text).__name__} ({text!r:.60})")
    if "\0" in text:
        raise InvalidArgumentError(f"{what} must not contain a NUL character ('\\x00'), got {text!r:.80}; HDF5 "
                                   f"strings end at NUL, so remove it (e.g. text.replace('\\0', ''))")
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidArgumentError(f"{what} holds a lone surrogate ({text!r:.80}), which is not valid Unicode "
                                       f"and cannot be stored as UTF-8; decode the text properly first") from None
    return text


def check_name(name: object, what: str = "names") -> str:
    """A tensor, node, KPI, step type or gradient set name: a non-empty str the recording can store."""
    if not isinstance(name, str) or not name:
        raise InvalidArgumentError(f"{what} must be non-empty strings, got {name!r}")
    if name.isascii() and "\0" not in name:  # the usual name, checked on every step: no message built
        return name
    return check_text(f"name {name[:40]!r}", name)


def check_bounds(name: str, bounds: object) -> tuple[float, float]:
    """``register_tensor``'s explicit ``bounds`` as ``(low, high)`` floats: two finite real numbers, low below
    high (a tuple or a list). What else reached the catalog failed every later write of the recording.

    >>> check_bounds("act", [0, 1])
    (0.0, 1.0)
    >>> check_bounds("act", (1.0, 0.0))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    comgra_ndbg.errors.InvalidArgumentError: bounds of 'act' must be (low, high) with low < high, both finite, ...
    """
    pair = tuple(bounds) if isinstance(bounds, (tuple, list)) else None
    if (pair is None or len(pair) != 2 or not all(isinstance(v, numbers.Real) and not isinstance(v, bool)
                                                  for v in pair)):
        raise InvalidArgumentError(f"bounds of {name!r} must be a (low, high) pair of numbers, 'auto' or None, got "
                                   f"{bounds!r:.60}; e.g. bounds=(-1.0, 1.0) for a tanh output")
    low, high = float(pair[0]), float(pair[1])
    if not (math.isfinite(low) and math.isfinite(high) and low < high):
        raise InvalidArgumentError(f"bounds of {name!r} must be (low, high) with low < high, both finite, got "
                                   f"{bounds!r:.60}; they are the range the activation's outputs saturate at")
    return low, high


def check_step(step: object) -> int:
    """A step number: an int in ``[0, 2**63 - 1]`` (not a bool, not a float)."""
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
        raise InvalidArgumentError(f"step must be a non-negative int, got {step!r}")
    if step > MAX_STEP:
        raise InvalidArgumentError(f"step {step} does not fit the recording's int64 step numbers (at most "
                                   f"2**63 - 1 = {MAX_STEP}); count steps from 0")
    return int(step)


def check_int(what: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise InvalidArgumentError(f"{what} must be an int >= {minimum}, got {value!r}")


def check_positive_number(what: str, value: object) -> float:
    """A real number > 0 (``math.inf`` allowed: never), e.g. a flush interval in seconds."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or math.isnan(value) or value <= 0:
        raise InvalidArgumentError(f"{what} must be a number > 0 (seconds; math.inf for never), got {value!r}")
    return float(value)


def check_group_path(path: object) -> Path:
    """The group folder given to ``Recorder``: a non-empty str or ``os.PathLike``."""
    if isinstance(path, bytes) or not isinstance(path, (str, Path)) and not hasattr(path, "__fspath__"):
        raise InvalidArgumentError(f"path must be the folder to record into (a str or pathlib.Path), got "
                                   f"{type(path).__name__} ({path!r:.60}); e.g. Recorder('runs', trial='baseline')")
    if isinstance(path, str) and not path:
        raise InvalidArgumentError("path must not be empty; pass the folder to record into, e.g. 'runs'")
    check_text("path", str(Path(path)))
    return Path(path)


def check_settings(*, num_samples: object, max_elements: object, saturation_margin: object, record_updates: object,
                   flush_every_seconds: object, flush_every_steps: object) -> float:
    """The ``Recorder``'s numeric settings, checked at construction; returns the flush interval as a float."""
    check_int("num_samples", num_samples, minimum=0)
    check_int("max_elements", max_elements, minimum=1)
    if (isinstance(saturation_margin, bool) or not isinstance(saturation_margin, numbers.Real)
            or not 0 <= saturation_margin < 0.5):
        raise InvalidArgumentError(f"saturation_margin must be in [0, 0.5) (a number), got {saturation_margin!r}")
    if flush_every_steps is not None:
        check_int("flush_every_steps", flush_every_steps, minimum=1)
    if not isinstance(record_updates, (bool, np.bool_)):
        raise InvalidArgumentError(f"record_updates must be True or False, got {record_updates!r}")
    return check_positive_number("flush_every_seconds", flush_every_seconds)


def summarizable(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` in a form the reducer and snapshots can read: dense (a sparse tensor counts as the dense one
    it stands for), dequantized; raises ``ValueError`` saying why for a tensor without readable values.

    >>> summarizable(torch.ones(2, device="meta"))
    Traceback (most recent call last):
    ...
    ValueError: it is on the meta device, which holds shapes but no values
    """
    if tensor.is_meta:
        raise ValueError("it is on the meta device, which holds shapes but no values")
    if tensor.is_nested:
        raise ValueError("it is a nested tensor (its rows have different lengths); register its rows, or "
                         "torch.nested.to_padded_tensor(...) of it")
    if tensor.is_quantized:
        tensor = tensor.dequantize()
    if tensor.layout != torch.strided:
        tensor = tensor.to_dense()
    return tensor


def check_hyperparameters(hyperparameters: object) -> dict[str, object]:
    """The run's hyperparameters as stored in the recording's config: a mapping of names to numbers, strings,
    booleans or None (nested mappings flattened to ``outer.inner``), so a sweep can tabulate them.

    >>> check_hyperparameters({"lr": 0.01, "optim": {"name": "adam", "betas": 2}})
    {'lr': 0.01, 'optim.name': 'adam', 'optim.betas': 2}
    """
    if hyperparameters is None:
        return {}
    if not isinstance(hyperparameters, Mapping):
        raise InvalidArgumentError(f"hyperparameters must be a dict of names to values (e.g. {{'lr': 0.01}}), got "
                                   f"{type(hyperparameters).__name__}")
    flat: dict[str, object] = {}
    for name, value in hyperparameters.items():
        if not isinstance(name, str) or not name:
            raise InvalidArgumentError(f"hyperparameter names must be non-empty str, got {name!r}")
        if isinstance(value, Mapping):
            flat.update({f"{name}.{inner}": v for inner, v in check_hyperparameters(value).items()})
        elif value is None or isinstance(value, (bool, str, np.bool_)):
            flat[name] = value if not isinstance(value, np.bool_) else bool(value)
        elif isinstance(value, numbers.Real):
            flat[name] = int(value) if isinstance(value, numbers.Integral) else float(value)
        else:
            raise InvalidArgumentError(f"hyperparameter {name!r} is a {type(value).__name__}; use a number, str, "
                                       f"bool, None or a dict of those (e.g. str(value) for {value!r})")
    return flat


def check_parameter_groups(prefixes: Sequence[str]) -> list[str]:
    """The ``parameter_groups`` prefixes as stored in the recording's config: a list of non-empty str in
    which a more specific prefix comes before a more general one (a parameter belongs to the first that
    matches, so a later, more specific one would never get a parameter).

    >>> check_parameter_groups(("model.attn_", "model"))
    ['model.attn_', 'model']
    """
    if isinstance(prefixes, str) or not isinstance(prefixes, Sequence):
        raise InvalidArgumentError(f"parameter_groups must be a list of name prefixes such as ['model.encoder'], "
                                   f"got {prefixes!r}")
    found = list(prefixes)
    if not all(isinstance(p, str) and p for p in found):
        raise InvalidArgumentError(f"parameter_groups must hold non-empty str, got {found!r}")
    for i, later in enumerate(found):
        for earlier in found[:i]:
            if later.startswith(earlier):
                raise InvalidArgumentError(f"parameter_groups: {earlier!r} comes before the more specific {later!r}, "
                                           f"which then matches no parameter; list {later!r} first")
    return found
