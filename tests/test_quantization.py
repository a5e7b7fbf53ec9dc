"""``model.quantization`` (QLoRA through bitsandbytes, on CPU here): the BitsAndBytesConfig and the
refusals as pure functions; real runs of the tiny built-ins in 4 bits (causal-lm in its own
processes: 1 vs 2 processes over gloo, kill -9 + resume, save_merged, predict; vision-language and
an 8-bit run in this process); the adapter reloads in plain peft on a 4-bit and a 16-bit base."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from xtrain.errors import XtrainError
from xtrain.model import quantization
from xtrain.model.quantization import Backend, backend_problem, bnb_settings

pytest.importorskip("bitsandbytes")

# ---------------------------------------------------------------------------------------------
# Pure decisions


def test_4bit_is_nf4_with_double_quant_computing_in_the_run_precision():
    cuda_bf16 = bnb_settings("4bit", "bf16", "cuda")
    assert cuda_bf16 == {
        "load_in_4bit": True,
        "bnb_4bit_quant_type": "nf4",
        "bnb_4bit_use_double_quant": True,
        "bnb_4bit_compute_dtype": "bfloat16",
    }
    assert bnb_settings("4bit", "fp16", "cuda")["bnb_4bit_compute_dtype"] == "float16"
    assert bnb_settings("4bit", "no", "cuda")["bnb_4bit_compute_dtype"] == "float32"
    assert bnb_settings("4bit", "bf16", "cpu")["bnb_4bit_compute_dtype"] == "float32"  # CPU: fp32
    assert bnb_settings("8bit", "bf16", "cuda") == {"load_in_8bit": True}
    # under FSDP the packed 4-bit weights are stored in the dtype FSDP gathers in, so they shard
    assert "bnb_4bit_quant_storage" not in cuda_bf16
    assert bnb_settings("4bit", "bf16", "cuda", fsdp=True)["bnb_4bit_quant_storage"] == "bfloat16"
    assert bnb_settings("4bit", "no", "cuda", fsdp=True)["bnb_4bit_quant_storage"] == "float32"
    skip = quantization.skip_patterns(("visual", "merger"))
    assert bnb_settings("8bit", None, "cpu", skip)["llm_int8_skip_modules"] == skip


def test_skip_patterns_match_the_vision_tower_at_any_depth_and_keep_the_heads():
    from transformers.quantizers.quantizers_utils import should_convert_module

    skip = quantization.skip_patterns(("visual", "merger"))
    assert not should_convert_module("model.visual.blocks.0.attn.qkv", skip)
    assert not should_convert_module("visual.merger.mlp.0", skip)
    assert not should_convert_module("lm_head", skip)
    assert not should_convert_module("classifier", skip)  # transformers' default misses it (bias last)
    assert not should_convert_module("model.decoder.proj_out", quantization.skip_patterns(()))
    assert should_convert_module("model.language_model.layers.0.self_attn.q_proj", skip)
    assert should_convert_module("model.visualizer.fc", skip)  # a whole name, not a prefix


GOOD = Backend(version="0.50.2", devices=frozenset({"cpu", "cuda"}), gpu_library=True, torch_cuda="12.6")


@pytest.mark.parametrize(
    ("device", "backend", "says", "fix"),
    [
        ("mps", GOOD, "does not run on Apple MPS", "model.quantization=null"),
        ("cuda", Backend(version=None), "which is not installed", 'install "bitsandbytes>='),
        ("cpu", Backend(version="0.43.0", devices=frozenset({"cpu"})), "needs bitsandbytes >= 0.46.1", "-U"),
        ("xpu", GOOD, "has no xpu backend", "bitsandbytes>="),
        ("cpu", Backend("0.50.2", import_error="libfoo missing"), "does not import: libfoo missing", "-U"),
        (
            "cuda",
            Backend("0.50.2", frozenset({"cpu", "cuda"}), False, "libcudart.so.12: cannot open", "12.6"),
            "no working library for CUDA 12.6: libcudart.so.12: cannot open",
            "--force-reinstall",
        ),
    ],
)
def test_refusals_are_one_line_with_the_fix(device, backend, says, fix):
    problem = backend_problem("4bit", device, backend)
    assert problem is not None and says in problem.message and fix in (problem.hint or "")
    assert "\n" not in problem.one_line()
    assert backend_problem("4bit", "cuda", GOOD) is None and backend_problem("8bit", "cpu", GOOD) is None


def test_the_installed_bitsandbytes_runs_on_cpu():
    backend = quantization.read_backend()
    assert backend.version is not None and "cpu" in backend.devices
    assert backend_problem("4bit", "cpu", backend) is None


def test_full_fine_tune_and_tasks_without_it_are_refused_through_the_cli(tmp_path, capsys):
    from xtrain.cli import main

    config = tmp_path / "job.yaml"
    config.write_text("model:\n  name_or_path: builtin:tiny-llama\n  task: causal-lm\n  quantization: 4bit\n")
    for extra, says in (
        (["lora.enabled=false"], "model.quantization=4bit trains LoRA adapters on frozen 4bit weights"),
        (["model.task=image-classification"], "model.quantization is for tasks causal-lm"),
    ):
        code = main(["train", str(config), *extra, "--dry-run"])
        err = capsys.readouterr().err
        lines = [line for line in err.splitlines() if line.strip()]
        assert code == 2 and len(lines) == 1 and says in lines[0], err


def test_dry_run_says_the_weights_are_quantized(tmp_path):
    from typer.testing import CliRunner

    from xtrain.cli import app

    config = tmp_path / "job.yaml"
    config.write_text("model:\n  name_or_path: builtin:tiny-llama\n  task: causal-lm\n  quantization: nf4\n")
    result = CliRunner().invoke(app, ["train", str(config), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "Weights: base weights loaded as 4-bit NF4 with double quantization" in result.output


def test_a_cuda_snapshot_is_planned_without_this_machines_bitsandbytes(tmp_path, capsys, machines_dir):
    """``--dry-run --facts`` plans another machine: a CPU-only bitsandbytes here is no refusal."""
    from xtrain.cli import main

    config = tmp_path / "job.yaml"
    config.write_text("model:\n  name_or_path: builtin:tiny-llama\n  task: causal-lm\n  quantization: 8bit\n")
    facts = machines_dir / "windows-2x4090.json"
    code = main(["train", str(config), "--dry-run", "--facts", str(facts), "--platform", "windows"])
    out = capsys.readouterr().out
    assert code == 0 and "Weights: base weights loaded as 8-bit LLM.int8" in out, out


def test_each_process_loads_onto_its_own_device(monkeypatch):
    """Each rank's Run places it on its local rank's GPU, never GPU 0 for every rank (a process
    alone: the current GPU); the 4/8-bit load goes there in the run's precision, stored in FSDP's
    dtype when accelerate launch shards with FSDP."""
    from types import SimpleNamespace

    from xtrain.planning.context import LaunchContext
    from xtrain.planning.run import Run, process_device
    from xtrain.tasks.validation import load_config

    gpus, cpu = SimpleNamespace(device="cuda", cpu=False), SimpleNamespace(device="cpu", cpu=True)
    launch = {"WORLD_SIZE": "4", "RANK": "1", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}
    rank1 = LaunchContext.from_env(launch)
    assert process_device(gpus, rank1) == "cuda:1"
    assert process_device(gpus, LaunchContext()) == "cuda"
    assert process_device(cpu, rank1) == "cpu"
    fsdp = LaunchContext.from_env({**launch, "ACCELERATE_USE_FSDP": "true"})
    assert Run(None, gpus, None, fsdp, "cuda:1").fsdp and not Run(None, gpus, None, rank1, "cuda:1").fsdp

    monkeypatch.setattr(quantization, "check_backend", lambda quantization, device_type: None)
    cfg = load_config(None, ["model.quantization=4bit"])
    loaded = quantization.load_kwargs(cfg, "cuda:3", "bf16", fsdp=True)
    assert loaded["device_map"] == {"": torch.device("cuda", 3)}
    q = loaded["quantization_config"]
    assert q.bnb_4bit_compute_dtype == q.bnb_4bit_quant_storage == torch.bfloat16
    assert quantization.load_kwargs(cfg, "cpu", "no")["device_map"] == {"": "cpu"}


def _quantize(config: Path, quantization: str) -> None:
    """``model.quantization`` added to a causal-lm job's YAML (``support.jobs.make_job``)."""
    task = "  task: causal-lm\n"
    config.write_text(config.read_text().replace(task, f"{task}  quantization: {quantization}\n"))


