"""Benchmarks through lm-evaluation-harness (issue 59), offline: lm-eval task YAMLs written here from
local JSON lines, one generate_until (exact match) and one multiple_choice (acc), on a chat LoRA
trained by xtrain's own loop on the built-in tiny chat llama with ``eval.benchmarks``.

Default run:
- a run with ``eval.benchmarks`` scores its saved result (and with ``eval.at_start`` its start) at
  its end and keeps the scores: train_result.json, ``benchmarks/`` (lm-eval's JSON), the curves,
  the report;
- ``xtrain eval``'s numbers are lm-eval's own: ``lm_eval.simple_evaluate`` on the same base,
  adapter, tokenizer (its chat template), tasks and dtype gives the same results, and so did the
  run's own scoring;
- bad input is one line: a task file that does not parse or is no task, a result that is not a
  model, a missing extra;
- ``xtrain predict --data`` on preference and GRPO results, every row shape, GRPO's rewards.

Soak (``pytest -m soak``): 2 processes (xtrain's spawn launcher, the Windows path: real processes
over gloo) give the numbers of 1; a chain's stages scored in order (``--stages``, the report, a
recipe's table); a GGUF export scored in llama.cpp beside the merged model; lm-eval's own CLI on the
same adapter; an unknown task name (it reads lm-eval's whole task index)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from support.gradients import jsonl
from support.lm_tasks import GEN, LIMIT, MC, sft_overrides, write_tasks

from xtrain.cli import main

pytestmark = pytest.mark.usefixtures("private_caches")


@pytest.fixture(scope="module")
def tasks_dir(tmp_path_factory) -> Path:
    """Two lm-eval tasks on the built-in chat questions (another seed than training's rows)."""
    return write_tasks(tmp_path_factory.mktemp("lm-tasks"))


@pytest.fixture(scope="module")
def sft(tmp_path_factory, tasks_dir) -> Path:
    """A chat LoRA on the built-in tiny chat llama (4 steps), its benchmarks scored at its end, its
    start too (``eval.at_start``)."""
    from support.chains import train_stage

    return train_stage(tmp_path_factory, "sft-bench", sft_overrides(tmp_path_factory, tasks_dir))


def _values(results: dict) -> dict:
    """lm-eval's per-task results without the names it keeps beside them."""
    return {t: {k: v for k, v in r.items() if "," in k} for t, r in results["results"].items()}


def test_a_run_with_benchmarks_records_them_at_its_end(sft):
    from xtrain.report.runs import read_runs
    from xtrain.report.sections import benchmarks
    from xtrain.train.curves import BENCHMARKS, History, panels

    result = json.loads((sft / "train_result.json").read_text())
    found = result["benchmarks"]
    assert found["step"] == result["final_step"] == 4
    for when in ("start", "end"):
        rows = {(r["task"], r["metric"]): r for r in found[when]}
        assert set(rows) == {(GEN, "exact_match"), (MC, "acc")}
        assert all(r["n"] == LIMIT and 0 <= r["value"] <= 1 for r in rows.values())
    kept = json.loads(Path(found["file"]).read_text())  # lm-eval's own JSON beside the rows
    assert Path(found["file"]).parent == sft / "benchmarks"
    assert set(kept["lm_eval"]["results"]) == {GEN, MC} and kept["reference"]["label"] == "start"
    history = History.of(result)
    assert [p["step"] for p in history.benchmarks] == [0, 4]
    assert any(p.title == BENCHMARKS for p in panels(history))
    page = benchmarks(*read_runs([sft]))
    assert f"start (before {sft.name})" in page and "qa_mc" in page and "change" in page


@pytest.fixture(scope="module")
def evaluated(sft, tasks_dir, tmp_path_factory) -> dict:
    """``xtrain eval`` of the run in this process (its base left out: the run scored its start)."""
    out = tmp_path_factory.mktemp("eval") / "scores.json"
    args = ["eval", str(sft), "--tasks", str(tasks_dir), "--limit", str(LIMIT), "--dtype", "float32",
            "--no-base", "--no-save", "-o", str(out), "--samples", str(out.parent / "answers")]  # fmt: skip
    assert main(args) == 0
    return {**json.loads(out.read_text()), "answers": out.parent / "answers"}  # --samples' folder


def test_samples_are_each_rows_answer_and_its_metric(sft, evaluated):
    """``--samples``: a file a model, a row per scored row (input, output, reference, its metric);
    the metric's mean is lm-eval's score; lm-eval's samples are kept out of ``-o``."""
    (model,) = evaluated["models"]
    assert "samples" not in model["results"]
    (answers,) = evaluated["answers"].glob("*.jsonl")
    rows = [json.loads(line) for line in answers.read_text(encoding="utf-8").splitlines()]
    assert answers.name == f"{sft.name}.jsonl"
    values = _values(model["results"])
    for task, metric in ((GEN, "exact_match"), (MC, "acc")):
        mine = [r for r in rows if r["task"] == task]
        assert len(mine) == LIMIT and all(r["input"] and r["reference"] is not None for r in mine)
        assert sum(r[metric] for r in mine) / LIMIT == pytest.approx(values[task][f"{metric},none"])
    mc = next(r for r in rows if r["task"] == MC)
    assert isinstance(mc["output"], str)  # the choice it scored highest, as text


def _recorded(sft: Path, when: str) -> dict:
    rows = json.loads((sft / "train_result.json").read_text())["benchmarks"][when]
    return {GEN: {"exact_match,none": next(r["value"] for r in rows if r["task"] == GEN)},
            MC: {"acc,none": next(r["value"] for r in rows if r["task"] == MC)}}  # fmt: skip


def test_xtrain_eval_equals_lm_evals_own_simple_evaluate(sft, tasks_dir, evaluated):
    import lm_eval
    from lm_eval.tasks import TaskManager

    from xtrain.builtin import ensure_builtin_model

    base, adapter = str(ensure_builtin_model("builtin:tiny-llama-chat")), str(sft / "adapter")
    (model,) = evaluated["models"]
    assert model["label"] == sft.name and evaluated["processes"] == 1
    manager = TaskManager(include_path=str(tasks_dir), include_defaults=False)
    for when, args in (("start", {}), ("end", {"peft": adapter})):  # the base as the run scored its start
        own = lm_eval.simple_evaluate(
            model="hf", model_args={"pretrained": base, "tokenizer": adapter, "dtype": "float32", **args},
            tasks=[GEN, MC], task_manager=manager, apply_chat_template=True, limit=LIMIT, batch_size=8,
            device="cpu", log_samples=False,
        )  # fmt: skip
        values = _values(own)
        assert {t: {k: values[t][k] for k in _recorded(sft, when)[t]} for t in values} == _recorded(sft, when)
        if when == "end":
            assert _values(model["results"]) == values


@pytest.mark.soak  # two cold processes importing torch, transformers and lm-eval: a minute on 2 busy cores
def test_two_processes_give_the_numbers_of_one(sft, tasks_dir, evaluated, tmp_path):
    """Two real processes through xtrain's spawn launcher (the Windows path), gloo on the CPU, lm-eval's
    gathers staged through CPU copies as on Windows' GPUs."""
    from support.jobs import offline_env, run_xtrain

    out = tmp_path / "two.json"
    env = offline_env(tmp_path, Path(os.environ["XTRAIN_CACHE"]))  # the session's built-ins
    env["XTRAIN_FORCE_CPU_STAGED"] = "1"  # lm-eval's gathers through CPU copies, as with GPUs on Windows
    cmd = [sys.executable, "-m", "xtrain", "eval", str(sft), "--tasks", str(tasks_dir), "--limit", str(LIMIT),
           "--dtype", "float32", "--no-base", "--no-save", "--processes", "2", "--platform", "windows",
           "-o", str(out)]  # fmt: skip
    proc = run_xtrain(cmd, env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    two = json.loads(out.read_text())
    assert two["processes"] == 2 and "spawn launcher, gloo" in proc.stdout
    assert _values(two["models"][0]["results"]) == _values(evaluated["models"][0]["results"])


def _one_line(args: list[str], capsys) -> str:
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error:"), err
    return err


def test_bad_input_is_one_line_before_any_model_loads(sft, tasks_dir, tmp_path, capsys, monkeypatch):
    broken = tmp_path / "broken.yaml"
    broken.write_text("task: [unclosed\n", encoding="utf-8")
    assert "does not parse" in _one_line(["eval", str(sft), "--tasks", str(broken)], capsys)
    not_task = tmp_path / "plain.yaml"
    not_task.write_text("a: 1\n", encoding="utf-8")
    assert "is not an lm-eval task" in _one_line(["eval", str(sft), "--tasks", str(not_task)], capsys)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "holds no adapter or model" in _one_line(["eval", str(empty), "--tasks", str(tasks_dir)], capsys)
    text = tmp_path / "notes.txt"
    text.write_text("hello", encoding="utf-8")
    assert "no GGUF model" in _one_line(["eval", str(text), "--tasks", str(tasks_dir)], capsys)
    assert "--limit must be above 0" in _one_line(
        ["eval", str(sft), "--tasks", str(tasks_dir), "--limit", "0"], capsys
    )
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # the eval extra not installed
    said = _one_line(["eval", str(sft), "--tasks", str(tasks_dir)], capsys)
    assert "not installed" in said and 'pip install -e ".[eval]"' in said


# ---------------------------------------------------------------------------------------------
# predict --data on preference and GRPO results (adapters made here: no training needed)


def _result(tmp_path_factory, name: str, base_name: str, record: dict) -> Path:
    """A run folder with a LoRA adapter whose B weights are not zero, recorded as ``record`` says."""
    import torch
    from peft import LoraConfig, get_peft_model
    from support.jobs import session_builtin
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = session_builtin(tmp_path_factory, base_name)
    run = tmp_path_factory.mktemp(name) / "run"
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(base)
    get_peft_model(
        model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    ).save_pretrained(run / "adapter")
    AutoTokenizer.from_pretrained(base).save_pretrained(run / "adapter")
    (run / "adapter" / "xtrain_run.json").write_text(json.dumps(record), encoding="utf-8")
    return run


def _predict(run: Path, data: Path, out: Path, *more: str) -> list[dict]:
    assert (
        main(["predict", str(run), "--data", str(data), "-o", str(out), "--max-new-tokens", "6", *more]) == 0
    )
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_predict_data_on_a_preference_result_in_every_row_shape(tmp_path_factory, tmp_path, capsys):
    run = _result(
        tmp_path_factory, "dpo", "builtin:tiny-llama-chat", {"task": "preference", "chat": True, "data": {}}
    )
    cat, ball = "where is the cat?", "what color is the ball?"
    pairs = jsonl(tmp_path / "pairs.jsonl", [
        {"prompt": cat, "chosen": "it is in the house.", "rejected": "no."},
        {"prompt": [{"role": "user", "content": ball}],
         "chosen": [{"role": "assistant", "content": "it is red."}],
         "rejected": [{"role": "assistant", "content": "blue"}]},
    ])  # fmt: skip
    kto = jsonl(tmp_path / "kto.jsonl", [
        {"prompt": cat, "completion": "it is in the house.", "label": True},
        {"prompt": "where is the dog?", "completion": "no.", "label": False},
    ])  # fmt: skip
    turns = [{"role": "user", "content": cat}, {"role": "assistant", "content": "it is in the house."}]
    chat = jsonl(tmp_path / "chat.jsonl", [{"messages": turns}])
    prompts = jsonl(tmp_path / "prompts.jsonl", [{"prompt": cat}])
    shape = {"row", "input", "output", "reference", "exact_match"}
    rows = _predict(run, pairs, tmp_path / "a.jsonl")
    assert [set(r) for r in rows] == [shape, shape] and rows[1]["reference"] == "it is red."
    assert rows[1]["input"] == "what color is the ball?"
    kto_rows = _predict(run, kto, tmp_path / "b.jsonl")
    assert set(kto_rows[0]) == shape and set(kto_rows[1]) == {
        "row",
        "input",
        "output",
    }  # undesirable: no reference
    (chat_row,) = _predict(run, chat, tmp_path / "c.jsonl")
    assert set(chat_row) == shape and chat_row["reference"] == "it is in the house."
    (prompt_row,) = _predict(run, prompts, tmp_path / "d.jsonl")
    assert set(prompt_row) == {"row", "input", "output"}
    # the same prompt answered alike in every shape, and as --prompt answers it ({input, output})
    assert rows[0]["output"] == kto_rows[0]["output"] == chat_row["output"] == prompt_row["output"]
    capsys.readouterr()
    assert (
        main(["predict", str(run), "-p", "where is the cat?", "--max-new-tokens", "6", "--format", "jsonl"])
        == 0
    )
    assert json.loads(capsys.readouterr().out) == {"input": "where is the cat?", "output": rows[0]["output"]}


def test_predict_data_on_a_grpo_result_is_scored_by_its_reward_functions(tmp_path_factory, tmp_path, capsys):
    from xtrain.tasks.grpo import rewards

    settings = {
        "answer_column": "answer", "tools": [], "rewards": ["exact_match", "length"],
        "reward_weights": [1.0, 0.5], "answer_pattern": None, "format_pattern": None, "length_target": 4,
    }  # fmt: skip
    run = _result(
        tmp_path_factory,
        "grpo",
        "builtin:tiny-llama",
        {"task": "grpo", "chat": False, "data": {}, "grpo": settings},
    )
    data = jsonl(
        tmp_path / "q.jsonl",
        [{"prompt": "once upon a time", "answer": "x"}, {"prompt": "the cat", "answer": "y"}],
    )
    capsys.readouterr()
    rows = _predict(run, data, tmp_path / "g.jsonl")
    shape = {
        "row",
        "input",
        "output",
        "reference",
        "exact_match",
        "reward",
        "rewards/exact_match",
        "rewards/length",
    }
    assert all(set(r) == shape for r in rows)
    length = rewards.length_penalty(4)
    for r, answer in zip(rows, ("x", "y"), strict=True):
        assert r["rewards/exact_match"] == float(r["output"].strip() == answer)
        assert r["rewards/length"] == length([r["input"]], [r["output"]])[0]
        assert r["reward"] == pytest.approx(r["rewards/exact_match"] + 0.5 * r["rewards/length"])
    mean = sum(r["reward"] for r in rows) / 2
    assert f"reward {mean:.4g}" in capsys.readouterr().err
    text = jsonl(tmp_path / "text.jsonl", [{"text": "the cat"}])  # not GRPO's shape: causal-lm's reader
    (plain,) = _predict(run, text, tmp_path / "t.jsonl")
    assert set(plain) == {"row", "input", "output"} and plain["output"] == rows[1]["output"]


# ---------------------------------------------------------------------------------------------
# soak: a chain's stages, llama.cpp, lm-eval's own CLI, lm-eval's whole task index


@pytest.fixture(scope="module")
def dpo(tmp_path_factory, sft, tasks_dir) -> Path:
    """DPO on top of the SFT result (a new adapter: a chain of two), its benchmarks scored at its end."""
    from support.chains import train_stage
    from support.gradients import jsonl

    def turn(role: str, text: str) -> list[dict]:
        return [{"role": role, "content": text}]

    pair = {"prompt": turn("user", "where is the cat?"), "chosen": turn("assistant", "it is in the house."),
            "rejected": turn("assistant", "no.")}  # fmt: skip
    pairs = [pair] * 16
    data = jsonl(tmp_path_factory.mktemp("pairs") / "pairs.jsonl", pairs)
    return train_stage(
        tmp_path_factory,
        "dpo-bench",
        [f"model.name_or_path={sft}", "model.task=preference", f"data.train={data}", "data.eval=null",
         "data.max_length=48", "lora.r=4", "lora.alpha=8", "optim.lr=1e-3", "batch.per_device=8",
         "run.max_steps=2", "run.log_every=2", f"eval.benchmarks={tasks_dir}", f"eval.limit={LIMIT}"],
    )  # fmt: skip


@pytest.mark.soak
def test_a_chains_stages_are_scored_in_order(sft, dpo, tasks_dir, tmp_path, capsys):
    from rich.console import Console

    from xtrain.commands.recipe import stage_scores
    from xtrain.report.runs import read_runs
    from xtrain.report.sections import benchmark_columns

    out = tmp_path / "stages.json"
    args = [
        "eval",
        str(dpo),
        "--stages",
        "--tasks",
        str(tasks_dir),
        "--limit",
        str(LIMIT),
        "--no-save",
        "-o",
        str(out),
    ]
    assert main(args) == 0
    models = json.loads(out.read_text())["models"]
    assert [m["label"] for m in models] == ["base: tiny-llama-chat", sft.name, dpo.name]
    for run, model in zip((sft, dpo), models[1:], strict=True):  # each stage as its own run scored it
        got = _values(model["results"])
        assert {t: {k: got[t][k] for k in v} for t, v in _recorded(run, "end").items()} == _recorded(
            run, "end"
        )
    runs, chained = read_runs([dpo, sft])
    assert chained and [r.folder for r in runs] == [sft, dpo]
    labels, columns = benchmark_columns(runs)
    assert labels[0].startswith("start (before") and labels[1:] == [r.name for r in runs] and all(columns)

    class Stage:  # what stage_scores reads of a recipe's stage
        def __init__(self, n: int, folder: Path) -> None:
            self.number, self.path = n, folder / "job.yaml"
            self.cfg = type("C", (), {"run": type("R", (), {"output_dir": str(folder)})()})()

    console = Console(record=True, width=200)
    stage_scores([Stage(1, sft), Stage(2, dpo)], console)
    text = console.export_text()
    assert "Benchmarks after each stage" in text and "1. job" in text and "2. job" in text


@pytest.mark.soak
def test_a_gguf_export_is_scored_in_llama_cpp_beside_the_merged_model(sft, tasks_dir, tmp_path, capsys):
    pytest.importorskip("xllamacpp")
    exported = tmp_path / "export"
    assert main(["export", str(sft), "--to", "merged,gguf", "--type", "q8_0", "-o", str(exported)]) == 0
    gguf = next(exported.glob("*.gguf"))
    out = tmp_path / "cost.json"
    gen = str(tasks_dir / "qa_gen.yaml")
    args = [
        "eval",
        str(exported / "merged"),
        str(gguf),
        "--tasks",
        gen,
        "--limit",
        str(LIMIT),
        "--no-save",
        "-o",
        str(out),
    ]
    assert main(args) == 0
    base, merged, quantized = json.loads(out.read_text())["models"]  # the merged folder's base first
    assert base["label"] == "base: tiny-llama-chat" and merged["label"] == "export/merged"
    assert (
        quantized["label"] == gguf.stem
        and quantized["results"]["config"]["model"] == "local-chat-completions"
    )
    assert 0 <= quantized["results"]["results"][GEN]["exact_match,none"] <= 1
    assert merged["results"]["n-samples"] == quantized["results"]["n-samples"]
    said = _one_line(["eval", str(gguf), "--tasks", str(tasks_dir / "qa_mc.yaml")], capsys)
    assert "multiple_choice" in said and "generation tasks only" in said


@pytest.mark.soak
def test_lm_evals_own_cli_gives_the_same_numbers(sft, tasks_dir, evaluated, tmp_path):
    import subprocess

    from xtrain.builtin import ensure_builtin_model

    base, adapter = ensure_builtin_model("builtin:tiny-llama-chat"), sft / "adapter"
    cli = Path(sys.executable).with_name("lm-eval")
    cmd = [str(cli), "run", "--model", "hf", "--model_args", f"pretrained={base}", f"peft={adapter}",
           f"tokenizer={adapter}", "dtype=float32", "--tasks", GEN, MC, "--include_path", str(tasks_dir),
           "--limit", str(LIMIT), "--batch_size", "8", "--device", "cpu", "--apply_chat_template",
           "--output_path", str(tmp_path / "cli")]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (found,) = (tmp_path / "cli").rglob("results_*.json")
    assert _values(json.loads(found.read_text())) == _values(evaluated["models"][0]["results"])


@pytest.mark.soak
def test_an_unknown_task_name_is_one_line_naming_the_closest(sft, capsys):
    said = _one_line(["eval", str(sft), "--tasks", "arc_eazy"], capsys)
    assert "knows no task or group of that name" in said and "arc_easy" in said
