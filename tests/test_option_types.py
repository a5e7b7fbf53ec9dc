"""Numeric CLI options have their real types in ``--help`` (``<int>``, ``<float>``, not ``<str>``),
and a value that is no number is still one line, exit 2, not typer's usage box (issue 41 §3.10)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from xtrain.cli import main

COMMANDS = Path(__file__).resolve().parents[1] / "xtrain" / "commands"
# every option a command reads as a number: parse_int/parse_float(VALUE, "--flag", ...) and the
# parsers whole("--flag") / number("--flag")
READ_AS_NUMBER = re.compile(
    r'(?:parse_int|parse_float|whole|number)\(\s*(?:[^,()]+(?:\[[^\]]*\])?,\s*)?"(--[\w-]+)"'
)


# option factories shared by several commands (``xtrain/commands/options.py``: ``seed_option()``, ...)
SHARED = COMMANDS / "options.py"
FACTORY = re.compile(r"^def (\w+_option)\(", re.MULTILINE)


def _numeric_flags() -> dict[str, set[str]]:
    """{command: its numeric flags}; a shared option factory's flags count for each command that
    calls it."""
    shared_text = SHARED.read_text(encoding="utf-8")
    factories = {}
    for name, body in zip(FACTORY.findall(shared_text), FACTORY.split(shared_text)[2::2], strict=True):
        factories[name] = set(READ_AS_NUMBER.findall(body))
    flags: dict[str, set[str]] = {}
    for module in sorted(COMMANDS.glob("*.py")):
        if module == SHARED:
            continue
        text = module.read_text(encoding="utf-8")
        found = set(READ_AS_NUMBER.findall(text))
        for name, numeric in factories.items():
            if f"{name}(" in text:
                found |= numeric
        if found:
            flags[module.stem] = found
    return flags


def _help_types(command: str, capsys: pytest.CaptureFixture[str]) -> dict[str, str]:
    assert main([command, "--help"]) == 0
    text = capsys.readouterr().out
    return {flag: kind for flag, kind in re.findall(r"(--[\w-]+)\b[^<\n│]*<([\w\[\]]+)>", text)}


def test_every_numeric_option_shows_its_type(capsys: pytest.CaptureFixture[str]) -> None:
    flags = _numeric_flags()
    assert {"predict", "configure", "doctor", "bench", "train", "quickstart"} <= set(flags)
    for command, numeric in flags.items():
        shown = _help_types(command, capsys)
        wrong = {flag: shown.get(flag) for flag in numeric if shown.get(flag) not in ("int", "float")}
        assert not wrong, f"xtrain {command} --help: {wrong}"


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["configure", "--port", "abc", "--dry-run"], "--port needs a whole number, got 'abc'"),
        (["predict", "run", "--batch-size", "eight"], "--batch-size needs a whole number, got 'eight'"),
        (["predict", "run", "--top-p", "2", "-p", "x"], "--top-p must be between 0 and 1, got 2"),
    ],
)
def test_a_value_that_is_no_number_is_one_line(
    args: list[str], line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(args) == 2
    err = capsys.readouterr().err
    assert line in err and "Usage:" not in err and len(err.strip().splitlines()) == 1, err