@pytest.mark.slow
def test_a_worker_refuses_a_broken_bitsandbytes_in_one_line(tmp_path):
    """``python -m xtrain.run`` (no CLI check before it): the worker's own refusal, exit 2."""
    from support.jobs import make_job, python_run, run_xtrain

    job = make_job(tmp_path / "job", steps=1)
    job.config.write_text(
        job.config.read_text().replace("  task: causal-lm\n", "  task: causal-lm\n  quantization: 4bit\n")
    )
    shadow = tmp_path / "shadow" / "bitsandbytes"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text(
        "raise ImportError('libbitsandbytes_cpu.so: cannot open shared object file')\n"
    )
    env = {**job.env, "PYTHONPATH": str(shadow.parent)}
    proc = run_xtrain(python_run("--config", str(job.config), f"run.output_dir={tmp_path / 'out'}"), env)
    lines = [line for line in proc.stderr.splitlines() if "bitsandbytes" in line]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert len(lines) == 1 and "does not import: libbitsandbytes_cpu.so: cannot open" in lines[0]


# ---------------------------------------------------------------------------------------------
# Real runs: causal-lm in 4 bits in its own processes (gloo on CPU)


@pytest.fixture(scope="module")
def qjob(tmp_path_factory):
    from support.jobs import make_job

    job = make_job(tmp_path_factory.mktemp("qlora"), steps=4, save_every=2)
    _quantize(job.config, "4bit")
    text = job.config.read_text()
    job.config.write_text(text.replace("run:\n", "run:\n  eval_at_start: true\n  save_merged: true\n"))
    return job


