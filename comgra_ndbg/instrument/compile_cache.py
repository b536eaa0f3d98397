"""Compiled code traced without NeuralDbg's hooks, dropped so that the next call traces them.

``torch.compile`` caches the code it made per Python function (a module class's ``forward``, or its own
wrapper for ``torch.nn`` classes), guarded on what the trace read; it does not guard on module hooks
(``torch._dynamo.config.skip_nnmodule_hook_guards``). Code traced for a model before ``NeuralDbg``
hooked it — the same model called compiled earlier, or *another instance of the same class* compiled
earlier in the process — passes the guards of the hooked model and runs without the hooks: no module
output, gradient or edge would be recorded. :func:`evict_compiled_code` drops that cached code for the
functions the model's modules run, so their next compiled call traces them again, hooks included.

Other models whose classes share those functions (the earlier instance) lose their cached code too and
are traced once more at their next call: one recompilation each, the same code, nothing else changes.
"""
from __future__ import annotations

from types import CodeType

import torch
from torch import nn

__all__ = ["evict_compiled_code"]


def evict_compiled_code(root: nn.Module) -> int:
    """Drop ``torch.compile``'s cached code of every function ``root``'s modules run compiled; returns how
    many functions had some. Nothing happens (0) where this torch has no such cache."""
    frames = getattr(getattr(torch._C, "_dynamo", None), "eval_frame", None)
    entries = getattr(frames, "_debug_get_cache_entry_list", None)
    reset = getattr(frames, "reset_code", None)
    if entries is None or reset is None:
        return 0
    evicted = 0
    for code in _compiled_functions(root):
        try:
            if entries(code):
                reset(code)
                evicted += 1
        except (RuntimeError, TypeError):  # not a function torch.compile handles
            continue
    return evicted


def _compiled_functions(root: nn.Module) -> list[CodeType]:
    """The code objects torch.compile may have cached code for, when it compiled ``root`` or a part of it:
    each module class's ``forward`` and the wrapper ``torch.compile`` puts around ``torch.nn`` classes."""
    codes: dict[CodeType, None] = {}
    for module in root.modules():
        code = getattr(type(module).forward, "__code__", None)
        if code is not None:
            codes[code] = None
    try:
        from torch._dynamo import external_utils
        wrapper = external_utils.wrap_inline.__code__
        codes.update((const, None) for const in wrapper.co_consts if isinstance(const, CodeType))
    except (ImportError, AttributeError):  # a torch without this wrapper inlines nothing of its own
        pass
    return list(codes)
