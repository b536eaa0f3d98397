"""The ``comgra-ndbg`` command: one subcommand per task, each in its own small ``_add_*`` function.

To add a subcommand (``demo``, ``explain``, ``export``, ...), write ``_add_<name>(subparsers)`` that
creates its parser and sets ``handler`` to a function ``(args) -> exit code``, and append it to
:data:`SUBCOMMANDS`. Library errors (:class:`~comgra_ndbg.errors.ComgraError`) are printed as one line
and exit with status 2; nothing else is caught.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

from comgra_ndbg import __version__
from comgra_ndbg.errors import ComgraError

__all__ = ["build_parser", "main"]


def _gui(args: argparse.Namespace) -> int:
    from comgra_ndbg.gui.app import create_app, serve

    app = create_app(args.path, visualization_file=args.visualization_file, interval_ms=args.refresh_ms)
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
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    parser.add_argument("--visualization-file", metavar="FILE",
                        help="Python file defining visualize(recording, selection) for the Custom tab")
    parser.add_argument("--refresh-ms", type=int, default=2000,
                        help="how often to look for steps written since (default 2000)")
    parser.set_defaults(handler=_gui)


def _info(args: argparse.Namespace) -> int:
    from comgra_ndbg.store.reader import list_trials, open_recording

    for trial in list_trials(args.path):
        with open_recording(args.path, trial) as recording:
            steps = recording.steps
            span = f"steps {int(steps.min())}–{int(steps.max())}" if len(steps) else "no step yet"
            print(f"trial {trial}: {len(steps)} recorded {span}, "
                  f"{'complete' if recording.is_complete else 'live (still being written)'}")
            for step_type in recording.step_types:
                print(f"  step type {step_type}: {len(recording.steps_of_type(step_type))} steps")
            print(f"  {len(recording.nodes)} nodes, {len(recording.tensors)} tensors, kinds "
                  f"{', '.join(recording.kinds())}")
            if recording.kpi_names:
                print(f"  KPIs: {', '.join(recording.kpi_names)}")
            if recording.notes:
                print(f"  {len(recording.notes)} notes")
    return 0


def _add_info(subparsers: Any) -> None:
    parser = subparsers.add_parser("info", help="summarize what a recording holds",
                                   description="Print trials, steps, step types, nodes and KPIs of a recording.")
    parser.add_argument("path", help="group folder, trial folder or .h5 file")
    parser.set_defaults(handler=_info)


SUBCOMMANDS: list[Callable[[Any], None]] = [_add_gui, _add_info]


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
        return int(args.handler(args))
    except ComgraError as error:
        print(f"comgra-ndbg {args.command}: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