@pytest.fixture(scope="module")
def qstraight(qjob):
    from support.jobs import train_once

    return train_once(qjob)[0]


@pytest.mark.slow
def test_4bit_lora_trains_causal_lm(qstraight):
    result = json.loads((qstraight / "train_result.json").read_text())
    first, last = result["eval_history"][0], result["eval_history"][-1]
    assert (first["step"], last["step"]) == (0, 4)
    assert last["eval_loss"] < first["eval_loss"]
    assert set(result["outputs"]) >= {"adapter", "merged"}


@pytest.mark.slow
def test_one_and_two_processes_give_the_same_eval_loss(qjob, qstraight):
    from support.jobs import assert_same_training, python_run, run_xtrain

    out = qjob.root / "two"
    args = ("--processes", "2", "--config", str(qjob.config), f"run.output_dir={out}")
    proc = run_xtrain(python_run(*args), qjob.env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    two = json.loads((out / "train_result.json").read_text())
    assert (two["world_size"], two["accumulation"], two["run_info"]["backend"]) == (2, 1, "gloo")
    assert_same_training(qstraight, out)


@pytest.mark.slow
def test_kill_and_resume_is_exact(qjob, qstraight):
    from support.jobs import assert_same_training, python_run, run_until, run_xtrain

    out = qjob.root / "killed"
    args = ["--config", str(qjob.config), f"run.output_dir={out}", "run.resume=auto"]
    marker = out / "checkpoints" / "step-2" / "xtrain_state.json"
    assert run_until(python_run(*args), qjob.env, marker.exists) == -9
    proc = run_xtrain(python_run(*args), qjob.env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((out / "train_result.json").read_text())["resumed_from"]
    assert_same_training(qstraight, out, exact=True)


def _four_bit():
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(**bnb_settings("4bit", None, "cpu"))


def test_adapter_reloads_in_plain_peft_on_a_4bit_and_a_16bit_base(qstraight):
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    adapter = qstraight / "adapter"
    base = json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"]
    saved = load_file(str(adapter / "adapter_model.safetensors"))
    four = AutoModelForCausalLM.from_pretrained(base, quantization_config=_four_bit(), device_map={"": "cpu"})
    half = AutoModelForCausalLM.from_pretrained(base, dtype=torch.bfloat16)
    ids = torch.tensor([[1, 5, 9, 13, 17, 21]])
    for model in (four, half):
        peft = PeftModel.from_pretrained(model, str(adapter))
        state = peft.state_dict()
        for key, value in saved.items():  # every saved weight is in the model, unchanged
            loaded = state[key.replace(".weight", ".default.weight")]
            torch.testing.assert_close(loaded.float(), value.float(), rtol=0, atol=1e-2)
        with torch.no_grad():
            assert torch.isfinite(peft(ids).logits.float()).all()


def test_save_merged_merges_into_a_fresh_unquantized_base(qstraight):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(qstraight / "merged")
    assert getattr(merged.config, "quantization_config", None) is None
    assert type(merged.model.layers[0].self_attn.q_proj) is torch.nn.Linear
    base = json.loads((qstraight / "adapter" / "adapter_config.json").read_text())["base_model_name_or_path"]
    adapter = str(qstraight / "adapter")
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), adapter)
    ids = torch.tensor([[1, 5, 9, 13, 17, 21]])
    with torch.no_grad():
        torch.testing.assert_close(merged(ids).logits, adapted(ids).logits, rtol=0, atol=1e-4)


