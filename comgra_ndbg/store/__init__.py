"""The recording's file format: schema, catalog, segment files, writer and reader (the only h5py users)."""
__all__ = ["open_recording", "list_trials", "Recording", "Snapshot", "Note"]


def __getattr__(name: str) -> object:
    """The reader's names, imported when first asked for: the writer's modules (imported by the recorder)
    do not need the reader."""
    if name in __all__:
        from comgra_ndbg.store import reader

        value = getattr(reader, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'comgra_ndbg.store' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
