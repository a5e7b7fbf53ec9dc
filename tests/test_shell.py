"""Quoting in xtrain/shell.py: what the shell hands the program is exactly the text quoted."""

from __future__ import annotations

import subprocess

import pytest
from support.ps_syntax import check_line

from xtrain.shell import pip_command, python_command, quote, set_env

TEXTS = [
    "plain",
    "0,1",
    r"C:\Users\Jörg\LoRA runs\train.yaml",
    "/home/o'brien/x y/a.yaml",
    "O\u2019Brien \u2018quoted\u2019",
    '$HOME and `tick` and "dq"',
    "@splat",
    "a;b|c&d",
]


@pytest.mark.parametrize("text", TEXTS)
def test_bash_quote_round_trips(text):
    done = subprocess.run(
        ["bash", "-c", f"printf '%s' {quote('bash', text)}"], capture_output=True, text=True
    )
    assert done.stdout == text


@pytest.mark.parametrize("text", TEXTS)
def test_powershell_quote_round_trips(text):
    (words,) = check_line(f"xtrain train {quote('powershell', text)}", {"xtrain"})
    assert words[-1][1] == text


def test_powershell_quotes_commas_and_splats():
    assert quote("powershell", "0,1") == "'0,1'"  # unquoted, PowerShell passes an array: "0 1"
    assert quote("powershell", "@x") == "'@x'"
    assert quote("bash", "0,1") == "0,1"


def test_set_env_in_both_shells():
    assert set_env("powershell", "USE_LIBUV", "0") == '$env:USE_LIBUV = "0"'
    assert set_env("powershell", "X", "a$b") == "$env:X = 'a$b'"  # "..." would expand $b
    assert set_env("bash", "USE_LIBUV", "0") == "export USE_LIBUV=0"
    assert set_env("bash", "X", "a b") == "export X='a b'"
    check_line(set_env("powershell", "X", "it's $5"), set())


def test_python_command_uses_the_call_operator_only_when_quoted():
    assert python_command("powershell", r"C:\venv\Scripts\python.exe") == r"C:\venv\Scripts\python.exe"
    assert python_command("powershell", r"C:\My venv\python.exe") == r"& 'C:\My venv\python.exe'"
    assert python_command("powershell", None) == "python"
    assert python_command("bash", None) == "python3"
    assert pip_command("bash", "/x y/python", ["install", "torch==2.13.0"]) == (
        "'/x y/python' -m pip install torch==2.13.0"
    )
