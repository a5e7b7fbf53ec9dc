"""`xtrain bench`: the pure math (scaling, FLOPs, MFU, peak table, sizes, rates from logging
windows) and one real run as a subprocess (1 vs 2 processes, gloo on CPU). No timing
assertions: only that the numbers are there, positive and consistent with each other."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import warm

from xtrain.bench.flops import find_peak, flops_per_token, mfu, peak_tflops, scaling
from xtrain.bench.rates import RunFigures, Window, steady_rates
from xtrain.bench.result import BenchResult
from xtrain.bench.sizes import SIZES, pick_size

REPO = Path(__file__).resolve().parents[1]


# -- pure math --------------------------------------------------------------------------------------
def test_scaling_is_speedup_over_processes() -> None:
    assert scaling(100.0, 180.0, 2) == pytest.approx((1.8, 0.9))
    assert scaling(50.0, 50.0, 4) == pytest.approx((1.0, 0.25))
    assert scaling(0.0, 10.0, 2) == (None, None)


def test_flops_per_token_full_is_6n_and_lora_about_4n() -> None:
    total, embedding = 1_000_000, 100_000
    n = total - embedding
    assert flops_per_token(total, embedding, trainable_params=total) == pytest.approx(6 * n + 2 * embedding)
    assert flops_per_token(total, embedding, trainable_params=1000) == pytest.approx(4 * n + 2000)


def test_mfu_is_achieved_over_peak_per_device() -> None:
    # 1000 tokens/s over 2 devices at 6e9 FLOPs/token = 3e12 FLOP/s per device of a 100 TFLOP/s peak
    assert mfu(1000.0, 6e9, 2, 100.0) == pytest.approx(0.03)
    assert mfu(1000.0, 6e9, 2, None) is None
    assert mfu(0.0, 6e9, 1, 100.0) is None


@pytest.mark.parametrize(
    ("name", "precision", "tflops", "entry"),
    [
        ("NVIDIA GeForce RTX 4090", "bf16", 165.2, "RTX 4090"),
        ("NVIDIA GeForce RTX 4090", "no", 82.6, "RTX 4090"),
        ("NVIDIA GeForce RTX 3090", "fp16", 71.0, "RTX 3090"),
        ("NVIDIA GeForce RTX 3090 Ti", "bf16", 80.0, "RTX 3090 Ti"),
        ("NVIDIA A100-SXM4-80GB", "bf16", 312.0, "A100"),
        ("NVIDIA A100 80GB PCIe", "no", 19.5, "A100"),
        ("NVIDIA H100 80GB HBM3", "bf16", 989.4, "H100 SXM"),
        ("NVIDIA H100 PCIe", "fp16", 756.5, "H100 PCIe"),
        ("NVIDIA H100 NVL", "bf16", 835.5, "H100 NVL"),
        ("NVIDIA H200", "bf16", 989.4, "H200"),
        ("NVIDIA L40S", "bf16", 362.1, "L40S"),
        ("NVIDIA L40", "bf16", 181.0, "L40"),
        ("NVIDIA L4", "bf16", 121.0, "L4"),
        ("Tesla T4", "fp16", 65.0, "T4"),
    ],
)
def test_peak_table_lookup_by_gpu_name(name: str, precision: str, tflops: float, entry: str) -> None:
    peak = find_peak(name)
    assert peak is not None and peak.name == entry
    assert peak_tflops(name, precision) == pytest.approx(tflops)


def test_peak_table_unknowns() -> None:
    assert find_peak("Some Future GPU") is None
    assert peak_tflops("Some Future GPU", "bf16") is None
    assert find_peak("NVIDIA A10G") is None  # not the A10: no guessing
    assert peak_tflops("Tesla T4", "bf16") is None  # no bf16 on Turing
    assert peak_tflops(None, "bf16") is None


def test_fp32_uses_tf32_peak_only_when_tf32_is_on() -> None:
    assert peak_tflops("NVIDIA A100-SXM4-40GB", "no", tf32=False) == pytest.approx(19.5)
    assert peak_tflops("NVIDIA A100-SXM4-40GB", "no", tf32=True) == pytest.approx(156.0)


def test_pick_size_fills_the_device() -> None:
    assert pick_size("cpu", None) == "tiny"
    assert pick_size("mps", None) == "tiny"
    assert pick_size("cuda", 8 * 1024) == "small"
    assert pick_size("cuda", 24 * 1024) == "base"
    assert pick_size("cuda", None) == "base"


def test_base_size_is_about_100m_parameters() -> None:
    total, _, trainable = SIZES["base"].param_counts(None)
    assert 90e6 < total < 130e6 and trainable == total


@pytest.mark.parametrize("lora_r", [None, 16])
def test_param_counts_match_the_built_model(lora_r: int | None) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    from xtrain.bench.sizes import LORA_TARGETS

    s = SIZES["tiny"]
    config = LlamaConfig(
        vocab_size=s.vocab, hidden_size=s.hidden, intermediate_size=s.intermediate,
        num_hidden_layers=s.layers, num_attention_heads=s.heads, num_key_value_heads=s.heads,
        tie_word_embeddings=False,
    )  # fmt: skip
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    if lora_r is not None:
        model = get_peft_model(model, LoraConfig(r=lora_r, target_modules=LORA_TARGETS))
    total, embedding, trainable = s.param_counts(lora_r)
    assert total == sum(p.numel() for p in model.parameters())
    assert trainable == sum(p.numel() for p in model.parameters() if p.requires_grad or lora_r is None)
    assert embedding == model.get_input_embeddings().weight.numel()


def test_steady_rates_leave_out_the_first_window() -> None:
    # windows of 5 steps, global batch 8: the first (warm-up) is slow and left out
    windows = [Window(5, 5, 4.0, 400.0), Window(10, 5, 40.0, 4000.0), Window(15, 5, 20.0, 2000.0)]
    samples, tokens, steps = steady_rates(windows, global_batch=8)
    # 80 samples in 40/40 + 40/20 = 3 s
    assert samples == pytest.approx(80 / 3)
    assert tokens == pytest.approx(8000 / 3)
    assert steps == 10


def test_render_shows_mfu_and_scaling_for_cuda() -> None:
    from rich.console import Console

    from xtrain.commands.bench import render

    result = BenchResult(
        size="base", model={"params": 110e6, "trainable": 1.2e6, "layers": 12, "hidden": 768, "seq_len": 1024,
                            "global_batch": 16, "flops_formula": "4*N + 2*N_trainable"},
        mode="lora", device="cuda", gpu="NVIDIA GeForce RTX 4090", precision="bf16", tf32=True,
        launcher="accelerate", peak_tflops=82.6, peak_name="RTX 4090", peak_source="FIELD_NOTES",
        runs=[RunFigures(1, 10.0, 10240.0, 40, 35, 16, 2, "windows", 9.0, 9000.0, 30.0, None, 0.41),
              RunFigures(2, 18.0, 18432.0, 40, 35, 16, 1, "windows", 17.0, 17000.0, 30.0, "nccl", 0.37)],
        speedup=1.8, efficiency=0.9,
        allreduce={"ok": True, "backend": "nccl", "size_mib": 16.0, "busbw_gbps": 20.5, "cpu_staged": False},
    )  # fmt: skip
    console = Console(record=True, width=200)
    render(console, result)
    text = console.export_text()
    assert "41.0%" in text and "37.0%" in text
    assert "speedup 1.80x" in text and "90%" in text
    assert "20.50 GB/s" in text
    assert "RTX 4090 82.6 TFLOP/s" in text


# -- the command ---------------------------------------------------------------------------------
def _env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_HOME=str(tmp_path / "hf"),
        XTRAIN_CACHE=str(tmp_path / "xtrain-cache"),
        TMPDIR=str(tmp_path),
        OMP_NUM_THREADS="1",
        PYTHONWARNINGS="ignore",
    )
    env.pop("XTRAIN_PLATFORM", None)
    return env


def _xtrain(args: list[str], env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    return warm.run(
        [sys.executable, "-m", "xtrain", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--model-size", "huge"], "--model-size 'huge' is unknown"),
        (["--steps", "1"], "--steps must be at least 2"),
        (["--processes", "zero"], "--processes needs a whole number"),
        (["--precision", "fp8"], "--precision 'fp8' is unknown"),
    ],
)
def test_bad_options_are_one_line(args: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    """In-process: the refusal comes before anything is imported or started (a process of its own
    cost a warm interpreter's start, seconds, for a one-line answer)."""
    from xtrain.cli import main

    assert main(["bench", *args]) == 2
    out, err = capsys.readouterr()
    assert says in err and len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err
    assert out == ""


@pytest.mark.slow
def test_bench_json_one_vs_two_processes(tmp_path: Path) -> None:
    proc = _xtrain(["bench", "--json", "--steps", "4", "--processes", "2"], _env(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)  # stdout is the JSON and nothing else
    assert result["size"] == "tiny" and result["device"] == "cpu"
    one, two = result["runs"]
    assert (one["processes"], two["processes"]) == (1, 2)
    for run in (one, two):
        assert run["samples_per_s"] > 0 and run["tokens_per_s"] > 0
        assert run["global_batch"] == 16  # the same global batch in both runs
        assert run["rate_source"] == "windows" and 0 < run["measured_steps"] < run["steps"]
        assert run["mfu"] is None  # no MFU without CUDA
    assert (one["accumulation"], two["accumulation"]) == (2, 1)
    assert two["backend"] == "gloo"
    assert result["speedup"] == pytest.approx(two["samples_per_s"] / one["samples_per_s"])
    assert result["efficiency"] == pytest.approx(result["speedup"] / 2)
    assert result["allreduce"]["ok"] and result["allreduce"]["busbw_gbps"] > 0
    assert not list(tmp_path.glob("xtrain-bench-*")), "the work folder is removed"
