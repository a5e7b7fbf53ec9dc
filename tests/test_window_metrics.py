"""Every logging window carries the task's own metrics (issue 60), as TRL's logs do: a short KTO
run and a short GRPO run, each step its own window. The log history, the console's line, the
trackers and the reporter get the same numbers, and they are what the task computed: KTO's
rewards, accuracy and KL reduced over the step's rows (its micro-batches hold different numbers of
desirable rows: a mean of their means would be off), GRPO's mean reward and reward per function
over the completions its reward functions scored, and its KL 0 at the first step. The run
applies the plan's compute threads (issue 60: a busy CPU) and gives the process its own back."""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import pytest
import torch

from xtrain import builtin
from xtrain.machine.facts import Facts
from xtrain.planning.plan import Overrides
from xtrain.planning.rules import make_plan
from xtrain.tasks.validation import load_config
from xtrain.train.report import ListReporter, RichReporter

pytestmark = pytest.mark.usefixtures("private_caches")  # conftest: one offline cache for the session
COMMON = [
    "model.name_or_path=builtin:tiny-llama", "data.eval=null", "data.max_length=40", "lora.dropout=0.0",
    "run.report_to=none", "run.max_steps=2", "run.log_every=1", "run.eval_at_start=false",
    "run.eval_every=null", "optim.warmup_steps=0", "batch.per_device=4", "batch.global_batch=8",
]  # fmt: skip


def _plan(**overrides):
    return make_plan(Facts(torch_version="2.13.0", gloo_available=True), Overrides(**overrides))


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _run(cfg, build, monkeypatch, plan=None) -> tuple[object, ListReporter, list[tuple[int, dict]]]:
    """Train ``cfg`` with ``build`` (on ``plan``); (the result, the reporter's events, what the
    trackers got)."""
    from accelerate import Accelerator

    from xtrain.train.loop import train

    tracked: list[tuple[int, dict]] = []

    def log(self, values: dict, step: int | None = None, **kwargs) -> None:
        tracked.append((step, values))

    monkeypatch.setattr(Accelerator, "log", log)
    reporter = ListReporter()
    return train(cfg, plan or _plan(), reporter, build=build), reporter, tracked


def _same_everywhere(result, reporter: ListReporter, tracked: list[tuple[int, dict]], keys: set[str]) -> None:
    """The log history, the reporter's windows, the trackers and the console's line hold the same
    metrics, the task's ``keys`` among them."""
    history = {w["step"]: w for w in result.log_history}
    windows = dict(event for kind, event in reporter.events if kind == "progress")
    assert sorted(history) == sorted(windows) == [1, 2]
    for step, metrics in windows.items():
        assert keys <= set(metrics) and history[step] == {"step": step, **metrics}
        assert (step, metrics) in tracked  # acc.log: the trackers
    console = RichReporter(_console())
    console.progress(2, 2, windows[2])
    printed = console.console.file.getvalue()
    assert all(f"{k} " in printed for k in keys), printed


def _console():
    from rich.console import Console

    return Console(file=io.StringIO(), force_terminal=False, width=400)


