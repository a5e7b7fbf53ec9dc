"""Sequence parallelism for vision-language rows on CUDA (docs/long-context.md#vision-language-rows):
what tests/test_sequence_parallel_vl.py and the kind "vision-language" of
tests/test_sequence_parallel.py prove over gloo on the CPU, through the loop on two GPUs over NCCL.

Written by review on a machine without a GPU (the session that wrote it had none): run it with
``python -m pytest -q tests/gpu/test_sequence_parallel_vl_gpu.py`` on a machine with two GPUs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "long-vision-language.yaml"


@pytest.mark.two_gpus
def test_vision_language_rows_on_two_gpus_train_as_one(tmp_path: Path) -> None:
    """examples/long-vision-language.yaml (the tiny Qwen2-VL) on one GPU on whole rows and on two
    with each row split (NCCL, fp32): the same logged step losses, within float32 rounding."""
    from support.jobs import offline_env, run_xtrain

    env = offline_env(tmp_path, tmp_path / "cache")
    results = {}
    for processes in (1, 2):
        out = tmp_path / f"p{processes}"
        cmd = [sys.executable, "-m", "xtrain.run", "--processes", str(processes), "--config", str(EXAMPLE),
               f"run.output_dir={out}", "run.mixed_precision=no", f"parallel.sequence={processes}",
               "run.max_steps=8", "run.log_every=1", "run.eval_every=null",
               "run.eval_at_start=false"]  # fmt: skip
        proc = run_xtrain(cmd, env)
        assert proc.returncode == 0, proc.stderr[-4000:]
        results[processes] = json.loads((out / "train_result.json").read_text())
    assert results[2]["run_info"]["sequence_parallel"] == 2
    for (_, one), (_, two) in zip(results[1]["losses"], results[2]["losses"], strict=True):
        assert two == pytest.approx(one, rel=1e-4)
