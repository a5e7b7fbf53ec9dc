"""The filesystem failing under a write (disk full, permission lost): one line, the partial write
removed, the earlier checkpoints intact, and resume from the last complete one afterwards.

CI cannot fill a disk, so the faults are raised where the libraries would raise them, with the
words they use (measured on a full tmpfs: safetensors' "os error 28", torch.save's stream-writer
error, Python's OSError)."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
import torch
from test_loop import build_tiny, cpu_plan, tiny_config

from xtrain.errors import XtrainError
from xtrain.train.checkpoint.write_faults import WriteFailed, disk_fault

# the words of the libraries (safetensors' Rust error, torch.save's stream writer)
SAFETENSORS_FULL = "Error while serializing: I/O error: No space left on device (os error 28)"
TORCH_FULL = "[enforce fail at inline_container.cc:778] . PytorchStreamWriter failed writing file data/0: file write failed"  # noqa: E501


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (OSError(errno.ENOSPC, "No space left on device"), "no space left on the device"),
        (PermissionError(errno.EACCES, "Permission denied"), "permission denied"),
        (OSError(errno.EROFS, "Read-only file system"), "the file system is read-only"),
        (OSError(errno.EDQUOT, "Disk quota exceeded"), "the disk quota is exceeded"),
        (RuntimeError(SAFETENSORS_FULL), "no space left on the device"),
        (RuntimeError(TORCH_FULL), "an I/O error"),
        (RuntimeError("[enforce fail at inline_container.cc:603] . unexpected pos 64 vs 0"), "an I/O error"),
        (RuntimeError("There is not enough space on the disk"), "no space left on the device"),  # Windows
    ],
)  # fmt: skip
def test_the_filesystems_faults_are_recognised_in_every_librarys_words(error: Exception, reason: str) -> None:
    assert disk_fault(error) == reason
    try:  # also when a library re-raises it as something else
        raise ValueError("saving failed") from error
    except ValueError as wrapped:
        assert disk_fault(wrapped) == reason


@pytest.mark.parametrize(
    "error",
    [FileNotFoundError(errno.ENOENT, "No such file"), ValueError("bad value"), XtrainError("no space left")],
)
def test_other_errors_are_not_disk_faults(error: Exception) -> None:
    assert disk_fault(error) is None


def _fail_saves_into(folder_part: str, error: Exception, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.save raises ``error`` for files under a folder named ``folder_part``, after writing a
    few bytes there (what a full disk leaves)."""
    real = torch.save

    def save(obj, f, *args, **kwargs):
        if folder_part in str(f):
            Path(f).write_bytes(b"half")
            raise error
        return real(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save)


def test_disk_full_during_a_checkpoint_keeps_the_previous_one_and_resume_continues(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from xtrain.train.checkpoint.layout import list_checkpoints
    from xtrain.train.loop import train

    out = tmp_path / "run"
    _fail_saves_into("step-4.tmp", RuntimeError(TORCH_FULL), monkeypatch)
    with pytest.raises(WriteFailed) as failed:
        train(tiny_config(out, max_steps=6, save_every=2), cpu_plan(), build=build_tiny)
    line = failed.value.one_line()
    assert f"could not write checkpoint step-4 to {out / 'checkpoints'}: an I/O error" in line
    assert f"the partial write was removed, checkpoint {out / 'checkpoints' / 'step-2'} is intact" in line
    assert "run the same command again" in line and failed.value.exit_code == 2
    assert [s for s, _ in list_checkpoints(out)] == [2]
    assert not (out / "checkpoints" / "step-4.tmp").exists()
    assert not (out / "adapter").exists() and not (out / "train_result.json").exists()

    monkeypatch.undo()  # room again: the same run resumes from step 2 and finishes
    cfg = tiny_config(out, max_steps=6, save_every=2)
    cfg.run.resume = "auto"
    result = train(cfg, cpu_plan(), build=build_tiny)
    assert result.resumed_from == str(out / "checkpoints" / "step-2")
    assert result.final_step == 6 and (out / "adapter").is_dir()


def test_permission_lost_for_the_final_outputs_leaves_no_partial_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from xtrain.train.checkpoint import outputs
    from xtrain.train.loop import train

    out = tmp_path / "run"
    real = outputs.atomic.write_text

    def refuse(path, text):
        if Path(path).name == "train_result.json":
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real(path, text)

    monkeypatch.setattr(outputs.atomic, "write_text", refuse)
    with pytest.raises(
        WriteFailed, match=r"could not write the final outputs to .*: permission denied; the partial"
    ):
        train(tiny_config(out, max_steps=2, save_every=2), cpu_plan(), build=build_tiny)
    assert (out / "checkpoints" / "step-2").is_dir()  # the last checkpoint was written before
    assert not list(out.glob("*.tmp")) and not (out / "train_result.json").exists()


# Loaded by every process of the run below (PYTHONPATH): torch.save fails for rank 1's RNG file
# of checkpoint step-4, as a disk that filled up under that rank would.
SITECUSTOMIZE = """
import torch
_real = torch.save
def _save(obj, f, *args, **kwargs):
    if "step-4.tmp" in str(f) and "random_states_1" in str(f):
        raise OSError(28, "No space left on device", str(f))
    return _real(obj, f, *args, **kwargs)
torch.save = _save
"""


def test_one_ranks_disk_fault_stops_both_ranks_with_one_line(tmp_path: Path) -> None:
    from support.jobs import make_job, python_run, run_xtrain

    job = make_job(tmp_path / "job", steps=4, save_every=2)
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {**job.env, "PYTHONPATH": str(hook)}
    out = tmp_path / "out"
    proc = run_xtrain(
        python_run("--config", str(job.config), "--processes", "2", f"run.output_dir={out}"), env
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, proc.stderr[-3000:]
    assert "could not write checkpoint step-4" in errors[0] and "no space left on the device" in errors[0]
    assert "Traceback" not in proc.stderr
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-2"]
