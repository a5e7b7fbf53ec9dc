"""The README is always true: its fresh-machine commands are the ones CI runs, its first screen
holds what a newcomer needs (what xtrain is, the two commands, the same in PowerShell, the studio,
one table of what it does), every command of that table is a real xtrain command with real options
and files, and every link resolves."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
FIRST_SCREEN = 60  # lines


def _text() -> str:
    return README.read_text(encoding="utf-8")


def _bash_blocks(text: str) -> list[str]:
    return [b.strip() for b in re.findall(r"```bash\n(.*?)```", text, flags=re.S)]


def _table_rows(text: str) -> list[list[str]]:
    """The rows of the README's table of what xtrain does (its header and rule left out)."""
    lines = [line.strip().strip("|") for line in text.splitlines() if line.startswith("|")]
    rows = [[cell.strip() for cell in line.split("|")] for line in lines]
    return [r for r in rows[2:] if len(r) == 3]


def test_readme_opens_with_two_commands() -> None:
    blocks = _bash_blocks(_text())
    assert len(blocks) >= 2
    main_job, tests = blocks[0], blocks[1]
    assert "pip install" in main_job and "xtrain" in main_job
    assert "pytest" in tests


def test_ci_runs_the_readme_test_command() -> None:
    """.ci/run ends with the README's test command, verbatim, on a line of its own; what it runs
    before (the real systems the tests drive, from the registries) leaves that command alone."""
    tests = _bash_blocks(_text())[1]
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    commands = [ln.strip() for ln in ci.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    assert commands[-1] == tests
    installs = [ln for ln in commands if "apt-get install" in ln]
    assert installs and "slurm-wlm" in installs[0] and "munge" in installs[0]  # tests/test_slurm.py


def test_the_first_screen_holds_the_commands_the_studio_and_the_table() -> None:
    text = _text()
    lines = text.splitlines()
    first = "\n".join(lines[:FIRST_SCREEN])
    blocks = _bash_blocks(first)
    assert blocks[:2] == _bash_blocks(text)[:2] and "xtrain studio" in blocks[2]
    shells = re.findall(r"```powershell\n(.*?)```", first, flags=re.S)
    main_job, tests = shells[0].strip().splitlines()
    for bash, ps in ((blocks[0], main_job), (blocks[1], tests)):  # the same commands, PowerShell's way
        translated = bash.replace(" && ", "; ").replace(".venv/bin/", ".venv\\Scripts\\")
        assert translated.replace("python3", "python") == ps
    assert "xtrain studio" in shells[1]
    last_row = max(i for i, line in enumerate(lines) if line.startswith("| "))
    assert last_row < FIRST_SCREEN and len(_table_rows(text)) >= 12
    prose = lines[2 : lines.index("", 2)]
    assert len(prose) == 2  # what xtrain is, in two lines


@pytest.fixture(scope="module")
def cli_options() -> dict[str, set[str]]:
    from support.docs_commands import _cli_options

    return _cli_options()


def test_every_command_of_the_table_is_real(cli_options: dict[str, set[str]]) -> None:
    """One command a row: an `xtrain` command with options the CLI has; the files it names exist
    (RUN, FILE, OUT: the reader's own)."""
    from support.docs_commands import _words, option_problems

    for what, cell, docs in _table_rows(_text()):
        commands = re.findall(r"`([^`]+)`", cell)
        assert len(commands) == 1 and commands[0].startswith("xtrain "), (what, cell)
        words = _words(commands[0], "bash")
        assert not option_problems(what, words, cli_options), (what, cell)
        for word in words[2:]:
            if re.search(r"\.(yaml|json|jsonl)$", word):
                assert (ROOT / word).is_file(), f"{what}: {word} is not in the repository"
        assert re.fullmatch(r"\[[^\]]+\]\([^)]+\)", docs), (what, docs)  # one docs link a row


def _anchors(path: Path) -> set[str]:
    from test_docs_commands import _anchors as anchors

    return anchors(path)


def test_every_link_resolves() -> None:
    text = re.sub(r"```.*?```", "", _text(), flags=re.S)
    broken = []
    for target in re.findall(r"\[[^\]]*\]\(([^)\s]+)\)", text):
        if re.match(r"^[a-z]+://", target):
            continue
        file, _, anchor = target.partition("#")
        dest = ROOT / file
        if not dest.exists():
            broken.append(f"{target} (no file)")
        elif anchor and anchor not in _anchors(dest):
            broken.append(f"{target} (no heading #{anchor})")
    assert not broken, "README.md: " + ", ".join(broken)
