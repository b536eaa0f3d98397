"""Code that runs inside the training loop: policies, on-device reductions, snapshots, the Recorder."""
from comgra_ndbg.recorder.profile_config import ProfileConfig
from comgra_ndbg.recorder.recorder import Recorder, RecorderWarning

__all__ = ["Recorder", "RecorderWarning", "ProfileConfig"]
