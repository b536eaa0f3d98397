"""IEEE-754 bit patterns inside compiled kernels: a float seen as an integer of the same width, and back.

Integer minimum, maximum and bitwise operations vectorise where NaN-aware float ones do not, so the summary
kernels (``moments``, ``units``) read extremes and zeros off the bit patterns: for non-negative
floats the signed pattern orders like the value, for negative floats the unsigned one orders like the
magnitude, and ``abs(x)`` has the pattern 0 exactly when x is ±0.
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

__all__ = ["from_bits", "signed_bits", "unsigned_bits"]

_SIGNED = {types.float32: types.int32, types.float64: types.int64}
_UNSIGNED = {types.float32: types.uint32, types.float64: types.uint64}
_FLOAT = {types.int32: types.float32, types.uint32: types.float32,
          types.int64: types.float64, types.uint64: types.float64}


@intrinsic
def signed_bits(typingctx, x):  # noqa: ARG001 - numba's intrinsic signature
    """The bit pattern of a float as a signed integer of the same width."""
    if x not in _SIGNED:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(x.bitwidth))

    return _SIGNED[x](x), codegen


@intrinsic
def unsigned_bits(typingctx, x):  # noqa: ARG001
    """The bit pattern of a float as an unsigned integer of the same width."""
    if x not in _UNSIGNED:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.IntType(x.bitwidth))

    return _UNSIGNED[x](x), codegen


@intrinsic
def from_bits(typingctx, k):  # noqa: ARG001
    """The float whose bit pattern is the integer ``k``."""
    target = _FLOAT.get(k)
    if target is None:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(target))

    return target(k), codegen
