"""The ``comgra-ndbg`` subcommands that report on finished recordings beyond ``explain``: ``signature`` (the
failure signature as a PNG), ``sweep`` (many recordings analysed on Dask, one row per trial) and
``profile`` (time and memory per layer). Each ``add_*`` creates its parser and sets its handler, as the
subcommands of :mod:`comgra_ndbg.cli` do; :func:`non_negative_int` and :func:`check_output_file` check
arguments of both modules before any work is done.
"""
from __future__ import annotations

import argparse
import os
import sys
from contextlib import ExitStack
from pathlib import Path
from typing import Any

__all__ = ["add_signature", "add_sweep", "add_profile", "check_output_file", "non_negative_int"]


def non_negative_int(text: str) -> int:
    """An argparse ``type`` for counts of things listed (``--limit``, ``--max-events``): a whole number of 0 or
    more, refused while parsing (exit status 2) since a negative count would cut the list from its end."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of 0 or more, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number of 0 or more, got {value}")
    return value


def check_output_file(path: str, option: str) -> None:
    """Raise :class:`~comgra_ndbg.errors.InvalidArgumentError` when the file ``path`` (given as ``option``)
    cannot be written: it is a folder, or its folder is missing, not a folder or not writable. Checked before
    any analysis, so a mistyped output path is reported at once, in one line."""
    from comgra_ndbg.errors import InvalidArgumentError

    target = Path(path)
    folder = target.parent
    if target.is_dir():
        raise InvalidArgumentError(f"{option} {path} is a folder; name the file to write in it")
    if not folder.exists():
        raise InvalidArgumentError(f"{option} {path}: the folder {folder} does not exist; create it first")
    if not folder.is_dir():
        raise InvalidArgumentError(f"{option} {path}: {folder} is not a folder")
    if not os.access(folder, os.W_OK):
        raise InvalidArgumentError(f"{option} {path}: the folder {folder} is not writable")


def _signature(args: argparse.Namespace) -> int:
    from comgra_ndbg.errors import NoFailureError
    from comgra_ndbg.signature import signature_of, write_png

    check_output_file(args.out, "-o")
    try:
        signature = signature_of(args.path, trial=args.trial, steps=args.steps)
    except NoFailureError as healthy:
        print(f"comgra-ndbg signature: {healthy}", file=sys.stderr)
        return 1
    written = write_png(signature, args.out)
    print(f"{written}: trial {signature.trial}, {len(signature.layers)} layers × {len(signature.steps)} steps "
          f"({signature.steps[0]}–{signature.steps[-1]}), onset step {signature.onset}, origin "
          f"{signature.origin or signature.origin_kind!r}")
    return 0


def add_signature(subparsers: Any) -> None:
    from comgra_ndbg.analysis.signature import DEFAULT_STEPS

    parser = subparsers.add_parser("signature", help="draw the failure signature of a run as a PNG",
                                   description="Draw two log-scale heatmaps - per-layer gradient norms and "
                                               "activation norms over the recorded steps up to the failure - with "
                                               "the onset step and the origin layer marked and the top hypothesis "
                                               "as title. Exits 0 when written, 1 when the run has no failure "
                                               "(nothing to draw), 2 on bad input.")
    parser.add_argument("path", help="group folder (with --trial when it holds several), trial folder or .h5 file")
    parser.add_argument("-o", "--out", default="failure.png", metavar="PNG",
                        help="image file to write (default failure.png)")
    parser.add_argument("--trial", help="the trial of a group folder")
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS, metavar="N",
                        help=f"recorded steps shown, ending at the failure (default {DEFAULT_STEPS})")
    parser.set_defaults(handler=_signature)


def _sweep(args: argparse.Namespace) -> int:
    from comgra_ndbg.sweep import analyze_many

    if args.csv:
        check_output_file(args.csv, "--csv")
    with ExitStack() as stack:
        client = stack.enter_context(_scheduler_client(args.scheduler)) if args.scheduler is not None else None
        frame = analyze_many(args.paths, client=client, workers=args.workers, processes=not args.threads,
                             progress=True)
    print(frame.drop(columns=["hypothesis"]).to_string(index=False))
    if args.csv:
        frame.to_csv(args.csv, index=False)
        print(f"{len(frame)} trials written to {args.csv}")
    failed = int((frame["error"] != "").sum())
    if failed:
        print(f"{failed} of {len(frame)} trials could not be analysed (see the error column)", file=sys.stderr)
    return 1 if failed else 0


def _scheduler_client(address: str) -> Any:
    """A ``distributed.Client`` of the running scheduler at ``address``. One that cannot be reached (nothing
    listening within distributed's connect timeout, or not an address at all) raises
    :class:`~comgra_ndbg.errors.InvalidArgumentError` instead of distributed's own traceback."""
    from comgra_ndbg.errors import InvalidArgumentError
    from comgra_ndbg.sweep.runner import require

    distributed = require("distributed", "analysing many recordings")
    try:
        return distributed.Client(address)
    except (OSError, ValueError) as error:
        raise InvalidArgumentError(f"cannot reach the Dask scheduler at {address} ({error}): check that it is "
                                   f"running and its address (tcp://host:8786), or leave out --scheduler to "
                                   f"start a local cluster") from None


def add_sweep(subparsers: Any) -> None:
    parser = subparsers.add_parser("sweep", help="analyse many recordings on a Dask cluster, one row per trial",
                                   description="Analyse every trial the paths or glob patterns name (quote "
                                               "patterns: 'runs/*') on a Dask cluster and print one row per trial: "
                                               "top hypothesis type, origin, node, onset, confidence, final loss, "
                                               "steps and the hyperparameters each run stored. Exits 0, or 1 when "
                                               "some trial could not be analysed. Needs the sweep extra.")
    parser.add_argument("paths", nargs="+", metavar="GLOB", help="group folders, trial folders, .h5 files or globs")
    parser.add_argument("--scheduler", metavar="ADDR",
                        help="address of a running Dask scheduler (default: start a local cluster)")
    parser.add_argument("--workers", type=int, metavar="N",
                        help="local worker processes (default: one per CPU, at most one per trial)")
    parser.add_argument("--threads", action="store_true",
                        help="run the local workers as threads of this process: starts at once, but Python-bound "
                             "analysis does not run in parallel")
    parser.add_argument("--csv", metavar="OUT", help="also write the whole table (with the sentences) as csv")
    parser.set_defaults(handler=_sweep)


def _profile(args: argparse.Namespace) -> int:
    from comgra_ndbg.analysis.profile import profile_report
    from comgra_ndbg.store import schema
    from comgra_ndbg.store.reader import open_recording

    with open_recording(args.path, args.trial) as recording:
        tables = recording.profile()
        if tables.is_empty:
            print(f"{recording.trial}: no profile (record with NeuralDbg(model, profile=True))")
            return 1
        report = profile_report(tables.modules, tables.data, schema.PROFILE_FIELDS, tables.process_steps,
                                tables.process_field("rss"), tables.process_field("step_time"))
        print(f"{recording.trial}: {report.profiled_steps} profiled steps, median step "
              f"{report.step_time * 1e3:.4g} ms")
        if not tables.modules:
            print("no module was profiled, only step time and process memory: a Recorder(profile=...) profiles the "
                  "modules given to rec.profile_module(name, module) before the first step")
            print("\n".join(report.notes()))
        else:
            print(report.table(args.limit))
    return 0


def add_profile(subparsers: Any) -> None:
    parser = subparsers.add_parser("profile", help="time and memory per layer of a profiled run",
                                   description="Print each module's median exclusive forward and backward time, "
                                               "saved activation memory and FLOPs (hot layers marked *), and "
                                               "whether process memory leaks. Needs a recording made with "
                                               "profile=True.")
    parser.add_argument("path", help="group folder, trial folder or .h5 file")
    parser.add_argument("--trial", help="the trial of a group folder (default: the first)")
    parser.add_argument("--limit", type=non_negative_int, default=15, metavar="N", help="modules listed (default 15)")
    parser.set_defaults(handler=_profile)