def test_predict_runs_a_quantized_runs_output(qstraight):
    from xtrain.predict import predict
    from xtrain.tasks.contract import PredictRequest

    rows = predict(qstraight, PredictRequest(inputs=[], prompts=["Once upon a time"], max_new_tokens=4))
    assert len(rows) == 1 and rows[0]["input"] == "Once upon a time" and rows[0]["output"]


def test_predict_loads_a_quantized_runs_base_in_4bit_as_training_did(qstraight):
    """The run records ``model.quantization`` with its adapter; predict loads the base in 4 bits
    (bitsandbytes' Linear4bit, on the CPU here as on a GPU), with the same logits as the adapter
    put by hand on a base loaded with training's BitsAndBytesConfig, and predicts the same twice."""
    import bitsandbytes as bnb
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from xtrain.predict import load_predictor, predict
    from xtrain.tasks.contract import PredictRequest

    adapter = qstraight / "adapter"
    assert json.loads((adapter / "xtrain_run.json").read_text())["quantization"] == "4bit"
    _, loaded = load_predictor(qstraight)
    assert any(isinstance(m, bnb.nn.Linear4bit) for m in loaded.model.modules())
    base = json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"]
    four = AutoModelForCausalLM.from_pretrained(base, quantization_config=_four_bit(), device_map={"": "cpu"})
    by_hand = PeftModel.from_pretrained(four, str(adapter)).eval()
    ids = torch.tensor([[1, 5, 9, 13, 17, 21]])
    with torch.no_grad():
        assert torch.equal(loaded.model(ids).logits, by_hand(ids).logits)
    request = PredictRequest(inputs=[], prompts=["Once upon a time"], max_new_tokens=4)
    assert predict(qstraight, request) == predict(qstraight, request)


def test_a_run_recorded_without_its_quantization_is_read_from_its_checkpoints(qstraight):
    """Runs saved before the record named ``quantization``: the newest checkpoint's config says it."""
    from xtrain.trained import RunTask, trained_quantization

    assert trained_quantization(qstraight / "adapter", RunTask("causal-lm")) == "4bit"
    assert (
        trained_quantization(qstraight / "adapter", RunTask("causal-lm", record={"quantization": None}))
        is None
    )


