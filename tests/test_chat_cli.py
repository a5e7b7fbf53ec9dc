"""`xtrain chat RUN`: a prompt loop on the quickstart's chat run, driven through stdin. Each
answer is held against ``xtrain predict``'s on the same conversation (one prompt, or a data file
row holding the turns so far): the loop renders the whole conversation through the run's chat
template, and ``/reset`` starts it over."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from xtrain import predict as lib
from xtrain.cli import app, main
from xtrain.tasks.contract import PredictRequest

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("private_caches")]

FIRST, SECOND = "where is the frog?", "what color is the kite?"
TOKENS = "12"


@pytest.fixture(scope="module")
def chat_run(tmp_path_factory) -> Path:
    """The run of the README's first command (shared with test_quickstart.py)."""
    from support.jobs import session_quickstart

    return session_quickstart(tmp_path_factory)[1]


def _chat(run: Path, typed: str, *options: str) -> list[str]:
    """The answers ``xtrain chat`` printed for the lines ``typed`` on stdin."""
    result = CliRunner().invoke(app, ["chat", str(run), "--max-new-tokens", TOKENS, *options], input=typed)
    assert result.exit_code == 0, result.output
    return [line.split("bot> ", 1)[1] for line in result.output.splitlines() if "bot> " in line]


def _predicted(run: Path, prompt: str) -> str:
    (row,) = lib.predict(run, PredictRequest([], [prompt], max_new_tokens=int(TOKENS)))
    return row["output"]


def test_each_answer_is_the_conversation_so_far_rendered_and_reset_starts_over(chat_run, tmp_path):
    answers = _chat(chat_run, f"{FIRST}\n{SECOND}\n/reset\n{SECOND}\n/exit\nnever read\n")
    assert len(answers) == 3
    assert answers[0] == _predicted(chat_run, FIRST)  # one user turn: what predict answers
    assert answers[2] == _predicted(chat_run, SECOND)  # after /reset: a fresh conversation
    # the second turn saw the first exchange: predict --data on a row holding those turns
    turns = [
        {"role": "user", "content": FIRST},
        {"role": "assistant", "content": answers[0]},
        {"role": "user", "content": SECOND},
    ]
    data = tmp_path / "so-far.jsonl"
    data.write_text(json.dumps({"messages": turns}) + "\n", encoding="utf-8")
    results = lib.predict_file(chat_run, data, PredictRequest([], [], max_new_tokens=int(TOKENS)))
    assert answers[1] == results.rows[0]["output"]


def test_end_of_input_and_ctrl_c_leave_cleanly(chat_run, monkeypatch):
    assert len(_chat(chat_run, f"{FIRST}\n")) == 1  # stdin ends (Ctrl+D): exit 0, no traceback

    def interrupted(prompt: str = "") -> str:
        raise KeyboardInterrupt

    monkeypatch.setattr("builtins.input", interrupted)
    assert _chat(chat_run, "") == []


def test_sampling_with_a_seed_repeats_and_a_system_turn_goes_first(chat_run):
    sampled = ("--temperature", "1.5", "--seed", "3")
    assert _chat(chat_run, f"{FIRST}\n", *sampled) == _chat(chat_run, f"{FIRST}\n", *sampled)
    system = "you answer about animals."
    (answer,) = _chat(chat_run, f"{FIRST}\n", "--system", system)
    (row,) = lib.predict(chat_run, PredictRequest([], [FIRST], system=system, max_new_tokens=int(TOKENS)))
    assert answer == row["output"]


def test_a_chat_base_model_chats_through_its_own_template(tmp_path_factory):
    from support.jobs import session_builtin

    base = session_builtin(tmp_path_factory, "builtin:tiny-llama-chat")
    result = CliRunner().invoke(app, ["chat", str(base), "--max-new-tokens", "4"], input=f"{FIRST}\n")
    assert result.exit_code == 0, result.output
    assert "its own chat template" in result.output and "bot> " in result.output


def test_a_model_without_a_chat_template_is_refused_in_one_line(tmp_path_factory, capsys):
    from support.jobs import session_builtin

    plain = session_builtin(tmp_path_factory, "builtin:tiny-llama")
    assert main(["chat", str(plain)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "no chat template" in err and "xtrain predict" in err
