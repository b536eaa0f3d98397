"""The recording's file format: schema, catalog, segment files, writer and reader (the only h5py users)."""
from comgra_ndbg.store.reader import Note, Recording, Snapshot, list_trials, open_recording

__all__ = ["open_recording", "list_trials", "Recording", "Snapshot", "Note"]
