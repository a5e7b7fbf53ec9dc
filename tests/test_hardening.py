"""Run lock, atomic writes, checkpoint verification, preflight: the parts of the fault suite that
need no multi-process training (tests/test_process_control.py has those)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import warm

from xtrain import atomic
from xtrain.config.loading import QUICKSTART_CONFIG
from xtrain.errors import XtrainError
from xtrain.runtime import lock as run_lock

REPO = Path(__file__).resolve().parents[1]

HOLD = """
import sys, time
from xtrain.runtime import lock
held = lock.acquire(sys.argv[1])
print("held", flush=True)
time.sleep(120)
"""


def hold_lock(folder: Path) -> subprocess.Popen:
    proc = warm.popen([sys.executable, "-c", HOLD, str(folder)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_mtime_ns, p.stat().st_size) for p in folder.rglob("*")}


# -- one run per output folder ------------------------------------------------------------------------
def test_second_run_is_refused_naming_the_holder_and_touches_nothing(tmp_path: Path) -> None:
    out = tmp_path / "out"
    holder = hold_lock(out)
    try:
        (out / "train_result.json").write_text("{}")
        before = snapshot(out)
        with pytest.raises(XtrainError) as info:
            run_lock.acquire(out)
        assert f"is in use by another run (PID {holder.pid} on " in info.value.message
        assert snapshot(out) == before
    finally:
        holder.kill()
        holder.wait()


def test_a_killed_runs_lock_is_taken_over(tmp_path: Path) -> None:
    out = tmp_path / "out"
    holder = hold_lock(out)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    assert (out / run_lock.LOCK_NAME).exists()  # left behind, but no longer locked by anyone
    with run_lock.acquire(out) as held:
        assert json.loads(held.path.read_text())["pid"] == os.getpid()
    assert not (out / run_lock.LOCK_NAME).exists()
    fresh = tmp_path / "fresh"
    with run_lock.acquire(fresh):
        assert fresh.is_dir()
    assert not fresh.exists()  # created for the lock, left empty: removed again


def test_second_xtrain_run_exits_with_one_line(tmp_path: Path) -> None:
    """The real entry point: one line naming the running PID, exit 2, no traceback."""
    out = tmp_path / "out"
    holder = hold_lock(out)
    try:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "XTRAIN_CACHE": str(tmp_path / "cache")}
        job = ["--config", str(QUICKSTART_CONFIG)]  # the small BERT job: its built-in assets build fastest
        proc = warm.run(
            [sys.executable, "-m", "xtrain.run", *job, f"run.output_dir={out}", "run.max_steps=1"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    finally:
        holder.kill()
        holder.wait()
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert len(lines) == 1 and f"(PID {holder.pid} on " in lines[0], proc.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == [run_lock.LOCK_NAME]


# -- atomic writes ------------------------------------------------------------------------------------
def test_atomic_write_replaces_whole_and_leaves_no_tmp(tmp_path: Path) -> None:
    path = tmp_path / "f.json"
    atomic.write_text(path, "old")
    atomic.write_text(path, "new")
    assert path.read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["f.json"]


def test_atomic_replace_retries_a_windows_sharing_violation(tmp_path: Path, monkeypatch) -> None:
    calls = []
    real = os.replace

    def flaky(src, dst):
        calls.append(time.monotonic())
        if len(calls) < 3:
            raise PermissionError(13, "The process cannot access the file")
        real(src, dst)

    monkeypatch.setattr(atomic.os, "replace", flaky)
    monkeypatch.setattr(atomic.sys, "platform", "win32")
    atomic.write_text(tmp_path / "f", "x")
    assert len(calls) == 3 and (tmp_path / "f").read_text() == "x"
    monkeypatch.setattr(atomic.sys, "platform", "linux")  # elsewhere a PermissionError is real
    calls.clear()
    with pytest.raises(PermissionError):
        atomic.write_text(tmp_path / "g", "x")
    assert not (tmp_path / "g.tmp").exists()


# -- resume that survives damage ------------------------------------------------------------------
def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_damaged_newest_checkpoint_falls_back_to_the_previous_good_one(tmp_path: Path) -> None:
    from test_loop import build_tiny, cpu_plan, tiny_config

    from xtrain.train.checkpoint.layout import MANIFEST_FILE
    from xtrain.train.checkpoint.resume import find_resume
    from xtrain.train.loop import train
    from xtrain.train.report import ListReporter

    out = tmp_path / "run"
    cfg = tiny_config(out, max_steps=3, save_every=1, keep_checkpoints=0)
    train(cfg, cpu_plan(), build=build_tiny)
    ckpts = out / "checkpoints"
    manifest = json.loads((ckpts / "step-3" / MANIFEST_FILE).read_text())["files"]
    assert "model.safetensors" in manifest and "sha256" in manifest["model.safetensors"]
    _flip_a_byte(ckpts / "step-3" / "model.safetensors")  # same size, other bytes
    (ckpts / "step-2" / "optimizer.bin").unlink()  # a missing file
    (ckpts / "step-3.tmp").mkdir()  # and a leftover of a killed write

    cfg = tiny_config(out, max_steps=4, save_every=1, keep_checkpoints=0)
    cfg.run.resume = "auto"
    rep = ListReporter()
    result = train(cfg, cpu_plan(), rep, build=build_tiny)
    assert result.resumed_from == str(ckpts / "step-1")
    notes = [m for kind, m in rep.events if kind == "note" and "is damaged" in m]
    assert len(notes) == 2, notes
    assert "step-3 is damaged (model.safetensors does not match the hash" in notes[0]
    assert "step-2 is damaged (optimizer.bin is missing)" in notes[1]
    assert not (ckpts / "step-3.tmp").exists()

    for step in ("step-1", "step-4"):  # the resumed run wrote step-2..4 anew: damage them all
        (ckpts / step / "xtrain_state.json").write_text("{not json")
    (ckpts / "step-3" / "model.safetensors").write_bytes(b"")
    (ckpts / "step-2" / "optimizer.bin").unlink()
    with pytest.raises(XtrainError, match=r"no checkpoint in .* is intact: step-4: xtrain_state.json is not"):
        find_resume(out, "auto")
    with pytest.raises(XtrainError, match="is damaged: optimizer.bin is missing"):
        find_resume(out, str(ckpts / "step-2"))


def test_keep_checkpoints_zero_keeps_all(tmp_path: Path) -> None:
    from xtrain.tasks.validation import load_config

    cfg = load_config(None, [f"run.output_dir={tmp_path}", "run.keep_checkpoints=0"])
    assert cfg.run.keep_checkpoints == 0


# -- preflight -------------------------------------------------------------------------------------
def test_preflight_refuses_unwritable_caches(tmp_path: Path) -> None:
    """A cache the run writes to (the datasets cache under HF_HOME) that cannot be written: one
    line naming the variable to set, before anything starts. (Read-only folders are simulated
    with a file in the way and with /proc: these tests may run as root.)"""
    from xtrain.tasks.validation import load_config
    from xtrain.train.preflight import check_paths

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    cfg = load_config(None, [f"run.output_dir={tmp_path / 'out'}"])
    with pytest.raises(XtrainError, match="set HF_DATASETS_CACHE or HF_HOME to a writable folder"):
        check_paths(cfg, {"HF_HOME": str(blocker / "hf")})
    if sys.platform.startswith("linux"):
        with pytest.raises(XtrainError, match="the cache folder /proc/xtrain-hf/datasets cannot be written"):
            check_paths(cfg, {"HF_HOME": "/proc/xtrain-hf"})
    check_paths(cfg, {"HF_HOME": str(tmp_path / "hf")})
    assert not (tmp_path / "out").exists()  # preflight leaves nothing behind


def test_preflight_refuses_special_filesystems_and_full_disks(tmp_path: Path) -> None:
    from xtrain.tasks.validation import load_config
    from xtrain.train.preflight import check_disk, check_paths

    if sys.platform.startswith("linux"):
        cfg = load_config(None, ["run.output_dir=/proc/xtrain-out"])
        with pytest.raises(XtrainError, match="special filesystem"):
            check_paths(cfg, {"HF_HOME": str(tmp_path / "hf")})
    with pytest.raises(XtrainError, match=r"not enough disk space for run.output_dir .* GiB needed"):
        check_disk(tmp_path, trainable=10**15, total=10**15, keep=2, save_merged=False)
    assert check_disk(tmp_path, trainable=1000, total=10**6, keep=2, save_merged=True) == []
    from xtrain.train.preflight import _size

    assert (_size(3 * 2**30), _size(5 * 2**20 + 2**19)) == ("3.00 GiB", "5.5 MiB")  # never "0.00 GiB"


def test_rerunning_a_finished_run_keeps_its_train_result(tmp_path: Path) -> None:
    from test_loop import build_tiny, cpu_plan, tiny_config

    from xtrain.train.loop import train

    out = tmp_path / "run"
    train(tiny_config(out, max_steps=2), cpu_plan(), build=build_tiny)
    before = (out / "train_result.json").read_bytes()
    assert json.loads(before)["samples_per_s"] > 0
    train(tiny_config(out, max_steps=2), cpu_plan(), build=build_tiny)
    assert (out / "train_result.json").read_bytes() == before


# -- printed commands ------------------------------------------------------------------------------
@pytest.mark.parametrize("address", ["10.0.0.1; rm -rf ~", "$(id)", "host name", "`calc`", "a'b"])
def test_configure_refuses_a_main_address_that_is_not_a_host(address: str, capsys) -> None:
    from xtrain.cli import main

    code = main(["configure", "--machines", "2", "--main-address", address, "--dry-run"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "is neither an IP address nor a hostname" in err


def test_configure_accepts_ips_and_hostnames() -> None:
    from xtrain.commands.configure import check_main_address

    for address in ("10.0.0.1", "fe80::1", "node-01.cluster.local", "gpu7"):
        check_main_address(address)


def test_mixed_type_labels_are_refused() -> None:
    from xtrain.data.labels import label_mapping

    with pytest.raises(XtrainError, match=r"the label column mixes types \(number 1, str 'pos'\)"):
        label_mapping([1, "pos"], [], None, ("train.jsonl", "eval.jsonl"))


# -- workers die with their launcher ----------------------------------------------------------------
CHAIN = """
import os, subprocess, sys, time
if sys.argv[1] == "launcher":
    child = subprocess.Popen([sys.executable, "-c", sys.argv[3], "worker", sys.argv[2], sys.argv[3]],
                             env={**os.environ, "XTRAIN_PARENT_PID": str(os.getpid())})
    print(child.pid, flush=True)
    time.sleep(120)
