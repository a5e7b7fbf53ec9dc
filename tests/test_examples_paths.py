"""A user running xtrain outside its checkout is pointed at the checkout's examples/."""

from __future__ import annotations

from pathlib import Path

from xtrain.cli import main
from xtrain.config import examples


def test_an_example_is_located_in_the_checkout_from_another_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    located = examples.locate("examples/chat-sft.yaml")
    assert Path(located).is_absolute() and Path(located).is_file()
    assert examples.in_command("xtrain train examples/chat-sft.yaml") == f"xtrain train {located}"
    assert examples.locate("examples/no-such.yaml") == "examples/no-such.yaml"
    assert examples.locate("mine.yaml") == "mine.yaml"


def test_in_the_checkout_the_relative_path_stays(monkeypatch):
    monkeypatch.chdir(Path(__file__).parents[1])
    assert examples.locate("examples/chat-sft.yaml") == "examples/chat-sft.yaml"


def test_a_missing_example_config_names_the_checkout_copy_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["train", "examples/chat-sft.yaml", "--dry-run"]) == 2
    said = capsys.readouterr().err.replace("\n", "")
    assert "Traceback" not in said and "examples/ is in xtrain's checkout: " in said
    assert examples.locate("examples/chat-sft.yaml") in said
