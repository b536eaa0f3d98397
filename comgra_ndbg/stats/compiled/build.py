"""Build the compiled kernels ahead of time into one extension module, with numba's ``pycc``.

A process that loads that module runs the kernels without importing numba or llvmlite, which (with the
kernels loaded through numba's JIT) add about 110 MiB to a training process; the module itself maps about
1 MB. It is built for this machine's CPU (its model and the features it reports, as the JIT compiles), so it is
kept per machine, not shipped: ``stats.backend`` builds it on first use by running this module in a process
of its own and keeps it in its cache folder.

Usage: ``python -m comgra_ndbg.stats.compiled.build FOLDER`` writes ``FOLDER/<MODULE_NAME><suffix>``.
"""
from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

__all__ = ["MODULE_NAME", "build"]

MODULE_NAME = "comgra_ndbg_kernels"
"""The name the extension module is built and imported under."""


def build(folder: Path) -> Path:
    """Compile every entry of ``entries.SIGNATURES`` into ``folder``; returns the module's path."""
    with warnings.catch_warnings():  # pycc is marked for replacement; it is what builds a numba-free module today
        warnings.simplefilter("ignore")
        from numba.core.codegen import AOTCPUCodegen
        from numba.pycc import CC

        from comgra_ndbg.stats.compiled.entries import SIGNATURES

        # pycc takes the CPU's name and the instruction sets that name implies; the JIT takes the features
        # this CPU reports (a virtual machine may hide some its model has). The same features here: the
        # same machine code as the JIT, and no instruction this CPU lacks.
        AOTCPUCodegen._customize_tm_features = AOTCPUCodegen._get_host_cpu_features

        compiler = CC(MODULE_NAME)
        compiler.output_dir = str(folder)
        compiler.target_cpu = "host"
        compiler.verbose = False
        for name, (function, signature) in SIGNATURES.items():
            compiler.export(name, signature)(function.py_func)
        compiler.compile()
    found = sorted(folder.glob(f"{MODULE_NAME}.*"))
    if not found:
        raise RuntimeError(f"numba's pycc wrote no module {MODULE_NAME} into {folder}")
    return found[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="where the module is written (created if missing)")
    args = parser.parse_args(argv)
    args.folder.mkdir(parents=True, exist_ok=True)
    print(build(args.folder))
    return 0


if __name__ == "__main__":
    sys.exit(main())
