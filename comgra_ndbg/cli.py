"""The ``comgra-ndbg`` command: one subcommand per task, each in its own small ``_add_*`` function.

``demo`` records and explains a buggy and a fixed run, then serves the explorer; ``gui`` serves the
explorer for a recording; ``info`` says what a recording holds, whether its writer is live, finished or
was killed, and what it could not record; ``check`` verifies every file against its checksums, lists what
is damaged or missing and exits non-zero on damage (``--salvage`` copies the rest into a new recording);
``explain`` prints the ranked hypotheses and events (running the analysis when none is stored or it is
stale; ``--only`` one family, threshold overrides as a what-if, ``--reference GOOD`` checks against a
healthy run); ``export`` writes summaries, events and hypotheses as csv or json tables, or a TensorBoard
run per trial (``--to tensorboard DIR``); ``signature`` draws a failing run's failure signature as a PNG;
``sweep`` analyses many recordings on a Dask cluster and prints one row per trial; ``profile`` prints time
and memory per layer of a profiled run (these three in :mod:`comgra_ndbg.cli_reports`).

To add a subcommand, write ``_add_<name>(subparsers)`` that
creates its parser and sets ``handler`` to a function ``(args) -> exit code``, and append it to
:data:`SUBCOMMANDS`. Library errors (:class:`~comgra_ndbg.errors.ComgraError`) are printed as one line
and exit with status 2; nothing else is caught.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from comgra_ndbg import __version__
from comgra_ndbg.cli_reports import add_profile, add_signature, add_sweep, non_negative_int
from comgra_ndbg.errors import ComgraError

__all__ = ["build_parser", "main"]


def _refresh_ms(text: str) -> int:
    """An argparse ``type`` for ``--refresh-ms``: milliseconds between looks for new steps, at least 100 (a
    smaller interval makes the browser ask faster than a look takes)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected milliseconds, a whole number of 100 or more, got "
                                         f"{text!r}") from None
    if value < 100:
        raise argparse.ArgumentTypeError(f"expected milliseconds, a whole number of 100 or more, got {value}")
    return value


