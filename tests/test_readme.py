"""The README is always true: its fresh-machine commands are the ones CI runs."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _bash_blocks(text: str) -> list[str]:
    return [b.strip() for b in re.findall(r"```bash\n(.*?)```", text, flags=re.S)]


def test_readme_opens_with_two_commands() -> None:
    blocks = _bash_blocks((ROOT / "README.md").read_text(encoding="utf-8"))
    assert len(blocks) >= 2
    main_job, tests = blocks[0], blocks[1]
    assert "pip install" in main_job and "xtrain" in main_job
    assert "pytest" in tests


def test_ci_runs_the_readme_test_command() -> None:
    """.ci/run ends with the README's test command, verbatim, on a line of its own; what it runs
    before (the real systems the tests drive, from the registries) leaves that command alone."""
    tests = _bash_blocks((ROOT / "README.md").read_text(encoding="utf-8"))[1]
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    commands = [ln.strip() for ln in ci.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    assert commands[-1] == tests
    installs = [ln for ln in commands if "apt-get install" in ln]
    assert installs and "slurm-wlm" in installs[0] and "munge" in installs[0]  # tests/test_slurm.py
