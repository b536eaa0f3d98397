"""The writer's config as a reader sees it: the recorder's settings and the run's hyperparameters.

Every segment file carries the same ``config`` attribute (JSON, :data:`~comgra_ndbg.store.schema.ATTR_CONFIG`),
written by the :class:`~comgra_ndbg.store.writer.RecordingWriter` from what ``Recorder(...)`` was given; the
first readable one is used, so a damaged segment does not hide it.
"""
from __future__ import annotations

import json
from typing import Any

from comgra_ndbg.store import schema
from comgra_ndbg.store.damage import READ_ERRORS
from comgra_ndbg.store.fileview import FileView

__all__ = ["ConfigReading"]


class ConfigReading:
    """``config`` and ``hyperparameters`` of ``Recording``; not used on its own."""

    _views: dict[Any, FileView]

    @property
    def config(self) -> dict[str, Any]:
        """The recorder's settings stored with the recording (policies, sample counts, ``hyperparameters``);
        ``{}`` when its files hold none."""
        for view in sorted(self._views.values(), key=lambda v: v.sequence):
            try:
                text = view.file.attrs.get(schema.ATTR_CONFIG)
                found = json.loads(text.decode() if isinstance(text, bytes) else str(text)) if text is not None else None
            except READ_ERRORS:
                continue
            if isinstance(found, dict):
                return found
        return {}

    @property
    def hyperparameters(self) -> dict[str, Any]:
        """The ``hyperparameters`` given to ``Recorder(...)``, flattened to ``outer.inner`` names (``{}`` when
        none were)."""
        found = self.config.get("hyperparameters")
        return dict(found) if isinstance(found, dict) else {}
