"""Precision from the checkpoint: ``model.dtype: auto`` reads the checkpoint's dtype (config.json's
``torch_dtype``/``dtype``, where it is on this machine) and the rules train a bf16 checkpoint in bf16
on GPUs that run it; ``xtrain train`` and ``accelerate launch -m xtrain.run`` with the config that
``xtrain configure`` wrote agree (the worker side is resolved with the environment accelerate's own
launcher code builds from that file); an explicit fp16 over bf16 weights is a warning line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import load_machine

from xtrain.model.configs import checkpoint_dtype, dtype_in_config
from xtrain.planning.context import LaunchContext
from xtrain.planning.resolve import exported_precision, resolve
from xtrain.tasks.validation import load_config

pytestmark = pytest.mark.usefixtures("private_caches")  # conftest: one offline cache for the session

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "lora-causal-lm.yaml"
GEFORCE = ("windows-2x4090", "wsl2-2x4090")


@pytest.fixture(scope="module")
def tiny_llama() -> Path:
    from xtrain import builtin

    return builtin.ensure_builtin_model("builtin:tiny-llama")


def checkpoint(folder: Path, source: Path, **config: object) -> Path:
    """A copy of the built-in llama whose config.json says ``config`` (its weights as they are:
    planning reads only the config)."""
    shutil.copytree(source, folder)
    data = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    data.pop("torch_dtype", None)
    data.pop("dtype", None)
    data.update(config)
    (folder / "config.json").write_text(json.dumps(data), encoding="utf-8")
    return folder


def job(tmp_path: Path, model: Path, *overrides: str):
    return load_config(
        str(EXAMPLE), [f"model.name_or_path={model}", f"run.output_dir={tmp_path / 'out'}", *overrides]
    )


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"torch_dtype": "bfloat16"}, "bfloat16"),  # transformers < 4.56 writes torch_dtype
        ({"dtype": "bfloat16"}, "bfloat16"),  # >= 4.56 writes dtype
        ({"dtype": "torch.float16"}, "float16"),
        ({"dtype": "float32"}, "float32"),
        ({"text_config": {"dtype": "bfloat16"}}, "bfloat16"),  # a composite (vision-language) config
        ({"dtype": "auto"}, None),
        ({}, None),
    ],
)
def test_the_dtype_a_config_names(config: dict, expected: str | None) -> None:
    assert dtype_in_config(config) == expected


@pytest.mark.parametrize("machine", GEFORCE)
def test_a_bf16_checkpoint_plans_bf16_on_4090s_and_an_fp32_one_fp16(tmp_path, tiny_llama, machine) -> None:
    bf16 = job(tmp_path, checkpoint(tmp_path / "bf16", tiny_llama, torch_dtype="bfloat16"))
    fp32 = job(tmp_path, checkpoint(tmp_path / "fp32", tiny_llama, torch_dtype="float32"))
    assert checkpoint_dtype(bf16) == "bfloat16" and checkpoint_dtype(fp32) == "float32"
    facts = load_machine(machine)
    got = resolve(bf16, facts=facts, checkpoint_dtype=checkpoint_dtype(bf16))
    assert got.plan.mixed_precision == got.settings.precision == "bf16"
    assert "the checkpoint's config.json says bfloat16" in got.plan.reasons["mixed_precision"]
    assert not [f for f in got.findings if f.code.startswith("precision-")]
    got = resolve(fp32, facts=facts, checkpoint_dtype=checkpoint_dtype(fp32))
    assert got.plan.mixed_precision == "fp16" and "GeForce" in got.plan.reasons["mixed_precision"]
    # unknown (a hub id not in the cache): today's rule, nothing read from the network
    hub = load_config(str(EXAMPLE), ["model.name_or_path=someone/not-cached-7b"])
    assert checkpoint_dtype(hub) is None
    assert resolve(hub, facts=facts, checkpoint_dtype=None).plan.mixed_precision == "fp16"


def test_an_explicit_fp16_over_bf16_weights_is_kept_and_warned(tmp_path, tiny_llama) -> None:
    cfg = job(tmp_path, checkpoint(tmp_path / "m", tiny_llama, dtype="bfloat16"), "run.mixed_precision=fp16")
    got = resolve(cfg, facts=load_machine("windows-2x4090"), checkpoint_dtype=checkpoint_dtype(cfg))
    assert got.plan.mixed_precision == "fp16" and got.plan.reasons["mixed_precision"] == "chosen by the user"
    (warning,) = [f for f in got.findings if f.code == "precision-fp16-bf16-weights"]
    assert warning.severity == "warn" and "65504" in warning.message and "bf16" in warning.fix


def configure_env(machine: str, tmp_path: Path) -> dict[str, str]:
    """The environment a worker of ``accelerate launch -m xtrain.run`` gets on ``machine`` from the
    config ``xtrain configure`` writes there (accelerate's own code builds it from the file; the
    rank variables torchrun adds, for a MULTI_GPU config, by hand)."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env, prepare_simple_launcher_cmd_env

    from xtrain.launch import accelerate_config as ac

    plan = resolve(facts=load_machine(machine)).plan  # what configure plans: no train config
    path = tmp_path / "default_config.yaml"
    path.write_text(ac.to_yaml(ac.config_for(plan)), encoding="utf-8")
    args = launch_command_parser().parse_args(["--config_file", str(path), "-m", "xtrain.run"])
    args = _validate_launch_command(args)[0]
    if args.multi_gpu:
        env = dict(prepare_multi_gpu_env(args))
        env.update(WORLD_SIZE="2", RANK="0", LOCAL_RANK="0", LOCAL_WORLD_SIZE="2")
    else:
        env = dict(prepare_simple_launcher_cmd_env(args)[1])
    return {
        k: v for k, v in env.items() if k.startswith(("ACCELERATE_", "MASTER_", "WORLD", "RANK", "LOCAL_"))
    }


