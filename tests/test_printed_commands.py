"""Every command xtrain prints as "what to run next" can start, on every saved machine: each
`accelerate launch`, `torchrun` and `python -m xtrain.run` line goes through the launcher's own
parser and xtrain.run's, the accelerate config next to it loads, and environment lines are plain
assignments in the machine's shell. (Fix lines of findings: tests/test_fix_lines.py.)"""

from __future__ import annotations

import re
import shlex

import pytest
from conftest import MACHINE_NAMES, load_machine

from xtrain.commands.launching import equivalent_commands
from xtrain.launch import accelerate_config as ac
from xtrain.planning.rules import make_plan
from xtrain.run import parse_args

ENV_LINE = {
    "powershell": re.compile(r'^\$env:[A-Z_][A-Z0-9_]* = "[^"]*"$'),
    "bash": re.compile(r"^export [A-Z_][A-Z0-9_]*=\S+$"),
}


def commands(text: str, shell: str) -> list[str]:
    """One logical command per entry: continuations joined, trailing comments dropped."""
    joined = text.replace("`\n", " ") if shell == "powershell" else text.replace("\\\n", " ")
    out = []
    for line in joined.splitlines():
        line = line.split("   #")[0].strip()
        if line and not line.startswith("#"):
            out.append(line)
    return out


def words_of(line: str, shell: str) -> list[str]:
    if shell == "powershell":  # single-quoted words only in what xtrain prints
        found = re.findall(r"'(?:[^']|'')*'|\S+", line)
        return [w[1:-1].replace("''", "'") if w.startswith("'") else w for w in found]
    return shlex.split(line)


def check(line: str, shell: str) -> None:
    words = words_of(line, shell)
    if words[0] in ("export",) or words[0].startswith("$env:"):
        assert ENV_LINE[shell].match(line), line
        return
    if words[:2] == ["accelerate", "launch"]:
        from accelerate.commands.launch import launch_command_parser

        args = launch_command_parser().parse_args(words[2:])
        assert args.module and args.training_script == "xtrain.run", line
        parse_args(list(args.training_script_args))
    elif words[0] == "torchrun":
        from torch.distributed.run import get_args_parser

        args = get_args_parser().parse_args(words[1:])
        assert args.module and args.training_script == "xtrain.run", line
        parse_args(list(args.training_script_args))
    elif words[1:3] == ["-m", "xtrain.run"]:
        parse_args(words[3:])
    elif words[:2] == ["xtrain", "train"]:
        assert words[2].endswith(".yaml"), line
    else:
        raise AssertionError(f"not a command xtrain should print: {line}")


@pytest.mark.parametrize("name", MACHINE_NAMES)
def test_next_and_equivalent_commands_start(name: str, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    plan = make_plan(load_machine(name))
    printed = ac.next_commands(plan, ac.default_config_path())
    for _, lines in equivalent_commands(plan, ["--config", "job.yaml", "run.max_steps=10"]):
        printed += lines
    checked = [c for text in printed for c in commands(text, plan.shell)]
    assert any("xtrain.run" in c for c in checked)
    for line in checked:
        check(line, plan.shell)
    # the config those commands read loads with accelerate, and on Windows runs no torchrun
    cfg = ac.validate_dict(ac.config_for(plan))
    if plan.launcher == "spawn" and plan.world_size > 1:
        assert cfg.distributed_type.value == "NO" and cfg.num_processes == plan.world_size