def _port(text: str) -> int:
    """An argparse ``type`` for ``--port``: a TCP port from 1 to 65535, refused while parsing (exit status 2) so
    that nothing is loaded or recorded for a port the explorer could never listen on. 0 ("any free port") is
    refused too: the explorer prints its address before serving, and Dash would serve 0 on its own 8050."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number from 1 to 65535, got {text!r}") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number from 1 to 65535, got {port}")
    return port


def _gui(args: argparse.Namespace) -> int:
    from comgra_ndbg.gui.app import check_address, create_app, serve

    app = create_app(args.path, visualization_file=args.visualization_file, interval_ms=args.refresh_ms)
    check_address(args.host, args.port)
    print(f"comgra_ndbg explorer for {args.path} on http://{args.host}:{args.port}/ (Ctrl+C to stop)", flush=True)
    serve(app, host=args.host, port=args.port)
    return 0


def _add_gui(subparsers: Any) -> None:
    from comgra_ndbg.gui.app import DEFAULT_HOST, DEFAULT_PORT

    parser = subparsers.add_parser("gui", help="browse a recording in the web explorer",
                                   description="Serve the explorer for a group folder (trials selectable), a "
                                               "trial folder or one recording file.")
    parser.add_argument("path", help="folder given to Recorder(...), a trial folder inside it, or a .h5 file")
    parser.add_argument("--host", default=DEFAULT_HOST,
                        help=f"address to bind (default {DEFAULT_HOST}: this machine only)")
    parser.add_argument("--port", type=_port, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    parser.add_argument("--visualization-file", metavar="FILE",
                        help="Python file defining visualize(recording, selection) for the Custom tab")
    parser.add_argument("--refresh-ms", type=_refresh_ms, default=2000,
                        help="how often to look for steps written since (default 2000)")
    parser.set_defaults(handler=_gui)


_STATES = {"finished": "complete", "live": "live (still being written)",
           "killed": "killed (its writer stopped without closing; every flushed step is readable, mode='a' "
                     "continues it)",
           "incomplete": "incomplete (not consolidated: its writer was killed, failed to close, or is an older "
                         "version)"}


def _info(args: argparse.Namespace) -> int:
    from comgra_ndbg.store.reader import list_trials, open_recording

    sizes: dict[str, int] = {}
    damaged = False
    for trial in list_trials(args.path):
        with open_recording(args.path, trial, damaged="skip") as recording:
            steps = recording.steps
            if len(steps) > 1:
                span = f"{len(steps)} recorded steps {int(steps.min())}–{int(steps.max())}"
            else:
                span = f"1 recorded step ({int(steps[0])})" if len(steps) else "no recorded step yet"
            print(f"trial {trial}: {span}, {_STATES[recording.state]}")
            _print_ranks(recording)
            for step_type in recording.step_types:
                print(f"  step type {step_type}: {_plural(len(recording.steps_of_type(step_type)), 'step')}")
            kinds = recording.kinds()
            print(f"  {_plural(len(recording.nodes), 'node')}, {_plural(len(recording.tensors), 'tensor')}"
                  + (f", kinds {', '.join(kinds)}" if kinds else ""))
            if recording.kpi_names:
                print(f"  KPIs: {', '.join(recording.kpi_names)}")
            if recording.notes:
                print(f"  {len(recording.notes)} notes")
            _print_problems(recording.problems())
            _print_budget(recording.log("budget"))
            for damage in recording.damage:
                print(f"  DAMAGED: {damage.describe()}")
            if recording.damage:
                damaged = True
                print(f"  run `comgra-ndbg check {recording.location}` for the full list, `--salvage` to repair")
            sizes[trial] = _disk_size(recording.trial_folder)
    parts = ", ".join(f"{trial} {_human_size(size)}" for trial, size in sizes.items())
    print(f"on disk: {_human_size(sum(sizes.values()))} in {len(sizes)} trial{'s' * (len(sizes) != 1)} ({parts})")
    return 1 if damaged else 0


def _print_ranks(recording: Any) -> None:
    """The ranks of a distributed trial, one line each: recorded steps, writer state, DDP wrapping; what
    follows in the trial's lines describes the rank shown first."""
    if not recording.ranks:
        return
    print(f"  {_plural(len(recording.ranks), 'rank')} of world size {recording.world_size} (the lines "
          f"after these describe rank {recording.rank}; open_recording(..., rank=r) opens another)")
    for rank in recording.ranks:
        other = recording if rank == recording.rank else recording.with_rank(rank)
        try:
            steps = other.steps
            last = f", last step {int(steps.max())}" if len(steps) else ""
            wrapped = {True: ", DDP", False: ", no DDP", None: ""}[other.ddp_wrapped]
            print(f"    rank {rank}: {_plural(len(steps), 'recorded step')}{last}, {other.state}{wrapped}")
        finally:
            if other is not recording:
                other.close()


def _print_budget(entries: list) -> None:
    """What the byte budget left out, when it left out anything: its last log entry (the account written
    when the recorder closed, or the latest back-off of a run still going)."""
    detail = entries[-1].detail if entries else None
    if isinstance(detail, dict) and any(detail.get(key) for key in ("skipped", "dropped", "shrunk")):
        print(f"  budget: {entries[-1].message}")


def _print_problems(problems: list, shown: int = 5) -> None:
    """The problems log of a trial: counts per category and subject, then the first few entries."""
    if not problems:
        return
    counts: dict[tuple[str, str], int] = {}
    for entry in problems:
        counts[(entry.category, entry.subject)] = counts.get((entry.category, entry.subject), 0) + 1
    parts = [f"{category} {subject!r} ×{n}" if subject else f"{category} ×{n}"
             for (category, subject), n in counts.items()]
    print(f"  {_plural(len(problems), 'problem')} logged: " + ", ".join(parts))
    for entry in problems[:shown]:
        print(f"    step {entry.step}: {entry.message}")
    if len(problems) > shown:
        print(f"    ... {len(problems) - shown} more (Recording.problems())")


def _plural(count: int, noun: str) -> str:
    """``count`` and ``noun``, with an s unless there is exactly one.

    >>> _plural(1, "recorded step"), _plural(0, "node"), _plural(12, "tensor")
    ('1 recorded step', '0 nodes', '12 tensors')
    """
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _disk_size(location: Path) -> int:
    """Bytes of a recording: its file, or every file in its trial folder (segments, analysis results)."""
    if location.is_file():
        return location.stat().st_size
    return sum(p.stat().st_size for p in location.rglob("*") if p.is_file())


def _human_size(size: int) -> str:
    """``1536`` -> ``1.5 KiB``."""
    if size < 1024:
        return f"{size} B"
    value = size / 1024
    for unit in ("KiB", "MiB"):
        if value < 1024:
            return f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def _add_info(subparsers: Any) -> None:
    parser = subparsers.add_parser("info", help="summarize what a recording holds",
                                   description="Print trials, steps, step types, nodes, KPIs, the problems log, "
                                               "whether each trial is finished, live or was killed, damage found, "
                                               "and the size on disk of a recording.")
    parser.add_argument("path", help="group folder, trial folder or .h5 file")
    parser.set_defaults(handler=_info)


