"""run.compile: torch.compile through accelerate's TorchDynamoPlugin, after LoRA; checkpoints and
outputs keep the model's own names (no "_orig_mod."), resume works; refused in one line where it
cannot work (a pure rule: Windows or a CUDA GPU without Triton)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import torch

from xtrain import builtin
from xtrain.errors import XtrainError
from xtrain.planning.resolve import resolve
from xtrain.planning.rules import compile_blocker
from xtrain.tasks.validation import load_config

pytestmark = pytest.mark.usefixtures("private_caches")  # conftest: one offline cache for the session

STORIES = [r["text"] for r in builtin.story_examples(24, seed=5)]


@pytest.mark.parametrize(
    ("os_kind", "device", "triton", "blocked"),
    [
        ("linux", "cpu", False, False),  # inductor's C++ backend: a compiler, no Triton
        ("macos", "cpu", False, False),
        ("linux", "cuda", True, False),
        ("linux", "cuda", False, True),
        ("wsl2", "cuda", False, True),
        ("windows", "cpu", False, True),
        ("windows", "cuda", False, True),
        ("windows", "cuda", True, False),  # triton-windows installed
    ],
)
def test_compile_blocker_is_a_rule_of_os_device_and_triton(
    os_kind: str, device: str, triton: bool, blocked: bool
) -> None:
    assert (compile_blocker(os_kind, device, triton) is not None) is blocked


def test_compile_is_refused_in_one_line_where_triton_is_missing(machine) -> None:
    cfg = load_config(None, ["run.compile=true"])
    windows = machine("windows-2x4090")
    windows.packages.pop("triton", None)
    with pytest.raises(XtrainError) as e:
        resolve(cfg, facts=windows)
    assert (
        e.value.message == "run.compile=true: torch.compile needs Triton on Windows, and it is not installed"
    )
    assert "pip install triton-windows" in str(e.value.hint) and "\n" not in str(e.value)
    windows.packages["triton"] = "3.5.0"
    assert resolve(cfg, facts=windows).settings.compile
    settings = resolve(cfg, facts=machine("linux-cpu")).settings
    assert settings is not None and settings.compile
    assert not resolve(load_config(None, []), facts=machine("linux-cpu")).settings.compile


# -- training -----------------------------------------------------------------------------------------


def _cfg(train: Path, out: Path, *extra: str):
    return load_config(
        None,
        [
            "model.name_or_path=builtin:tiny-llama", "model.task=causal-lm", f"data.train={train}",
            "data.eval=null", "data.packing=concatenate", "data.max_length=32",  # one shape: one graph
            "batch.per_device=2", "batch.global_batch=4", "run.max_steps=4", "run.save_every=2",
            "run.log_every=1", "run.tensorboard=false", "lora.dropout=0.0", "run.compile=true",
            f"run.output_dir={out}", *extra,
        ],
    )  # fmt: skip


def _plan():
    from xtrain.machine import probe
    from xtrain.planning import rules
    from xtrain.planning.plan import Overrides

    return rules.make_plan(probe.collect(quick=True), Overrides(num_processes=1))


def _train_stop_resume(tmp_path: Path) -> tuple[object, object, Path]:
    """A straight run, and one stopped after step 2 (Ctrl+C) and resumed: (straight, resumed, its folder)."""
    from xtrain.train.loop import TrainingStopped, train
    from xtrain.train.report import NullReporter

    data = tmp_path / "s.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in STORIES), encoding="utf-8")

    class InterruptAt(NullReporter):
        def progress(self, step, total, metrics=None):
            if step == 1:
                os.kill(os.getpid(), signal.SIGINT)  # during step 2

    straight = train(_cfg(data, tmp_path / "a"), _plan())
    out = tmp_path / "b"
    with pytest.raises(TrainingStopped):
        train(_cfg(data, out), _plan(), InterruptAt())
    resumed = train(_cfg(data, out), _plan())
    assert resumed.resumed_from and resumed.resumed_from.endswith("step-2")
    return straight, resumed, out


def _losses(result) -> list[float]:
    return [loss for _, loss in result.losses]


def _check_outputs(tmp_path: Path, out: Path) -> None:
    from safetensors.torch import load_file

    names = set(load_file(str(out / "checkpoints" / "step-4" / "model.safetensors")))
    assert names and not any("_orig_mod" in n for n in names)  # the model's own names, loadable uncompiled
    a = load_file(str(tmp_path / "a" / "adapter" / "adapter_model.safetensors"))
    b = load_file(str(out / "adapter" / "adapter_model.safetensors"))
    assert a.keys() == b.keys() and not any("_orig_mod" in n for n in a)
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=1e-6)


def test_the_accelerator_compiles_the_prepared_model_only_when_asked(tmp_path: Path, monkeypatch) -> None:
    from accelerate.utils import is_compiled_module

    from xtrain.planning.context import LaunchContext
    from xtrain.planning.run import for_process
    from xtrain.train.distributed import accelerator

    monkeypatch.setattr(accelerator, "COMPILE_BACKEND", "aot_eager")
    monkeypatch.setenv("ACCELERATE_DYNAMO_BACKEND", "INDUCTOR")  # an accelerate config's: not obeyed
    for asked in (False, True):
        cfg = load_config(None, [f"run.compile={str(asked).lower()}", f"run.output_dir={tmp_path}"])
        acc = accelerator.build_accelerator(for_process(cfg, LaunchContext.from_env(), plan=_plan()))
        try:
            model = acc.prepare(torch.nn.Linear(4, 2))
            assert is_compiled_module(model) is asked
            assert list(acc.unwrap_model(model, keep_torch_compile=False).state_dict()) == ["weight", "bias"]
        finally:
            accelerator.release(acc)


@pytest.mark.slow  # three short trainings, each traced by dynamo: ~30 s on a loaded 2-core CPU
def test_compile_trains_checkpoints_and_resumes(tmp_path: Path, monkeypatch) -> None:
    """Through accelerate's plugin with the aot_eager backend (dynamo + autograd tracing, no C++
    build: seconds); the slow test below runs inductor itself."""
    from xtrain.train.distributed import accelerator

    compiled: list[str] = []
    real_compile = torch.compile

    def spy(model, **kwargs):
        compiled.append(kwargs.get("backend"))
        return real_compile(model, **kwargs)

    monkeypatch.setattr(accelerator, "COMPILE_BACKEND", "aot_eager")
    monkeypatch.setattr(torch, "compile", spy)
    straight, resumed, out = _train_stop_resume(tmp_path)
    assert compiled == ["aot_eager"] * 3  # one model compiled per run, by accelerate's prepare
    assert _losses(resumed) == pytest.approx(_losses(straight), rel=1e-6)
    _check_outputs(tmp_path, out)


@pytest.mark.soak  # inductor's C++ build of a tiny llama: ~100 s on a loaded 2-core CPU (pytest -m soak)
def test_compile_with_inductor_on_cpu_trains_and_resumes(tmp_path: Path) -> None:
    straight, resumed, out = _train_stop_resume(tmp_path)
    assert _losses(resumed) == pytest.approx(_losses(straight), rel=1e-5)
    _check_outputs(tmp_path, out)
