"""A sharded checkpoint (FSDP, DeepSpeed) resumes only under the same kind of launch: refused in
one line otherwise, before accelerate's loader fails on a missing file."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from accelerate.utils import DistributedType

from xtrain.errors import XtrainError
from xtrain.train.checkpoint import load
from xtrain.train.checkpoint.layout import written_by


def folder(root: Path, kind: str) -> Path:
    path = root / "step-2"
    path.mkdir()
    if kind == "FSDP":
        (path / "pytorch_model_fsdp_0").mkdir()
    elif kind == "DeepSpeed":
        (path / "pytorch_model").mkdir()
    else:
        (path / "model.safetensors").write_bytes(b"")
    return path


@pytest.mark.parametrize(
    ("written", "running", "line"),
    [
        (
            "FSDP",
            DistributedType.MULTI_GPU,
            "was written with FSDP; this run is launched without FSDP/DeepSpeed",
        ),
        ("plain", DistributedType.FSDP, "was written without FSDP/DeepSpeed; this run is launched with FSDP"),
        ("DeepSpeed", DistributedType.FSDP, "was written with DeepSpeed; this run is launched with FSDP"),
    ],
)
def test_a_checkpoint_resumes_under_the_launch_that_wrote_it(
    tmp_path: Path, written: str, running: DistributedType, line: str
) -> None:
    path = folder(tmp_path, written)
    assert written_by(path) == written
    loaded: list[str] = []
    acc = SimpleNamespace(distributed_type=running, load_state=loaded.append)
    with pytest.raises(XtrainError, match=line):
        load(acc, path)
    assert loaded == []  # refused before accelerate touched anything
    acc.distributed_type = {"FSDP": DistributedType.FSDP, "DeepSpeed": DistributedType.DEEPSPEED}.get(
        written, DistributedType.NO
    )
    load(acc, path)
    assert loaded == [str(path)]


def test_what_sharded_weights_cannot_do_is_refused_before_training() -> None:
    from xtrain.train.distributed import sharded

    fsdp = SimpleNamespace(distributed_type=DistributedType.FSDP)
    with pytest.raises(XtrainError, match="model.quantization=8bit does not work under FSDP"):
        sharded.check_quantization(fsdp, "8bit")
    sharded.check_quantization(fsdp, "4bit")
    sharded.check_quantization(SimpleNamespace(distributed_type=DistributedType.MULTI_GPU), "8bit")
    with pytest.raises(XtrainError, match="run.save_merged does not work under FSDP"):
        sharded.check_outputs(fsdp, save_merged=True, lora=True)
    sharded.check_outputs(fsdp, save_merged=True, lora=False)  # a full model: nothing to merge
    with pytest.raises(XtrainError, match="lora.init_weights=pissa does not work under FSDP or DeepSpeed"):
        sharded.check_outputs(fsdp, save_merged=False, lora=True, init_weights="pissa")
    sharded.check_outputs(fsdp, save_merged=False, lora=True, init_weights="gaussian")