def test_predict_on_a_gpu_loads_as_training_did(monkeypatch):
    """The GPU branch without a GPU: training's NF4 settings computing in bf16 (fp16 where the card
    has no bf16), the heads and the adapter's whole-trained modules kept, on the current GPU."""
    monkeypatch.setattr(quantization, "read_backend", lambda: GOOD)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    for bf16, compute in ((True, torch.bfloat16), (False, torch.float16)):
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda bf16=bf16: bf16)
        kwargs = quantization.predict_kwargs("4bit", torch.device("cuda"), ("visual",), ["model.score"])
        config = kwargs["quantization_config"]
        assert kwargs["device_map"] == {"": 0}
        assert config.load_in_4bit and config.bnb_4bit_use_double_quant
        assert config.bnb_4bit_quant_type == "nf4"
        assert config.bnb_4bit_compute_dtype == compute
        assert config.llm_int8_skip_modules == quantization.skip_patterns(("visual", "score"))
    eight = quantization.predict_kwargs("8bit", torch.device("cuda", 1))
    assert eight["quantization_config"].load_in_8bit and eight["device_map"] == {"": 1}


def test_predict_without_bitsandbytes_loads_16bit_on_the_cpu_and_refuses_on_a_gpu(monkeypatch):
    from support.packages import hide_bitsandbytes

    hide_bitsandbytes(monkeypatch)
    assert quantization.predict_kwargs("4bit", torch.device("cpu")) == {}
    with pytest.raises(
        XtrainError, match="model.quantization=4bit needs bitsandbytes, which is not installed"
    ):
        quantization.predict_kwargs("4bit", torch.device("cuda", 0))
    assert quantization.predict_kwargs(None, torch.device("cuda", 0)) == {}


# ---------------------------------------------------------------------------------------------
# In this process: vision-language in 4 bits, causal-lm in 8 bits


def _train_here(overrides: list[str], out: Path, reporter=None):
    from xtrain.machine.facts import Facts
    from xtrain.planning.rules import make_plan
    from xtrain.tasks.validation import load_config
    from xtrain.train.loop import train

    cfg = load_config(None, [*overrides, f"run.output_dir={out}", "run.tensorboard=false", "run.log_every=1"])
    return train(cfg, make_plan(Facts(torch_version="2.13.0", gloo_available=True)), reporter)


@pytest.mark.usefixtures("private_caches")
def test_the_banner_counts_4bit_weights_unpacked(tmp_path):
    """The run banner's parameter count of a 4-bit run is the unquantized model's (with its LoRA
    adapters), not the packed bytes bitsandbytes stores two weights to."""
    from transformers import AutoModelForCausalLM

    from xtrain import builtin
    from xtrain.train.report import ListReporter

    stories = [json.dumps(row) + "\n" for row in builtin.story_examples(8, seed=11)]
    (tmp_path / "train.jsonl").write_text("".join(stories))
    reporter = ListReporter()
    overrides = ["model.name_or_path=builtin:tiny-llama", "model.task=causal-lm", "model.quantization=4bit",
                 f"data.train={tmp_path / 'train.jsonl'}", "data.eval=null", "data.max_length=32",
                 "batch.per_device=4", "batch.global_batch=4", "run.max_steps=1"]  # fmt: skip
    _train_here(overrides, tmp_path / "out", reporter)
    info = next(data for kind, data in reporter.events if kind == "start")
    plain = AutoModelForCausalLM.from_pretrained(builtin.ensure_builtin_model("builtin:tiny-llama"))
    assert info.total_params == sum(p.numel() for p in plain.parameters()) + info.trainable_params


def _vqa_rows(root: Path, n: int) -> tuple[Path, Path]:
    """``n`` shape questions (train) and 4 more (eval) as jsonl files with their images."""
    import random

    from xtrain.builtin import vision_language as builtin_vl

    (root / "img").mkdir(parents=True)
    rng, rows = random.Random(11), []
    for i in range(n + 4):
        shape, colour = rng.choice(builtin_vl.SHAPES), rng.choice(list(builtin_vl.COLOURS))
        builtin_vl.draw_shape(shape, colour, rng).save(root / "img" / f"{i}.png")
        rows.append(json.dumps(builtin_vl.conversation(f"img/{i}.png", shape, colour, rng)) + "\n")
    (root / "train.jsonl").write_text("".join(rows[:n]))
    (root / "eval.jsonl").write_text("".join(rows[n:]))
    return root / "train.jsonl", root / "eval.jsonl"


