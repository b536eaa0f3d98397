"""``python -m comgra_ndbg.recorder.native.build``: build the module for this machine's key (the background
build that ``taps_module`` starts under ``COMGRA_NDBG_NATIVE=auto``); exits 0 once it is there, 1 when the build
failed (recorded beside it)."""
from __future__ import annotations

import sys

from comgra_ndbg.recorder import native
from comgra_ndbg.stats import backend


def main() -> int:
    where = native._folder()
    try:
        if native._module_file(where) is None:
            native._build(where)
    except (backend.BuildError, OSError) as error:
        print(error, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
