# ruff: noqa: E501  (the table reads best one case per line)
"""model.attn_implementation: the decision is a pure function of facts (flash-attn installed, the
device and its compute capability, the precision, what the model supports), the model loads with
it, the plan says which and why, and an explicit choice that cannot work is one line with the fix."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

from xtrain import tasks
from xtrain.errors import XtrainError
from xtrain.model import attention
from xtrain.planning.resolve import AttentionFacts, choose_attention
from xtrain.planning.run import for_launch
from xtrain.tasks.validation import load_config

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "lora-causal-lm.yaml"

# A 4090 in bf16 with flash-attn installed and a model that has both paths: flash_attention_2.
GPU = AttentionFacts(
    flash_attn="2.7.4",
    device="cuda",
    precision="bf16",
    model="LlamaForCausalLM",
    sdpa=True,
    flash=True,
    capability=(8, 9),
)


def _with(**changes) -> AttentionFacts:
    return dataclasses.replace(GPU, **changes)


@pytest.mark.parametrize(
    ("facts", "name", "passed", "why"),
    [
        (GPU, "flash_attention_2", True, "flash-attn 2.7.4 installed, CUDA, fp16/bf16"),
        (_with(flash_attn=None), "sdpa", False, "the flash-attn package is not installed"),
        (_with(device="cpu"), "sdpa", False, "it needs a CUDA GPU and this run is on cpu"),
        (_with(capability=(7, 5)), "sdpa", False, "compute capability 8.0+"),
        (_with(precision="no"), "sdpa", False, "this run is in fp32"),
        (_with(precision="no", weights_dtype="bfloat16"), "flash_attention_2", True, "fp16/bf16"),
        (_with(flash=False), "sdpa", False, "has no flash-attention path"),
        (_with(flash=None), "sdpa", False, "flash-attention support is unknown"),
        (_with(flash=False, sdpa=False), "eager", False, "has no sdpa path"),
        (_with(device="cpu", sdpa=None, flash=None), "sdpa or eager", False, "sdpa where the model has it"),
    ],
)  # fmt: skip
def test_auto_chooses_from_the_facts(facts, name, passed, why):
    chosen = choose_attention("auto", facts)
    assert (chosen.name, chosen.passed) == (name, passed) and why in chosen.reason
    # auto passes only flash_attention_2; otherwise transformers' own default (sdpa, else eager)
    assert chosen.kwargs() == ({"attn_implementation": name} if passed else {})


@pytest.mark.parametrize(
    ("asked", "facts", "line"),
    [
        ("flash_attention_2", _with(flash_attn=None), "the flash-attn package is not installed (pip install flash-attn --no-build-isolation, or set model.attn_implementation=sdpa)"),
        ("flash_attention_2", _with(device="cpu"), "it needs a CUDA GPU and this run is on cpu (set model.attn_implementation=sdpa)"),
        ("flash_attention_2", _with(precision="no"), "this run is in fp32 (set run.mixed_precision=bf16, or set model.attn_implementation=sdpa)"),
        ("flash_attention_2", _with(flash=False), "LlamaForCausalLM has no flash-attention path in transformers (set model.attn_implementation=sdpa)"),
        ("sdpa", _with(sdpa=False), "LlamaForCausalLM has no sdpa path in transformers (set model.attn_implementation=eager (or auto))"),
    ],
)  # fmt: skip
def test_an_explicit_choice_that_cannot_work_is_one_line_with_the_fix(asked, facts, line):
    with pytest.raises(XtrainError) as e:
        choose_attention(asked, facts)
    assert line in e.value.one_line() and "\n" not in e.value.one_line()


def test_an_explicit_choice_that_works_is_passed_as_it_is():
    for asked in ("eager", "sdpa", "flash_attention_2"):
        chosen = choose_attention(asked, GPU)
        assert chosen.kwargs() == {"attn_implementation": asked}
    # support not known (custom code): transformers itself checks an explicit choice
    assert choose_attention("sdpa", _with(sdpa=None)).passed


def test_model_support_is_read_from_the_class_transformers_builds():
    import transformers
    from transformers import BertConfig, LlamaConfig

    name, sdpa, flash = attention.model_support(transformers.AutoModelForCausalLM, LlamaConfig(), False)
    assert (name, sdpa, flash) == ("LlamaForCausalLM", True, True)
    name, sdpa, _ = attention.model_support(
        transformers.AutoModelForSequenceClassification, BertConfig(), False
    )
    assert (name, sdpa) == ("BertForSequenceClassification", True)

    class Old:  # a class that never declared either path
        __name__ = "Old"

    assert attention.model_support(Old, LlamaConfig(), False)[1:] == (False, False)
    remote = LlamaConfig()
    remote.auto_map = {"AutoModelForCausalLM": "modeling_x.XForCausalLM"}
    assert attention.model_support(transformers.AutoModelForCausalLM, remote, True)[1:] == (None, None)


@pytest.mark.usefixtures("private_caches")
@pytest.mark.parametrize(("asked", "loaded"), [("eager", "eager"), ("sdpa", "sdpa"), ("auto", "sdpa")])
def test_the_model_loads_with_it(tmp_path, asked, loaded):
    from support.workloads import build_workload

    data = tmp_path / "t.jsonl"
    data.write_text('{"text": "a short story"}\n{"text": "another one"}\n', encoding="utf-8")
    cfg = load_config(
        None,
        [
            "model.name_or_path=builtin:tiny-llama",
            "model.task=causal-lm",
            f"data.train={data}",
            "data.eval=null",
            f"model.attn_implementation={asked}",
        ],
    )
    workload = build_workload(cfg)
    assert workload.model.base_model.model.config._attn_implementation == loaded


@pytest.mark.usefixtures("private_caches")
def test_flash_attention_in_a_cpu_run_is_refused_before_loading(tmp_path):
    from support.workloads import build_workload

    cfg = load_config(
        None, ["model.name_or_path=builtin:tiny-llama", "model.attn_implementation=flash_attention_2"]
    )
    with pytest.raises(XtrainError, match="flash_attention_2 cannot work: it needs a CUDA GPU"):
        build_workload(cfg)  # seq-cls: every task that loads through the shared loaders honours it


def test_the_plan_says_which_and_why(machine):
    cfg = load_config(EXAMPLE, [])
    model_class = tasks.get(cfg.model.task).model_class
    facts = machine("linux-2x3090")  # fp16 on Ampere; the snapshot has no flash-attn
    chosen = attention.for_plan(for_launch(cfg, facts=facts), model_class)
    assert chosen.name == "sdpa" and "flash-attn package is not installed" in chosen.reason
    with_flash = dataclasses.replace(facts, packages={**facts.packages, "flash-attn": "2.7.4"})
    chosen = attention.for_plan(for_launch(cfg, facts=with_flash), model_class)
    assert chosen.name == "flash_attention_2" and chosen.passed
    cpu = attention.for_plan(for_launch(cfg, facts=machine("linux-cpu")), model_class)
    assert cpu.name == "sdpa or eager" and "this run is on cpu" in cpu.reason


def test_the_dry_run_prints_it_and_refuses_what_cannot_work(tmp_path):
    from support.jobs import make_job, run_xtrain

    env = make_job(tmp_path / "job").env
    xtrain = [sys.executable, "-m", "xtrain", "train", str(EXAMPLE), "--dry-run"]
    proc = run_xtrain(xtrain, env)
    assert proc.returncode == 0, proc.stderr
    assert "Attention: " in proc.stdout
    proc = run_xtrain([*xtrain, "model.attn_implementation=flash_attention_2"], env)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "model.attn_implementation=flash_attention_2 cannot work" in proc.stderr
