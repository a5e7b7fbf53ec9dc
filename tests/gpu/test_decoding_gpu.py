"""xtrain's decode loop on CUDA (issue 48): the static cache and the compiled step (CUDA graphs)
that ``decoding.decode_settings`` picks there give the completions of the model's own cache; the
compiled step serves batch after batch of one shape (its cache and mask buffer reused); a GRPO
run on the GPU decodes that way. Timings: benchmarks/grpo_decode.py (gpu_session.sh)."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.usefixtures("private_caches")


@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    from support.decoding import lora_lm

    return lora_lm(tmp_path_factory, "cuda")


@pytest.mark.parametrize("compiled", [False, True])
def test_the_static_and_compiled_steps_give_the_model_s_own_cache_s_completions(lm, compiled):
    from xtrain.model.decoding import DecodeSettings, Sampling, decode_settings, generate

    model, tok, ids, mask = lm
    assert decode_settings("cuda", False, False, None, 64) == DecodeSettings(True, True, 64)
    args = {"max_new_tokens": 24, "pad_id": tok.pad_token_id, "stop": [tok.eos_token_id], "group": 4}
    sampled = {"sampling": Sampling(1.0, 0.95), "seeds": list(range(12))}
    settings = DecodeSettings(static=True, compiled=compiled, max_length=64)
    for how in ({}, sampled):
        own = generate(model, ids, mask, **args, **how)
        for _ in range(3):  # batch after batch of one shape: the same cache, the same graph
            again = generate(model, ids, mask, **args, **how, settings=settings)
            assert torch.equal(again.ids, own.ids) and torch.equal(again.mask, own.mask)


def test_a_grpo_run_on_the_gpu_decodes_on_the_static_cache(tmp_path):
    """The GRPO quickstart's job, a few steps on one GPU: the run's decode settings are CUDA's (a
    static cache as long as the longest prompt and completion, compiled where Triton is), and its
    evaluation gives a reward."""
    from pathlib import Path

    from xtrain.planning.resolve import resolve
    from xtrain.tasks import build_workload
    from xtrain.tasks.validation import load_config
    from xtrain.train.loop import train

    seen = {}

    def build(run, main_process_first):
        workload = build_workload(run, main_process_first)
        seen["decode"] = workload.forward.decode
        return workload

    job = Path(__file__).resolve().parents[2] / "xtrain" / "builtin" / "jobs" / "quickstart-grpo.yaml"
    cfg = load_config(job, [f"run.output_dir={tmp_path / 'out'}", "run.max_steps=6", "run.eval_every=null",
                            "run.eval_at_start=false", "run.report_to=none"])  # fmt: skip
    result = train(cfg, resolve(cfg, processes=1).plan, build=build)
    decode = seen["decode"]
    assert decode.static and decode.max_length == cfg.data.max_length + cfg.grpo.max_completion_length
    try:
        import triton  # noqa: F401
    except ImportError:
        assert not decode.compiled
    else:
        assert decode.compiled
    assert result.eval_metrics["reward"] == result.eval_metrics["reward"]  # a number, not NaN