def _check(args: argparse.Namespace) -> int:
    from comgra_ndbg.store.check import check

    report = check(args.path, args.trial, salvage=args.salvage, out=args.out)
    print(report)
    return 0 if report.ok else 1


def _add_check(subparsers: Any) -> None:
    parser = subparsers.add_parser("check", help="verify a recording's checksums; list and salvage damage",
                                   description="Read every file of a recording chunk by chunk against its "
                                               "checksums, and list exactly which steps and tensors are damaged "
                                               "or missing (unreadable, truncated, foreign or deleted segment "
                                               "files). Exits 0 when everything is intact, 1 on damage, 2 when "
                                               "PATH is not a recording. --salvage copies everything still "
                                               "readable into a new trial <trial>-salvaged.")
    parser.add_argument("path", help="group folder, trial folder or .h5 file")
    parser.add_argument("--trial", help="check only this trial of a group folder")
    parser.add_argument("--salvage", action="store_true",
                        help="write everything readable of each damaged trial into a new trial beside it")
    parser.add_argument("--out", metavar="DIR", help="with --salvage and one trial: the trial folder to write")
    parser.set_defaults(handler=_check)


def _demo(args: argparse.Namespace) -> int:
    from comgra_ndbg.demo import BUGGY, run_demo

    result = run_demo(args.path, steps=args.steps)
    if args.no_gui:
        return 0
    from comgra_ndbg.gui.app import create_app, serve

    app = create_app(result.path)
    top = result.diagnoses[BUGGY].top
    mark = f"; in trial {BUGGY!r} the graph marks node {top.node!r}" if top is not None and top.node else ""
    print(f"comgra_ndbg explorer for {result.path} on http://{args.host}:{args.port}/ (Ctrl+C to stop){mark}",
          flush=True)
    serve(app, host=args.host, port=args.port)
    return 0


def _add_demo(subparsers: Any) -> None:
    from comgra_ndbg.demo import DEFAULT_STEPS
    from comgra_ndbg.gui.app import DEFAULT_HOST, DEFAULT_PORT

    parser = subparsers.add_parser("demo", help="record a buggy and a fixed run, explain both, open the GUI",
                                   description="Train a small network twice - once with a hidden bug (a ReLU on "
                                               "its output layer), once fixed - record both as trials of one "
                                               "group, print the analysis's explanation of each, then serve "
                                               "the explorer on them.")
    parser.add_argument("--path", help="group folder to record into (default: a fresh runs/demo-<time>)")
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS,
                        help=f"training steps per trial, at least 30 (default {DEFAULT_STEPS})")
    parser.add_argument("--no-gui", action="store_true", help="stop after printing the explanations")
    parser.add_argument("--host", default=DEFAULT_HOST,
                        help=f"address the explorer binds (default {DEFAULT_HOST}: this machine only)")
    parser.add_argument("--port", type=_port, default=DEFAULT_PORT, help=f"explorer port (default {DEFAULT_PORT})")
    parser.set_defaults(handler=_demo)


def _explain(args: argparse.Namespace) -> int:
    from comgra_ndbg.analysis import analyze
    from comgra_ndbg.errors import InvalidArgumentError
    from comgra_ndbg.explain import (OVERRIDDEN, SCHEMA, SCHEMA_VERSION, explain_text, only, overrides,
                                     thresholds_with, trial_record)
    from comgra_ndbg.export import current_diagnosis, json_safe
    from comgra_ndbg.store.reader import list_trials, open_recording

    if getattr(args, "reference", None) is not None:
        return _explain_against_reference(args)
    if getattr(args, "reference_trial", None) is not None:
        raise InvalidArgumentError(f"--reference-trial {args.reference_trial} names a trial of the healthy "
                                   f"reference run; pass that run with --reference GOOD too")
    changes = overrides(vanishing=args.vanishing_threshold, exploding=args.exploding_threshold,
                        activation=args.activation_threshold)
    trials = [args.trial] if args.trial is not None else list_trials(args.path)
    reports = []
    for trial in trials:
        with open_recording(args.path, trial) as recording:
            if changes:  # a what-if: printed only, the stored analysis stays as it is
                diagnosis, source = analyze(recording, store=False, thresholds=thresholds_with(changes)), OVERRIDDEN
            else:
                diagnosis, fresh = current_diagnosis(recording)
                source = "analysed now" if fresh else "stored"
        reports.append((trial, only(diagnosis, args.only), source))
    if args.json:
        print(json.dumps(json_safe({"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "path": str(args.path),
                                    "only": args.only, "overrides": changes,
                                    "trials": [trial_record(d, source=source) for _, d, source in reports]}),
                         indent=1, allow_nan=False))
        return 0
    if changes:
        print("thresholds overridden: " + ", ".join(f"{k}={v:g}" for k, v in changes.items())
              + " (analysed again with them; the stored analysis is unchanged)")
    for trial, diagnosis, source in reports:
        print(explain_text(trial, diagnosis, source=source, max_events=args.max_events, family=args.only))
    return 0


