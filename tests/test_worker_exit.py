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