@pytest.mark.parametrize("machine", GEFORCE)
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_xtrain_train_and_accelerate_launch_agree(
    tmp_path, tiny_llama, capsys, monkeypatch, machine, dtype
) -> None:
    from xtrain.cli import main

    model = checkpoint(tmp_path / "m", tiny_llama, torch_dtype=dtype)
    config = tmp_path / "job.yaml"
    config.write_text(
        EXAMPLE.read_text(encoding="utf-8").replace("builtin:tiny-llama", str(model)), encoding="utf-8"
    )
    facts = Path(__file__).parent / "fixtures" / "machines" / f"{machine}.json"
    monkeypatch.chdir(EXAMPLE.parent)  # the example's data files (--dry-run reads the data)
    assert main(["train", str(config), "--dry-run", "--facts", str(facts)]) == 0
    out = capsys.readouterr().out
    planned = "bf16" if dtype == "bfloat16" else "fp16"
    assert f", {planned}, TF32;" in out and f"Precision: {planned} (" in out

    env = configure_env(machine, tmp_path)
    assert env["ACCELERATE_MIXED_PRECISION"] == "fp16"  # the machine's default, in the file
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    cfg = load_config(str(config), [])
    worker = resolve(
        cfg,
        facts=load_machine(machine),
        context=LaunchContext.from_env(),
        checkpoint_dtype=checkpoint_dtype(cfg),
    )
    assert worker.plan.mixed_precision == worker.settings.precision == planned


def test_a_precision_the_user_gave_accelerate_is_a_choice(tmp_path, tiny_llama, monkeypatch) -> None:
    """One that differs from the machine's default (an edited config, --mixed_precision bf16) wins
    over the checkpoint rule; the config's own run.mixed_precision wins over both."""
    cfg = job(tmp_path, checkpoint(tmp_path / "m", tiny_llama, dtype="float32"))
    facts = load_machine("wsl2-2x4090")
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    assert exported_precision() == "bf16"
    got = resolve(cfg, facts=facts, checkpoint_dtype="float32")
    assert (
        got.plan.mixed_precision == "bf16"
        and "accelerate launch exported bf16" in got.plan.reasons["mixed_precision"]
    )
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "no")
    assert resolve(cfg, facts=facts, checkpoint_dtype="bfloat16").plan.mixed_precision == "no"
    cfg = job(tmp_path, tmp_path / "m", "run.mixed_precision=fp16")
    assert resolve(cfg, facts=facts, checkpoint_dtype="float32").plan.mixed_precision == "fp16"
