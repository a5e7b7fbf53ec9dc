"""A rank of a multi-process run ends without the interpreter's teardown (``lifetime.end_rank``):
gloo's teardown now and then aborted a finished rank (SIGABRT, "terminate called without an
active exception"), which made a finished 2-process run fail. What it writes still arrives."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from xtrain import run


@pytest.mark.parametrize(
    ("world", "many"), [("2", True), ("8", True), ("1", False), ("", False), ("x", False), (None, False)]
)
def test_one_rank_of_many_reads_world_size(monkeypatch, world: str | None, many: bool) -> None:
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    if world is None:
        monkeypatch.delenv("WORLD_SIZE", raising=False)
    else:
        monkeypatch.setenv("WORLD_SIZE", world)
    assert run.one_rank_of_many() is many


def test_end_rank_flushes_and_exits_with_the_code_without_atexit() -> None:
    code = textwrap.dedent(
        """
        import atexit, sys
        from xtrain.runtime import lifetime
        atexit.register(lambda: print("atexit ran"))
        sys.stdout.write("out without newline")
        sys.stderr.write("err without newline")
        lifetime.end_rank(3)
        """
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3
    assert proc.stdout == "out without newline"  # flushed; the atexit hook did not run
    assert proc.stderr == "err without newline"


def test_the_report_channel_one_file_per_rank_lowest_first(tmp_path, monkeypatch) -> None:
    """``runtime.report``: each rank's ending, whether it printed it, read back lowest rank first;
    an unreadable file is skipped (the launcher speaks for that rank), no folder: nothing written."""
    from xtrain.errors import XtrainError
    from xtrain.runtime import report

    monkeypatch.setenv(report.REPORT_ENV, str(tmp_path))
    assert report.launcher_listens()
    report.record(XtrainError("rank 1 saw it", "fix it", exit_code=3), 1, printed=False)
    report.record(XtrainError("rank 0 said it"), 0, printed=True)
    (tmp_path / "rank-2.json").write_text("{cut short", encoding="utf-8")
    reports = report.read(tmp_path)
    found = [(r.rank, r.message, r.printed) for r in reports]
    assert found == [(0, "rank 0 said it", True), (1, "rank 1 saw it", False)]
    assert report.said(reports) == reports[0] and report.said(reports[1:]) is None
    error = reports[1].error(exit_code=143)
    assert (error.message, error.hint, error.exit_code) == ("rank 1 saw it", "fix it", 143)
    monkeypatch.delenv(report.REPORT_ENV)
    assert not report.launcher_listens()
    report.record(XtrainError("unheard"), 4, printed=False)
    assert not (tmp_path / "rank-4.json").exists()


def test_a_rank_the_launcher_stopped_does_not_speak_for_anothers_failure() -> None:
    """Rank 1 was killed (no report); the launcher then stopped rank 0 with SIGTERM, and rank 0
    printed its stop line before it ended (a race: seen once in a full run). That line is no word
    on the failure: the launcher still names rank 1. A stop of the whole run keeps its lines."""
    import signal

    from xtrain.launch.worker_errors import WorkerFailed, WorkerStopped
    from xtrain.runtime.report import Report

    stop = Report(0, "stopped on SIGTERM; no stop checkpoint was written", None, 143, printed=True)
    failed = WorkerFailed(1, 1, "worker rank 1 died (signal SIGKILL)")
    failed.reports = [stop]
    assert failed.said is None and failed.failure_reports == []
    own = Report(1, "rank 1: out of memory", "lower batch.per_device", 1, printed=True)
    failed.reports = [stop, own]
    assert failed.said == own
    stopped = WorkerStopped(signal.SIGTERM)
    stopped.reports = [stop]
    assert stopped.said == stop
