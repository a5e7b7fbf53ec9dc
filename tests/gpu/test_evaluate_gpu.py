"""``xtrain eval`` on CUDA (skipped without it: tests/gpu/conftest.py): its numbers are lm-eval's own
``simple_evaluate`` on the same base, adapter, chat template and dtype (bf16 on the card), and on two
GPUs lm-eval's data-parallel mode through xtrain's launcher gives the numbers of one (float32: the
rows' batches differ between one and two processes). The tasks and the chat LoRA are
tests/test_evaluate.py's (tests/support/lm_tasks.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.lm_tasks import GEN, LIMIT, MC, sft_overrides, write_tasks

from xtrain.cli import main

pytestmark = pytest.mark.usefixtures("private_caches")


@pytest.fixture(scope="module")
def sft(tmp_path_factory) -> tuple[Path, Path]:
    from support.chains import train_stage

    tasks = write_tasks(tmp_path_factory.mktemp("lm-tasks"))
    return train_stage(tmp_path_factory, "sft-bench-gpu", sft_overrides(tmp_path_factory, tasks)), tasks


def _values(results: dict) -> dict:
    return {t: {k: v for k, v in r.items() if "," in k} for t, r in results["results"].items()}


def _xtrain_eval(run: Path, tasks: Path, out: Path, dtype: str, *more: str) -> dict:
    args = ["eval", str(run), "--tasks", str(tasks), "--limit", str(LIMIT), "--dtype", dtype, "--no-base",
            "--no-save", "-o", str(out), *more]  # fmt: skip
    assert main(args) == 0
    return json.loads(out.read_text())


def test_xtrain_eval_on_the_gpu_equals_lm_evals_own(sft, tmp_path):
    import lm_eval
    from lm_eval.tasks import TaskManager

    from xtrain.builtin import ensure_builtin_model

    run, tasks = sft
    found = _xtrain_eval(run, tasks, tmp_path / "one.json", "bfloat16")
    (model,) = found["models"]
    adapter = str(run / "adapter")
    own = lm_eval.simple_evaluate(
        model="hf",
        model_args={"pretrained": str(ensure_builtin_model("builtin:tiny-llama-chat")), "tokenizer": adapter,
                    "dtype": "bfloat16", "peft": adapter},  # fmt: skip
        tasks=[GEN, MC], task_manager=TaskManager(include_path=str(tasks), include_defaults=False),
        apply_chat_template=True, limit=LIMIT, batch_size=8, device="cuda", log_samples=False,
    )  # fmt: skip
    assert _values(model["results"]) == _values(own)


@pytest.mark.two_gpus
def test_two_gpus_score_as_one(sft, tmp_path):
    run, tasks = sft
    one = _xtrain_eval(run, tasks, tmp_path / "one.json", "float32", "--processes", "1")
    two = _xtrain_eval(run, tasks, tmp_path / "two.json", "float32", "--processes", "2")
    assert two["processes"] == 2
    mine, theirs = _values(two["models"][0]["results"]), _values(one["models"][0]["results"])
    assert mine.keys() == theirs.keys() and all(mine[t] == pytest.approx(theirs[t]) for t in theirs)