else:
    from xtrain.runtime import lifetime
    if sys.argv[2] == "thread-only":
        lifetime._set_pdeathsig = lambda: False  # the portable fallback alone (macOS, Windows)
    assert lifetime.watch_parent(interval_s=0.2)
    time.sleep(120)
"""


@pytest.mark.parametrize("how", ["pdeathsig", "thread-only"])
def test_a_worker_dies_with_its_launcher(how: str) -> None:
    import psutil

    launcher = warm.popen(
        [sys.executable, "-c", CHAIN, "launcher", how, CHAIN], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    worker = None
    try:
        assert launcher.stdout is not None
        worker = psutil.Process(int(launcher.stdout.readline()))
        time.sleep(1.5)  # the worker imported xtrain and watches
        assert worker.is_running()
        os.kill(launcher.pid, signal.SIGKILL)  # the launcher alone: no signal reaches the worker
        launcher.wait()
        worker.wait(timeout=5)
    finally:
        launcher.kill()
        launcher.wait()
        if worker is not None and worker.is_running():
            worker.kill()  # a failed test leaves no orphan behind


# -- rendezvous -------------------------------------------------------------------------------------
def test_torchrun_agent_store_listens_on_loopback_only() -> None:
    """The store torchrun's static rendezvous creates inside `xtrain train` (checked from the
    OS; without the patch it listens on 0.0.0.0, FIELD_NOTES)."""
    import psutil
    from torch.distributed.elastic.rendezvous.static_tcp_rendezvous import StaticTCPRendezvous

    from xtrain.launch.rendezvous import free_port, loopback_agent_store

    port = free_port()
    with loopback_agent_store():
        handler = StaticTCPRendezvous("127.0.0.1", port, 0, 1, "test", 30)
        handler.next_rendezvous()
    mine = [c.laddr for c in psutil.Process().net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN]
    assert [a.ip for a in mine if a.port == port] == ["127.0.0.1"], mine
    del handler


def test_loopback_transport_keeps_the_users_choice() -> None:
    from xtrain.runtime.process_group import loopback_interface, loopback_transport_env

    if loopback_interface() is None:
        pytest.skip("no loopback interface name here")
    assert loopback_transport_env({})["GLOO_SOCKET_IFNAME"] == loopback_interface()
    assert "GLOO_SOCKET_IFNAME" not in loopback_transport_env({"GLOO_SOCKET_IFNAME": "eth0"})
