"""The built-in agent job (examples/agent-tools.yaml, docs/agents.md): ``xtrain predict --tools``
renders the tools and shows a parsed call (fast, in-process, the model's ``generate`` standing
in for a trained one), and the job itself learns to call the right tool with the right arguments
at 1 and 2 processes (soak: minutes on a CPU; the figures are in docs/agents.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from xtrain import builtin
from xtrain.predict import file_config
from xtrain.tasks.text import causal_lm

pytestmark = pytest.mark.usefixtures("private_caches")

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "agent-tools.yaml"
TOOLS_FILE = REPO / "examples" / "data" / "agent-tools.json"
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "oslo"}}</tool_call>'


def _loaded(tokenizer, model, monkeypatch, said: str):
    """The tiny agent as a chat run's predictor, its ``generate`` answering ``said`` after the
    prompt (what a trained model would write), the prompts it was given kept."""
    import torch

    from xtrain.tasks.contract import Loaded

    prompts = []

    def generate(input_ids, attention_mask, **kw):
        prompts.extend(tokenizer.batch_decode(input_ids))
        tail = tokenizer(said, add_special_tokens=False, return_tensors="pt")["input_ids"]
        return torch.cat([input_ids, tail.expand(len(input_ids), -1)], dim=1)

    monkeypatch.setattr(model, "generate", generate)
    return Loaded(model, tokenizer, "agent-run", {"chat": True, "data": {}}), prompts


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cache = tmp_path_factory.getbasetemp() / "offline-caches" / "xtrain" / "builtin"
    folder = builtin.ensure_builtin_model("builtin:tiny-agent", cache)
    return AutoTokenizer.from_pretrained(folder), AutoModelForCausalLM.from_pretrained(folder)


def test_predict_with_tools_renders_them_and_shows_the_parsed_call(agent, monkeypatch):
    from xtrain.data.rows import tools as agent_rows
    from xtrain.tasks.contract import PredictRequest

    tokenizer, model = agent
    tools = agent_rows.read_tools_file(str(TOOLS_FILE), "--tools")
    loaded, prompts = _loaded(tokenizer, model, monkeypatch, CALL)
    request = PredictRequest([], ["what is the weather like in oslo?"], tools=tools, max_new_tokens=30)
    (row,) = causal_lm.TASK.predicts.run(loaded, request)
    assert "tools: get_weather(city) get_time(city) set_timer(minutes)" in prompts[0]
    assert row["call"] == 'get_weather {"city": "oslo"}' and row["output"] == CALL
    loaded, prompts = _loaded(tokenizer, model, monkeypatch, "it is snowy.")
    (row,) = causal_lm.TASK.predicts.run(loaded, PredictRequest([], ["hi"], max_new_tokens=5))
    assert "call" not in row and row["output"] == "it is snowy." and "tools:" not in prompts[0]


def test_data_rows_ending_on_a_call_are_scored_by_the_call(agent, monkeypatch, tmp_path):

    from xtrain.tasks.contract import PredictRequest
    from xtrain.tasks.predicting import in_batches

    tokenizer, model = agent
    rows = [
        json.loads(x) for x in (builtin.ensure_builtin_data("builtin:tool-calls") / "eval-calls.jsonl").open()
    ]
    data = tmp_path / "calls.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows[:4]), encoding="utf-8")
    cfg = file_config(causal_lm.TASK, {}, data)
    examples = causal_lm.TASK.predicts.file.read(cfg, {"chat": True, "row_format": "messages"})
    assert all(len(e.feed.tools) == 3 and e.feed.messages[-1]["role"] == "user" for e in examples)
    loaded, prompts = _loaded(tokenizer, model, monkeypatch, CALL)
    outputs = in_batches(
        causal_lm.TASK.predicts.file.answer, loaded, examples, PredictRequest([], [], max_new_tokens=30)
    )
    refs = [e.reference for e in examples]
    expected = sum(json.loads(r) == [{"name": "get_weather", "arguments": {"city": "oslo"}}] for r in refs)
    scores = causal_lm.TASK.predicts.file.score(refs, [o["output"] for o in outputs])
    assert scores["call_exact_match"] == expected / len(refs)
    assert all(p.rstrip().endswith("<|im_start|>assistant") for p in prompts)


# ---------------------------------------------------------------------------------------------
# The job learns (soak)


def _train(root: Path, *extra: str) -> Path:
    from support.jobs import offline_env, python_run, run_xtrain

    out = root / "run"
    env = offline_env(root, root.parent / "cache")
    proc = run_xtrain(
        python_run(*extra, "--config", str(EXAMPLE), f"run.output_dir={out}"), env, timeout=1800
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def _call_exact_match(run: Path) -> float:
    from xtrain import predict
    from xtrain.tasks.contract import PredictRequest

    calls = builtin.ensure_builtin_data("builtin:tool-calls") / "eval-calls.jsonl"
    found = predict.predict_file(run, calls, PredictRequest([], [], max_new_tokens=40, batch_size=50))
    return found.metrics["call_exact_match"]


def _untrained_call_exact_match(tokenizer, model) -> float:
    """The built-in model before training, on the same rows: it makes no call."""

    from xtrain.tasks.contract import Loaded, PredictRequest
    from xtrain.tasks.predicting import in_batches

    calls = builtin.ensure_builtin_data("builtin:tool-calls") / "eval-calls.jsonl"
    cfg = file_config(causal_lm.TASK, {}, calls)
    examples = causal_lm.TASK.predicts.file.read(cfg, {"chat": True, "row_format": "messages"})
    loaded = Loaded(model, tokenizer, "builtin:tiny-agent", {"chat": True, "data": {}})
    outputs = in_batches(
        causal_lm.TASK.predicts.file.answer, loaded, examples, PredictRequest([], [], max_new_tokens=40)
    )
    return causal_lm.TASK.predicts.file.score(
        [e.reference for e in examples], [o["output"] for o in outputs]
    )["call_exact_match"]


@pytest.mark.soak
@pytest.mark.parametrize("processes", [1, 2])
def test_the_builtin_agent_job_learns_to_call_the_right_tool(agent, tmp_path, processes):
    assert _untrained_call_exact_match(*agent) <= 0.05
    run = _train(tmp_path, *(("--processes", "2") if processes == 2 else ()))
    assert _call_exact_match(run) >= 0.9


def test_tools_are_refused_where_prompts_take_none():
    from xtrain import predict
    from xtrain.errors import XtrainError
    from xtrain.tasks.contract import PredictRequest
    from xtrain.tasks.vision import image_classification

    tools = [{"type": "function", "function": {"name": "f"}}]
    with pytest.raises(XtrainError) as e:
        predict.check_request(image_classification.TASK, PredictRequest([], [], tools=tools))
    assert "--tools" in e.value.message and "causal-lm" in e.value.hint
    predict.check_request(causal_lm.TASK, PredictRequest([], [], tools=tools))