def _explain_against_reference(args: argparse.Namespace) -> int:
    """``explain PATH --reference GOOD``: each trial analysed now and checked against the healthy reference run
    (nothing stored, since the result depends on the reference); the comparison's note closes each trial."""
    from comgra_ndbg.analysis import analyze
    from comgra_ndbg.explain import AGAINST_REFERENCE, SCHEMA, SCHEMA_VERSION, explain_text, only, trial_record
    from comgra_ndbg.export import json_safe
    from comgra_ndbg.store.reader import list_trials

    source = AGAINST_REFERENCE
    trials = [args.trial] if args.trial is not None else list_trials(args.path)
    reports = [(trial, only(analyze(args.path, trial=trial, reference=args.reference,
                                    reference_trial=args.reference_trial), args.only)) for trial in trials]
    if args.json:
        print(json.dumps(json_safe({"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "path": str(args.path),
                                    "reference": str(args.reference), "only": args.only, "overrides": {},
                                    "trials": [trial_record(d, source=source) for _, d in reports]}),
                         indent=1, allow_nan=False))
        return 0
    for trial, diagnosis in reports:
        print(explain_text(trial, diagnosis, source=source, max_events=args.max_events, family=args.only))
        for note in diagnosis.notes:
            print(f"  note: {note}")
    return 0


def _add_explain(subparsers: Any) -> None:
    parser = subparsers.add_parser("explain", help="why did training fail? ranked hypotheses and events",
                                   description="Print the ranked failure hypotheses and the events of each "
                                               "trial. The stored analysis is used when it covers every "
                                               "recorded step; otherwise the analysis runs now and is stored.")
    parser.add_argument("path", help="group folder, trial folder or .h5 file")
    parser.add_argument("--trial", help="explain only this trial of a group folder")
    parser.add_argument("--json", action="store_true",
                        help="print the diagnoses as JSON (schema comgra-ndbg-explain, see comgra_ndbg/explain.py)")
    parser.add_argument("--max-events", type=non_negative_int, default=20, metavar="N",
                        help="events listed per trial in the text output (default 20)")
    parser.add_argument("--reference", metavar="GOOD",
                        help="a recording of a healthy run of the same model: report where each trial first breaks "
                             "what held there (parameters that train or stay frozen, dtypes, input ranges, gradient "
                             "and update ratios between layers, Dropout modes)")
    parser.add_argument("--reference-trial", metavar="T", help="the trial of GOOD to compare with (a group folder)")
    _add_explain_filters(parser)
    parser.set_defaults(handler=_explain)


def _add_explain_filters(parser: argparse.ArgumentParser) -> None:
    """``explain``'s family filter and threshold overrides (:mod:`comgra_ndbg.explain`)."""
    from comgra_ndbg.explain import EXPLAIN_FAMILIES

    parser.add_argument("--only", choices=EXPLAIN_FAMILIES,
                        help="keep only the hypotheses and events of one family")
    overrides = parser.add_argument_group(
        "threshold overrides", "analyse again with these thresholds; the result is printed, never stored over "
                               "the stored analysis")
    overrides.add_argument("--vanishing-threshold", type=float, metavar="DECADES",
                           help="decades a gradient's ratio to the output's gradient must fall against its recent "
                                "history to be vanishing (default: enter_decades = 1)")
    overrides.add_argument("--exploding-threshold", type=float, metavar="DECADES",
                           help="decades that ratio must rise to be exploding (default: enter_decades = 1)")
    overrides.add_argument("--activation-threshold", type=float, metavar="SHARE",
                           help="share of units dead (or of elements saturated) that enters that state "
                                "(defaults 0.9 dead, 0.5 saturated)")


