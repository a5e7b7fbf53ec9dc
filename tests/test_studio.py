"""xtrain studio without a browser: its guard against a real server (a bind beyond 127.0.0.1
without a token refused; the token, the host and the origin checked on every request; no file
outside the runs folder), a run's status read from its files alone (as a restarted studio reads
it), and the form made a config as ``key=`` on the command line reads it. The browser journeys
are tests/test_studio_browser.py's."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import studio as served

from xtrain.errors import XtrainError
from xtrain.runtime import run_control
from xtrain.runtime.lock import LOCK_NAME
from xtrain.studio import form, runs
from xtrain.train.run_files import HISTORY, read_history


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    from support.jobs import offline_env

    root = tmp_path_factory.mktemp("studio-env")
    return offline_env(root, root / "cache")


@pytest.fixture(scope="module")
def exposed(tmp_path_factory: pytest.TempPathFactory, env: dict[str, str]) -> served.Studio:
    """One studio bound to every interface (with its token), a run folder in it."""
    root = tmp_path_factory.mktemp("studio-runs") / "my runs ü"
    (root / "a run").mkdir(parents=True)
    (root / "a run" / HISTORY).write_text('{"kind": "log", "step": 2, "loss": 1.5}\n', encoding="utf-8")
    (root.parent / "secret.txt").write_text("not yours", encoding="utf-8")
    found = served.start(root, env, "--host", "0.0.0.0")
    yield found
    found.stop()


def test_a_non_local_bind_without_a_token_is_refused(tmp_path: Path, env: dict[str, str]) -> None:
    cmd = [sys.executable, "-m", "xtrain", "studio", "--runs", str(tmp_path), "--host", "0.0.0.0",
           "--no-token", "--port", "0", "--no-browser"]  # fmt: skip
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "has no token" in lines[0] and "Traceback" not in done.stderr


def test_requests_without_the_token_are_refused(exposed: served.Studio) -> None:
    local = f"http://127.0.0.1:{exposed.port}"
    assert exposed.url.startswith(f"http://{socket.gethostname()}:") and "?token=" in exposed.url
    code, answer = served.request(f"{local}/api/runs")
    assert code == 403 and "token" in answer["error"]
    code, _ = served.request(f"{local}/api/runs?token=wrong{exposed.token}")
    assert code == 403
    code, answer = served.request(f"{local}/api/runs?token={exposed.token}")
    assert code == 200 and [r["path"] for r in answer["runs"]] == ["a run"]
    auth = {"authorization": f"token {exposed.token}"}
    code, _ = served.request(f"{local}/api/runs", headers=auth)
    assert code == 200
    # the page's cookie, as the URL's token sets it
    with __import__("urllib.request").request.urlopen(f"{local}/?token={exposed.token}", timeout=30) as page:
        cookie = page.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
        assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
    code, _ = served.request(f"{local}/api/runs", headers={"cookie": cookie.split(";")[0]})
    assert code == 200


def test_a_post_from_another_origin_is_refused(exposed: served.Studio) -> None:
    local = f"http://127.0.0.1:{exposed.port}"
    url = f"{local}/api/run/stop?path=a%20run&token={exposed.token}"
    for headers in ({"origin": "http://evil.example"}, {"referer": "http://evil.example/page"}, {}):
        code, answer = served.request(url, "POST", {}, headers)
        assert code == 403 and "another origin" in answer["error"], headers
    assert run_control.stop_pending(exposed.runs / "a run") is False  # nothing was changed
    code, answer = served.request(url, "POST", {}, {"origin": local})
    assert code == 400 and answer["error"].startswith("a run is not running")  # past the guard: one line


def test_no_file_outside_the_runs_folder(exposed: served.Studio) -> None:
    local, token = f"http://127.0.0.1:{exposed.port}", exposed.token
    for query in (
        "path=..&name=secret.txt",
        "path=a%20run&name=../../secret.txt",
        "path=a%20run&name=/etc/passwd",
    ):
        code, answer = served.request(f"{local}/api/run/file?{query}&token={token}")
        assert code == 400 and "outside the runs folder" in answer["error"], query
        assert "not yours" not in json.dumps(answer)
    code, _ = served.request(f"{local}/api/run/file?path=a%20run&name={HISTORY}&token={token}")
    assert code == 200


def test_a_local_studio_answers_only_at_its_own_address(tmp_path: Path, env: dict[str, str]) -> None:
    """On 127.0.0.1 another name for the address (DNS rebinding) is refused, token or not."""
    local = served.start(tmp_path, env)
    try:
        assert local.url.startswith("http://127.0.0.1:")
        headers = {"host": f"evil.example:{local.port}"}
        code, answer = served.request(f"{local.base}api/runs?token={local.token}", headers=headers)
        assert code == 403 and "evil.example" in answer["error"]
        code, _ = served.request(f"{local.base}api/runs?token={local.token}")
        assert code == 200
        code, answer = served.request(f"{local.base}api/launch?token={local.token}", "POST", {"name": "../x"},
                                      {"origin": local.base.rstrip("/")})  # fmt: skip
        assert code == 400 and "folder name" in answer["error"] and not (tmp_path.parent / "x").exists()
    finally:
        local.stop()


def _lock(folder: Path, pid: int, started: float) -> None:
    info = {
        "pid": pid,
        "host": socket.gethostname(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)),
    }
    (folder / LOCK_NAME).write_text(json.dumps(info), encoding="utf-8")


def _checkpoint(folder: Path, step: int) -> None:
    found = folder / "checkpoints" / f"step-{step}"
    found.mkdir(parents=True)
    (found / "xtrain_state.json").write_text(json.dumps({"step": step, "total_steps": 10}), encoding="utf-8")


def test_a_runs_status_comes_from_its_files(tmp_path: Path) -> None:
    """What a restarted studio sees, folder by folder: a held lock, a stale one, the end record
    of the last launch, a result, checkpoints of a killed run; the history as it was written."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    cases = {}
    for name in ("running", "stale", "stopped", "failed", "finished", "killed"):
        cases[name] = tmp_path / name
        cases[name].mkdir()
    _lock(cases["running"], os.getpid(), time.time())
    lines = '{"kind": "eval", "step": 0, "eval_loss": 3.0}\n{"kind": "log", "step": 2, "loss": 2.5}\n'
    (cases["running"] / HISTORY).write_text(
        lines + '{"kind": "log", "st', encoding="utf-8"
    )  # half a line: later
    _lock(cases["stale"], dead.pid, time.time())
    run_control.write_end(cases["stopped"], 130, "stopped at step 4; checkpoint saved to ...")
    run_control.write_end(cases["failed"], 2, "data.train x.jsonl not found (check the path)")
    (cases["finished"] / "train_result.json").write_text(json.dumps({"final_step": 10, "total_steps": 10}))
    _checkpoint(cases["killed"], 6)
    found = {name: runs.status(folder) for name, folder in cases.items()}
    assert {k: v.state for k, v in found.items()} == {
        "running": "running", "stale": "empty", "stopped": "stopped", "failed": "failed",
        "finished": "finished", "killed": "interrupted",
    }  # fmt: skip
    assert found["running"].step == 2 and found["finished"].step == 10 and found["killed"].step == 6
    assert found["failed"].line.startswith("data.train x.jsonl not found")
    history = read_history(cases["running"])
    assert history is not None and history.eval_history == [{"step": 0, "eval_loss": 3.0}]
    assert [r["step"] for r in history.log_history] == [2]
    recipe = tmp_path / "a recipe"  # its launch record names its stages; the second never started
    (recipe / "1-causal-lm").mkdir(parents=True)
    record = runs.Launch(
        dead.pid, time.time() - 60, ["python", "-m", "xtrain", "train"], ["1-causal-lm", "2-grpo"]
    )
    (recipe / runs.LAUNCH_RECORD).write_text(record.to_json(), encoding="utf-8")
    run_control.write_end(recipe / "1-causal-lm", 1, "training diverged")
    listed = {e.path: e.status.state for e in runs.list_runs(tmp_path)}
    assert listed == {**{k: v.state for k, v in found.items()}, "a recipe/1-causal-lm": "failed",
                      "a recipe/2-grpo": "not started"}  # fmt: skip
    run_control.request_stop(cases["running"])
    assert runs.status(cases["running"]).stopping
    assert not run_control.stop_requested(cases["running"], since=time.time() + 60)  # an old request: dropped
    assert not run_control.stop_pending(cases["running"])


