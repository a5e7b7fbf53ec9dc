"""`xtrain train --fsdp / --deepspeed` (or accelerate's default config asking for them): the
`accelerate launch` switches, and the one-line refusals where they cannot run."""

from __future__ import annotations

import sys

import pytest
from conftest import MACHINES_DIR, load_machine
from support.jobs import REPO, make_job, run_xtrain

from xtrain.errors import XtrainError
from xtrain.launch import sharding
from xtrain.planning.resolve import resolve

EXAMPLE = REPO / "examples" / "seq-cls.yaml"
XTRAIN = [sys.executable, "-m", "xtrain"]


def plan_of(name: str):
    return resolve(facts=load_machine(name)).plan


def test_requested_by_options_or_by_the_accelerate_config() -> None:
    assert sharding.requested(True, None, None) == "fsdp"
    assert sharding.requested(False, "zero3", None) == "zero3"
    assert sharding.requested(False, None, {"distributed_type": "FSDP"}) == "fsdp"
    ds = {"distributed_type": "DEEPSPEED", "deepspeed_config": {"zero_stage": 3}}
    assert sharding.requested(False, None, ds) == "zero3"
    assert sharding.requested(False, "zero2", ds) == "zero2"  # the option wins
    assert sharding.requested(False, None, {"distributed_type": "MULTI_GPU"}) is None
    with pytest.raises(XtrainError, match="exclude each other"):
        sharding.requested(True, "zero2", None)
    with pytest.raises(XtrainError, match="unknown"):
        sharding.requested(False, "zero1", None)


def test_switches_parse_with_accelerates_own_parser() -> None:
    from accelerate.commands.launch import launch_command_parser

    from xtrain.launch.accelerate_launcher import accelerate_args

    plan = plan_of("linux-2x3090")
    flags = sharding.launch_flags("fsdp", from_options=True)
    args = launch_command_parser().parse_args(accelerate_args("xtrain.run", [], plan, sharding=flags))
    assert args.use_fsdp and not args.multi_gpu and args.num_processes == 2
    assert (args.fsdp_version, args.fsdp_state_dict_type) == ("2", "SHARDED_STATE_DICT")
    flags = sharding.launch_flags("zero3", from_options=True)
    args = launch_command_parser().parse_args(accelerate_args("xtrain.run", [], plan, sharding=flags))
    assert args.use_deepspeed and args.zero_stage == 3 and args.zero3_save_16bit_model == "true"
    # from accelerate's config file: only the switch, accelerate reads the settings from the file
    assert sharding.launch_flags("fsdp", from_options=False) == ["--use_fsdp"]


@pytest.mark.parametrize(
    ("kind", "machine", "line"),
    [
        ("fsdp", "windows-2x4090", "FSDP does not run on native Windows"),
        ("zero3", "windows-2x4090", "DeepSpeed does not run on native Windows"),
        ("fsdp", "linux-cpu", "FSDP needs CUDA GPUs; this plan runs on cpu"),
        ("zero2", "macos-arm64", "DeepSpeed needs CUDA GPUs"),
    ],
)
def test_refused_in_one_line_where_it_cannot_run(kind: str, machine: str, line: str) -> None:
    with pytest.raises(XtrainError) as e:
        sharding.check(kind, plan_of(machine), True, "pip install deepspeed")  # type: ignore[arg-type]
    assert line in e.value.message and "\n" not in e.value.one_line()
    if "Windows" in line:
        assert "model.quantization=4bit" in (e.value.hint or "")


def test_deepspeed_not_installed_names_the_pip_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "deepspeed" else real(n, *a))
    with pytest.raises(XtrainError, match="DeepSpeed is not installed") as e:
        sharding.check("zero2", plan_of("linux-2x3090"), True, "python -m pip install deepspeed")
    assert "python -m pip install deepspeed" in (e.value.hint or "")
    sharding.check("fsdp", plan_of("linux-2x3090"), True, "")  # FSDP needs no extra package


def test_xtrain_train_dry_run_and_refusal(tmp_path_factory: pytest.TempPathFactory) -> None:
    env = make_job(tmp_path_factory.mktemp("sharded-cli")).env
    facts = str(MACHINES_DIR / "linux-2x3090.json")
    proc = run_xtrain([*XTRAIN, "train", str(EXAMPLE), "--fsdp", "--dry-run", "--facts", facts], env)
    assert proc.returncode == 0, proc.stderr
    assert "accelerate launch --use_fsdp --fsdp_version 2" in proc.stdout
    assert "--multi_gpu" not in proc.stdout
    # this machine has no CUDA GPU: refused before anything starts
    proc = run_xtrain([*XTRAIN, "train", str(EXAMPLE), "--fsdp", "--dry-run"], env)
    assert proc.returncode == 2
    assert "FSDP needs CUDA GPUs" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_benchmarks_after_sharded_weights_are_warned_before_the_run() -> None:
    """lm-eval's model is data-parallel (a whole copy a process): after FSDP or ZeRO-3, said first."""
    from xtrain.train.preflight.software import benchmarks_sharded

    assert benchmarks_sharded(None) == [] and benchmarks_sharded("zero2") == []  # ZeRO-2: weights whole
    for kind in ("fsdp", "zero3"):
        (note,) = benchmarks_sharded(kind)
        assert note.level == "warning" and f"under {kind}: lm-eval loads the whole" in note.text