def test_kto_windows_hold_the_rewards_of_their_rows(tmp_path, monkeypatch) -> None:
    from xtrain.tasks import build_workload
    from xtrain.tasks.preference import losses as pl

    rows = []
    for pair in builtin.preference_examples(12, 3):
        rows.append({"prompt": pair["prompt"], "completion": pair["chosen"], "label": True})
        if len(rows) % 3:  # twice as many desirable rows as undesirable ones
            rows.append({"prompt": pair["prompt"], "completion": pair["rejected"], "label": False})
    random.Random(0).shuffle(rows)
    train_file = _jsonl(tmp_path / "train.jsonl", rows)
    cfg = load_config(None, [*COMMON, "model.task=preference", "preference.loss=kto", "optim.lr=0.05",
                             f"data.train={train_file}", f"run.output_dir={tmp_path / 'out'}"])  # fmt: skip
    seen: list[dict[str, torch.Tensor]] = []  # each training forward's per-row statistics

    def build(run, main_process_first):
        workload = build_workload(run, main_process_first)
        forward = workload.forward

        def recorded(model, batch):
            out = forward(model, batch)
            if model.training:
                seen.append({k: v.detach().clone() for k, v in out.stats.items()})
            return out

        workload.forward = recorded
        return workload

    result, reporter, tracked = _run(cfg, build, monkeypatch)
    assert len(seen) == 4  # 2 steps x 2 micro-batches
    desirable = [int(s["chosen_n"].sum()) for s in seen]
    assert desirable[0] != desirable[1] or desirable[2] != desirable[3], desirable  # uneven windows
    for step in (1, 2):
        rows_of_step = {k: torch.cat([s[k] for s in seen[2 * step - 2 : 2 * step]]) for k in seen[0]}
        expected = pl.reduce(rows_of_step)  # as the evaluation reduces an eval set
        logged = next(w for w in result.log_history if w["step"] == step)
        for key, value in expected.items():
            assert logged[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    keys = {"rewards/chosen", "rewards/rejected", "rewards/accuracy", "rewards/margin", "kl", "nll/chosen"}
    _same_everywhere(result, reporter, tracked, keys)
    # the layers LoRA adapted, as the run recorded them and the banner said them: the dry run's
    # line, from the model's skeleton, names the same (the report's plan shows them: test_report.py)
    from xtrain.tasks import model_checks

    adapted = result.run_info["lora_targets"], result.run_info["lora_layers"]
    assert adapted == (["q_proj", "k_proj", "v_proj", "o_proj"], 8)
    said = "q_proj, k_proj, v_proj, o_proj (8 layers)"
    assert model_checks.checked_offline(cfg)[1] == f"r=8, alpha=16, lora.target_modules=auto: {said}"
    assert next(e for kind, e in reporter.events if kind == "start").lora == said


def test_grpo_windows_hold_the_rewards_its_functions_gave(tmp_path, monkeypatch) -> None:
    from xtrain.tasks import build_workload

    prompts = [{"prompt": f"question: what is {i} plus {i}? answer:"} for i in range(8)]
    train_file = _jsonl(tmp_path / "train.jsonl", prompts)
    cfg = load_config(None, [*COMMON, "model.task=grpo", "grpo.num_generations=4", "grpo.beta=0.04",
                             "grpo.max_completion_length=6", "grpo.rewards=[length, format]",
                             "grpo.reward_weights=[1.0, 0.5]", "grpo.length_target=12",
                             "grpo.format_pattern=.*[aeiou].*", f"data.train={train_file}",
                             f"run.output_dir={tmp_path / 'out'}"])  # fmt: skip
    scored: list[torch.Tensor] = []  # [completions, functions] of each micro-batch, in order
    threads: list[int] = []  # torch's compute threads while the run builds its workload

    def build(run, main_process_first):
        threads.append(torch.get_num_threads())
        workload = build_workload(run, main_process_first)
        step = workload.forward
        score = step.score

        def recorded(*args, **kwargs):
            values = score(*args, **kwargs)
            scored.append(values.clone())
            return values

        step.score = recorded
        return workload

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:  # the plan's compute threads (planning/threads.py) applied by the run, then given back
        result, reporter, tracked = _run(cfg, build, monkeypatch, _plan(cpu_threads=1))
        assert threads == [1] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert len(scored) == 4  # 2 steps x 2 micro-batches of 4 completions
    weights = torch.tensor([1.0, 0.5])
    for step in (1, 2):
        values = torch.cat(scored[2 * step - 2 : 2 * step])  # the step's 8 completions
        logged = next(w for w in result.log_history if w["step"] == step)
        assert logged["reward"] == pytest.approx(float((values * weights).sum(1).mean()), abs=1e-6)
        assert logged["rewards/length/mean"] == pytest.approx(float(values[:, 0].mean()), abs=1e-6)
        assert logged["rewards/format/mean"] == pytest.approx(float(values[:, 1].mean()), abs=1e-6)
    assert result.log_history[0]["kl"] == pytest.approx(0.0, abs=1e-6)  # the policy is its reference
    keys = {"reward", "rewards/length/mean", "rewards/format/mean", "kl", "completions/mean_length"}
    _same_everywhere(result, reporter, tracked, keys)