def test_the_form_reads_values_as_the_command_line_does(tmp_path: Path) -> None:
    cwd = tmp_path / "here"
    (cwd / "data").mkdir(parents=True)
    (cwd / "data" / "train ü.jsonl").write_text("{}\n", encoding="utf-8")
    values = {"run.max_steps": "30", "lora.target_modules": "[q_proj, v_proj]", "run.eval_every": "",
              "data.train": "data/train ü.jsonl", "optim.lr": "2e-4"}  # fmt: skip
    draft = form.compose(
        {"name": "Lauf 1", "stages": [{"job": "causal-lm", "values": values}]}, tmp_path, cwd
    )
    (stage,) = draft.stages
    import yaml

    written = yaml.safe_load(stage.text)
    assert written["run"]["max_steps"] == 30 and "eval_every" not in written["run"]  # cleared: the default
    assert written["lora"]["target_modules"] == ["q_proj", "v_proj"]
    assert written["data"]["train"] == str(cwd / "data" / "train ü.jsonl")  # made absolute
    assert (
        written["run"]["output_dir"] == str(tmp_path / "Lauf 1")
        and stage.config == tmp_path / "Lauf 1" / "config.yaml"
    )
    assert draft.flags == []  # every GPU, one process each: xtrain train's own default
    placed = {"name": "x", "gpus": "0, 1", "processes": "2", "stages": [{"job": "causal-lm"}]}
    assert form.compose(placed, tmp_path, cwd).flags == ["--gpus", "0,1", "--processes", "2"]
    recipe = form.compose(
        {"name": "chain", "stages": [{"job": "causal-lm"}, {"task": "preference"}]}, tmp_path, cwd
    )
    assert [s.output_dir.name for s in recipe.stages] == ["1-causal-lm", "2-preference"]
    assert yaml.safe_load(recipe.stages[1].text)["model"]["name_or_path"] == "previous"
    for bad in ("", "..", "a/b", ".hidden", "x" * 81):
        with pytest.raises(XtrainError, match="folder name"):
            form.run_name(bad)
    with pytest.raises(XtrainError, match="unknown key|did you mean"):
        form.compose(
            {"name": "x", "stages": [{"job": "causal-lm", "values": {"run.max_step": "3"}}]}, tmp_path, cwd
        )


def test_without_uvicorn_it_says_what_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import importlib.util

    from xtrain.cli import main
    from xtrain.studio import command

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "uvicorn" else real(name, *a)
    )
    with pytest.raises(XtrainError, match=r"needs uvicorn .*pip install .*\"uvicorn>=0.30\""):
        command.studio(tmp_path, None, "127.0.0.1", True, False)
    assert main(["studio", "--runs", str(tmp_path), "--no-browser"]) == 2
