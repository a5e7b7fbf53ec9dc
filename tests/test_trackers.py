"""Experiment trackers (run.report_to): the key and its shorthand, a tracker that is not installed
refused in one line with its pip command, and real offline runs: the MLflow file store under
output_dir and a W&B offline run hold the loss history, the eval metrics, the config and the plan."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import pytest
from support.jobs import REPO, offline_env, run_xtrain

from xtrain.errors import XtrainError
from xtrain.planning.resolve import trackers
from xtrain.tasks.validation import load_config
from xtrain.train import preflight, tracking

EXAMPLE = REPO / "examples" / "seq-cls.yaml"


def config(*overrides: str):
    return load_config(str(EXAMPLE), list(overrides))


# -- the key ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ((), ("tensorboard",)),  # auto: the shorthand's default
        (("run.tensorboard=false",), ()),
        (("run.report_to=none",), ()),
        (("run.report_to=[]",), ()),
        (("run.report_to=MLflow,wandb",), ("mlflow", "wandb")),
        (("run.report_to=[wandb, tensorboard, wandb]",), ("wandb", "tensorboard")),
        (("run.report_to=mlflow", "run.tensorboard=false"), ("mlflow",)),
    ],
)
def test_report_to_and_its_shorthand(overrides: tuple[str, ...], expected: tuple[str, ...]) -> None:
    assert trackers(config(*overrides)) == expected


@pytest.mark.parametrize(
    ("overrides", "line"),
    [
        (("run.report_to=mlfow",), "run.report_to takes tensorboard, mlflow, wandb, trackio"),
        (("run.report_to=[tensorboard]", "run.tensorboard=false"), "run.tensorboard=false conflicts"),
    ],
)
def test_bad_report_to_is_one_line(overrides: tuple[str, ...], line: str) -> None:
    with pytest.raises(XtrainError) as e:
        config(*overrides)
    assert line in e.value.one_line() and "\n" not in e.value.one_line()
    if "mlfow" in overrides[0]:
        assert e.value.hint == "did you mean 'mlflow'?"


@pytest.mark.parametrize(
    ("shell", "command"),
    [
        ("bash", "/opt/py/bin/python -m pip install 'mlflow-skinny>=2.12' 'trackio>=0.2'"),
        (
            "powershell",
            "& 'C:\\Program Files\\py\\python.exe' -m pip install 'mlflow-skinny>=2.12' 'trackio>=0.2'",
        ),
    ],
)
def test_a_tracker_not_installed_names_its_pip_line(monkeypatch, shell: str, command: str) -> None:
    monkeypatch.setattr(tracking, "installed", lambda name: name in ("tensorboard", "wandb"))
    exe = "C:\\Program Files\\py\\python.exe" if shell == "powershell" else "/opt/py/bin/python"
    preflight.check_trackers(("tensorboard", "wandb"), shell, exe)  # installed: nothing to say
    with pytest.raises(XtrainError) as e:
        preflight.check_trackers(("tensorboard", "mlflow", "trackio"), shell, exe)
    assert e.value.message == "run.report_to names mlflow and trackio, which are not installed"
    assert e.value.hint == f"install with: {command}"


def test_tracker_packages_are_the_extras_of_pyproject() -> None:
    """The install line names the package itself (the public `xtrain` is another project), the
    same requirement the checkout's extra asks for."""
    import tomllib

    extras = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    assert {n: [req] for n, req in tracking.PACKAGES.items()} == {n: extras[n] for n in tracking.PACKAGES}


def test_xtrain_train_refuses_a_missing_tracker_before_starting(tmp_path: Path) -> None:
    if tracking.installed("trackio"):
        pytest.skip("trackio is installed here")
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "xtrain", "train", str(EXAMPLE), "run.report_to=trackio"]
    proc = run_xtrain([*cmd, f"run.output_dir={out}"], offline_env(tmp_path, tmp_path / "cache"))
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert "run.report_to names trackio" in proc.stderr and "-m pip install 'trackio>=0.2'" in proc.stderr
    assert not out.exists()  # no process started, nothing written


# -- real trackers, offline -------------------------------------------------------------------------
def wandb_history(run_dir: Path) -> list[dict]:
    """The history rows of a W&B offline run, read from its ``run-*.wandb`` file: a 7-byte
    header, then LevelDB-log records (32 KiB blocks; each record: crc32, length, type) of
    protobuf ``Record`` messages."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = next(run_dir.glob("run-*.wandb")).read_bytes()
    assert data[:4] == b":W&B"
    block, pos, pending, rows = 32768, 7, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # too little room left for a header: the block is padded
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if length == 0 and kind == 0:
            break
        pending += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a FULL record, or the LAST piece of one
            record = pb.Record()
            record.ParseFromString(pending)
            pending = b""
            if record.HasField("history"):
                items = record.history.item  # (a key as ``key`` or as its ``nested_key`` parts)
                rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in items})
    return rows


@pytest.fixture
def offline_trackers(monkeypatch, tmp_path: Path) -> None:
    """W&B offline with its folders here; MLflow with no tracking URI (xtrain's file store)."""
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for var in ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_ALLOW_FILE_STORE", "WANDB_API_KEY"):
        monkeypatch.delenv(var, raising=False)


@pytest.mark.slow
def test_mlflow_and_wandb_offline_hold_the_loss_history(offline_trackers, tmp_path: Path) -> None:
    pytest.importorskip("mlflow")
    pytest.importorskip("wandb")
    from mlflow.tracking import MlflowClient
    from test_loop import build_tiny, cpu_plan, tiny_config

    from xtrain.train.loop import train

    out = tmp_path / "run"
    cfg = tiny_config(out, max_steps=4, eval_every=2)
    cfg.run.report_to = ["mlflow", "wandb"]
    result = train(cfg, cpu_plan(), build=build_tiny)
    assert [s for s, _ in result.losses] == [1, 2, 3, 4]
    assert not (out / "logs").exists()  # tensorboard was not asked for

    client = MlflowClient(tracking_uri=(out / "mlruns").resolve().as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("xtrain").experiment_id])
    assert run.info.run_name == "run" and run.info.status == "FINISHED"
    assert [[m.step, m.value] for m in client.get_metric_history(run.info.run_id, "loss")] == result.losses
    evals = client.get_metric_history(run.info.run_id, "eval_loss")
    assert [(m.step, m.value) for m in evals] == [(h["step"], h["eval_loss"]) for h in result.eval_history]
    params = run.data.params
    assert params["run.max_steps"] == "4" and params["plan.processes"] == "1"
    assert params["plan.global_batch"] == "8" and params["plan.precision"] == "no"
    assert {"samples_per_s", "tokens_per_s", "lr"} <= set(run.data.metrics)

    (wandb_run,) = (out / "wandb").glob("offline-run-*")
    rows = wandb_history(wandb_run)
    assert [[r["_step"], r["loss"]] for r in rows if "loss" in r] == result.losses
    assert [r["eval_loss"] for r in rows if "eval_loss" in r] == [h["eval_loss"] for h in result.eval_history]