def _export(args: argparse.Namespace) -> int:
    from comgra_ndbg.export import export

    to, out = _export_target(args)
    if to == "tensorboard":
        return _export_tensorboard(args, out)
    out = out if out is not None else _default_export_folder(Path(args.path))
    written = export(args.path, out, to=to, trial=args.trial, statistics=args.stat)
    for path in written.values():
        print(path)
    return 0


EXPORT_FORMATS = ("csv", "json", "tensorboard")


def _export_target(args: argparse.Namespace) -> tuple[str, Path | None]:
    """``--to FORMAT [DIR]`` (and ``--out DIR``): the format and the folder asked for, if any."""
    from comgra_ndbg.errors import InvalidArgumentError

    to, *folders = args.to
    if to not in EXPORT_FORMATS:
        raise InvalidArgumentError(f"unknown export format {to!r}; choose one of {', '.join(EXPORT_FORMATS)}")
    if args.out is not None:
        folders.append(args.out)
    if len(folders) > 1:
        raise InvalidArgumentError(f"the export folder was given {len(folders)} times ({', '.join(folders)}); "
                                   f"give it once, as --to {to} DIR or as --out DIR")
    return to, Path(folders[0]) if folders else None


def _export_tensorboard(args: argparse.Namespace, out: Path | None) -> int:
    from comgra_ndbg.export_tensorboard import export_tensorboard

    path = Path(args.path)
    out = out if out is not None else (path.with_name(path.stem + "-tensorboard") if path.is_file()
                                       else path / "tensorboard")
    for run in export_tensorboard(path, out, trial=args.trial, statistics=args.stat).values():
        print(run)
    print(f"view with: tensorboard --logdir {out}")
    return 0


def _default_export_folder(path: Path) -> Path:
    """``<folder>/export`` for a group or trial folder, ``<stem>-export`` beside a single ``.h5`` file."""
    return path.with_name(path.stem + "-export") if path.is_file() else path / "export"


def _add_export(subparsers: Any) -> None:
    from comgra_ndbg.stats.statistics import STATISTICS

    parser = subparsers.add_parser("export", help="write summaries, events and hypotheses as csv or json, or a "
                                                  "TensorBoard run",
                                   description="Write tidy tables for analysis elsewhere: summaries (one row "
                                               "per trial, step, tensor, kind and statistic: columns trial, "
                                               "step, tensor, node, role, kind, statistic, value), events and "
                                               "hypotheses. csv: summaries.csv, events.csv, hypotheses.csv; "
                                               "json: export.json. Non-finite values are written as nan, inf, "
                                               "-inf. tensorboard: one TensorBoard run per trial in DIR "
                                               "(event files: tensorboard --logdir DIR).")
    parser.add_argument("path", help="group folder, trial folder or .h5 file")
    parser.add_argument("--to", nargs="+", required=True, metavar=("FORMAT", "DIR"),
                        help="output format: csv, json, or tensorboard (one TensorBoard run per trial: summary "
                             "statistics and KPIs as scalars, snapshots as histograms, the diagnosis as text; "
                             "default statistics: the ones the diagnosis reads most), optionally followed by "
                             "the folder to write into")
    parser.add_argument("--out", metavar="DIR", help="folder to write into (default: PATH/export, "
                                                     "PATH/tensorboard for tensorboard)")
    parser.add_argument("--trial", help="export only this trial of a group folder")
    parser.add_argument("--stat", nargs="+", choices=sorted(STATISTICS), metavar="STAT",
                        help=f"statistics to export (default: all of {', '.join(STATISTICS)})")
    parser.set_defaults(handler=_export)


SUBCOMMANDS: list[Callable[[Any], None]] = [_add_demo, _add_gui, _add_info, _add_check, _add_explain, _add_export,
                                            add_signature, add_sweep, add_profile]


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand of :data:`SUBCOMMANDS`."""
    parser = argparse.ArgumentParser(prog="comgra-ndbg", description="Record, browse and explain neural "
                                                                     "network training runs.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in SUBCOMMANDS:
        add(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    args = build_parser().parse_args(argv)
    try:
        status = int(args.handler(args))
        sys.stdout.flush()  # here, where a closed pipe can still be handled below
        return status
    except ComgraError as error:
        print(f"comgra-ndbg {args.command}: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader went away (``comgra-ndbg info runs | head``): stop quietly, as command-line tools do.
        # Point stdout at /dev/null so the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a tool killed by a closed pipe


if __name__ == "__main__":
    sys.exit(main())