@pytest.mark.slow
@pytest.mark.usefixtures("private_caches")
def test_4bit_lora_trains_vision_language_with_the_vision_tower_unquantized(tmp_path, monkeypatch):
    import bitsandbytes as bnb

    from xtrain.tasks import common

    finish_model = common.finish_model

    kept: dict[str, set[str]] = {}

    def spy(model, cfg, task, apply_lora=None):
        kinds = {type(m).__name__ for n, m in model.named_modules() if n.startswith("model.visual.")}
        language = {type(m) for n, m in model.named_modules() if n.startswith("model.language_model.")}
        kept["vision"], kept["language"] = kinds, {k.__name__ for k in language}
        assert bnb.nn.Linear4bit in language
        return finish_model(model, cfg, task, apply_lora)

    monkeypatch.setattr(common, "finish_model", spy)  # the task calls common.finish_model
    train, eval_ = _vqa_rows(tmp_path / "vqa", 24)
    result = _train_here(
        [
            "model.name_or_path=builtin:tiny-qwen2-vl",
            "model.task=vision-language",
            "model.quantization=4bit",
            f"data.train={train}",
            f"data.eval={eval_}",
            "data.max_length=48",
            "lora.projector=true",
            "batch.per_device=4",
            "batch.global_batch=8",
            "optim.lr=0.01",
            "run.max_steps=6",
            "run.eval_at_start=true",
            "run.save_merged=true",
            "generation.max_new_tokens=3",
        ],
        tmp_path / "vl",
    )
    assert "Linear4bit" not in kept["vision"] and "Linear" in kept["vision"]
    first, last = result.eval_history[0], result.eval_history[-1]
    assert last["eval_loss"] < first["eval_loss"]
    from transformers import AutoModelForImageTextToText

    merged = AutoModelForImageTextToText.from_pretrained(result.outputs["merged"])
    assert not any("Linear4bit" in type(m).__name__ for m in merged.modules())


@pytest.mark.slow
@pytest.mark.usefixtures("private_caches")
def test_8bit_lora_trains_causal_lm(tmp_path):
    from xtrain import builtin

    stories = [json.dumps(row) + "\n" for row in builtin.story_examples(40, seed=11)]
    (tmp_path / "train.jsonl").write_text("".join(stories[:32]))
    (tmp_path / "eval.jsonl").write_text("".join(stories[32:]))
    result = _train_here(
        [
            "model.name_or_path=builtin:tiny-llama",
            "model.task=causal-lm",
            "model.quantization=8bit",
            f"data.train={tmp_path / 'train.jsonl'}",
            f"data.eval={tmp_path / 'eval.jsonl'}",
            "data.max_length=48",
            "batch.per_device=4",
            "optim.lr=0.005",
            "run.max_steps=4",
            "run.eval_at_start=true",
        ],
        tmp_path / "int8",
    )
    first, last = result.eval_history[0], result.eval_history[-1]
    assert last["eval_loss"] < first["eval_loss"]
    adapter = Path(result.outputs["adapter"])
    assert json.loads((adapter / "adapter_config.json").read_text())["peft_type"] == "LORA"


@pytest.mark.slow
@pytest.mark.usefixtures("private_caches")
def test_seq_cls_trains_its_head_whole_and_merges_with_its_labels(tmp_path):
    from transformers import AutoModelForSequenceClassification

    words = ("good great", "bad awful", "meh ok")
    rows = [{"text": f"{words[i % 3]} {i}", "label": ("pos", "neg", "mid")[i % 3]} for i in range(36)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:32]))
    (tmp_path / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[32:]))
    result = _train_here(
        [
            "model.name_or_path=builtin:tiny-bert",
            "model.task=seq-cls",
            "model.quantization=4bit",
            f"data.train={tmp_path / 'train.jsonl'}",
            f"data.eval={tmp_path / 'eval.jsonl'}",
            "batch.per_device=8",
            "run.max_steps=2",
            "run.save_merged=true",
        ],
        tmp_path / "cls",
    )
    merged = AutoModelForSequenceClassification.from_pretrained(result.outputs["merged"])
    assert merged.config.id2label == {0: "mid", 1: "neg", 2: "pos"}
    assert type(merged.bert.encoder.layer[0].attention.self.query) is torch.nn.Linear
