"""The benchmark commands that the README and the docs give as the way to reproduce a figure name a benchmark
that exists and options that it accepts: a figure whose command no longer runs cannot be checked by anyone.

``docs/performance-log.md`` is left out: it keeps the commands of past measurements as they were run.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md"] + sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "performance-log.md")

# `python -m benchmarks.name --flag ...`, `python benchmarks/name.py --flag ...`, `benchmarks/name.py --flag`
COMMAND = re.compile(r"`(?:python (?:-m )?)?benchmarks[./](?P<name>\w+)(?:\.py)?(?P<args>[^`]*)`")
FLAG = re.compile(r"(?<![\w-])--[a-z][\w-]*")


def _commands() -> list[tuple[str, str, str]]:
    """(document, benchmark name, its arguments as written) of every benchmark command in the documents."""
    found = []
    for document in DOCUMENTS:
        for match in COMMAND.finditer(document.read_text()):
            found.append((document.name, match["name"], match["args"]))
    return found


def _sources(name: str) -> list[Path]:
    """The source files of benchmark ``name``: its module, or every module of its package."""
    module = ROOT / "benchmarks" / f"{name}.py"
    if module.exists():
        return [module]
    package = ROOT / "benchmarks" / name
    return sorted(package.glob("*.py")) if (package / "__init__.py").exists() else []


def _options(sources: list[Path]) -> set[str]:
    """Every option string passed to an ``add_argument`` call in ``sources``."""
    options = set()
    for source in sources:
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
                options.update(a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str))
    return options


COMMANDS = _commands()


def test_the_documents_give_benchmark_commands() -> None:
    """The parser finds the commands (a pattern that matched nothing would pass every check below)."""
    names = {name for _, name, _ in COMMANDS}
    assert len(COMMANDS) >= 20 and {"overhead", "tiers_side_by_side", "recording_size", "peers"} <= names


@pytest.mark.parametrize("document,name,args", COMMANDS, ids=[f"{d}:{n}{a}" for d, n, a in COMMANDS])
def test_a_documented_benchmark_command_names_a_benchmark_and_its_options(document: str, name: str,
                                                                          args: str) -> None:
    sources = _sources(name)
    assert sources, f"{document} gives a command of benchmarks/{name}, which does not exist"
    unknown = set(FLAG.findall(args)) - _options(sources)
    assert not unknown, f"{document}: benchmarks/{name} has no option {sorted(unknown)}"


def test_an_unknown_option_is_caught() -> None:
    """The check above can fail: an option no parser defines is reported."""
    assert "--no-such-option" not in _options(_sources("overhead"))
    assert "--steps" in _options(_sources("overhead"))
