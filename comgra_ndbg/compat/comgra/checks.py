"""Comgra's rules for its arguments, as typed errors, and the warning for arguments without an equivalent.

Comgra rejects misuse with bare ``assert`` statements; the layer rejects the same misuse with the
library's typed errors (``comgra_ndbg.errors``), whose messages say what Comgra requires and what to do.
Arguments that Comgra accepts but that have no equivalent here are accepted too and reported once per
recorder with a :class:`CompatibilityWarning`.
"""
from __future__ import annotations

import re
import warnings
from collections.abc import Iterable

from comgra_ndbg.errors import InvalidArgumentError

__all__ = ["CompatibilityWarning", "Warner", "check_type_of_execution", "check_prefixes", "check_tensor_name",
           "RECORDING_TYPES"]

RECORDING_TYPES = ("neuron", "kpis", "kpis_and_svd", "single_value")
_TYPE_OF_EXECUTION = re.compile(r"^[a-zA-Z0-9-_]+$")


class CompatibilityWarning(UserWarning):
    """A Comgra argument was accepted that has no equivalent here; the message says what happens instead."""


class Warner:
    """Emits each :class:`CompatibilityWarning` once per key (one recorder's run)."""

    def __init__(self) -> None:
        self._seen: set[str] = set()

    def once(self, key: str, message: str) -> None:
        if key not in self._seen:
            self._seen.add(key)
            warnings.warn(f"comgra_ndbg.compat.comgra: {message}", CompatibilityWarning, stacklevel=4)


def check_type_of_execution(value: object, call: str) -> str:
    """Comgra's rule for a type of execution: letters, digits, ``-`` and ``_``; not ``any_value``; no ``__``
    prefix.

    >>> check_type_of_execution("05_iterations", "start_batch")
    '05_iterations'
    """
    if not isinstance(value, str) or not _TYPE_OF_EXECUTION.match(value):
        raise InvalidArgumentError(f"{call}: type_of_execution must be a str of letters, digits, '-' and '_' (Comgra's "
                                   f"rule), got {value!r}; e.g. '05_iterations'")
    if value == "any_value" or value.startswith("__"):
        raise InvalidArgumentError(f"{call}: type_of_execution {value!r} is reserved by Comgra ('any_value' and names "
                                   f"starting with '__' have a special meaning in its GUI); choose another name")
    return value


def check_tensor_name(tensor_name: object, node_name: object) -> None:
    """Comgra's rules for the names given to ``register_tensor``."""
    if not isinstance(tensor_name, str) or not tensor_name:
        raise InvalidArgumentError(f"register_tensor: tensor_name must be a non-empty str, got {tensor_name!r}")
    if tensor_name.startswith("node__"):
        raise InvalidArgumentError(f"register_tensor: tensor_name {tensor_name!r} starts with 'node__', which Comgra "
                                   f"reserves for its node names; rename the tensor")
    if "*" in tensor_name:
        raise InvalidArgumentError(f"register_tensor: tensor_name {tensor_name!r} contains '*', which Comgra reserves "
                                   f"for references to older iterations; rename the tensor")
    if node_name is not None and (not isinstance(node_name, str) or not node_name or "*" in node_name):
        raise InvalidArgumentError(f"register_tensor({tensor_name!r}): node_name must be a non-empty str without '*', "
                                   f"got {node_name!r}")


def check_prefixes(visually: Iterable[str], in_nodes: Iterable[str]) -> tuple[list[str], list[str]]:
    """Comgra's consistency rules for ``prefixes_for_grouping_module_parameters_visually`` and ``..._in_nodes``:
    in each list a more specific prefix comes before a more general one, and every node prefix extends a
    visual one (the default visual prefix ``''`` counts, which Comgra 0.11.5 itself rejects by mistake).
    Returns both as lists.

    >>> check_prefixes(["root.pre", "root"], ["root.pre"])
    (['root.pre', 'root'], ['root.pre'])
    """
    visually, in_nodes = _strings(visually, "visually"), _strings(in_nodes, "in_nodes")
    for kind, prefixes in (("visually", visually), ("in_nodes", in_nodes)):
        for i, later in enumerate(prefixes):
            for earlier in prefixes[:i]:
                if later.startswith(earlier):
                    raise InvalidArgumentError(
                        f"prefixes_for_grouping_module_parameters_{kind}: {earlier!r} comes before the more specific "
                        f"{later!r}; Comgra requires more specific prefixes first, so list {later!r} earlier")
    for prefix in in_nodes:
        if not prefix:
            raise InvalidArgumentError("prefixes_for_grouping_module_parameters_in_nodes: '' would make every "
                                       "parameter one node without a name; give module prefixes such as "
                                       "'model.encoder'")
        if not any(prefix.startswith(v) for v in visually):
            raise InvalidArgumentError(f"prefixes_for_grouping_module_parameters_in_nodes: {prefix!r} extends none of "
                                       f"the visual prefixes {visually}; Comgra requires a less specific visual prefix "
                                       f"for every node prefix (add {prefix!r} to the visual ones)")
    return visually, in_nodes


def _strings(prefixes: Iterable[str], kind: str) -> list[str]:
    if isinstance(prefixes, str):
        raise InvalidArgumentError(f"prefixes_for_grouping_module_parameters_{kind} must be a list of str, got the "
                                   f"str {prefixes!r}; write [{prefixes!r}]")
    out = list(prefixes)
    if not all(isinstance(p, str) for p in out):
        raise InvalidArgumentError(f"prefixes_for_grouping_module_parameters_{kind} must be a list of str, got {out!r}")
    return out
