"""The preflight checks as data (``xtrain.train.preflight.CHECKS``): one tuple of
``(run, where) -> notes`` functions, run by the launcher before any process starts and by each
worker before its model loads; the commands only render their notes. Each refusal's own line is
tested where its feature is (test_trackers, test_windows_gloo, test_optim_8bit, ...)."""

from __future__ import annotations

import inspect

import pytest

from xtrain.errors import XtrainError
from xtrain.planning.context import LaunchContext
from xtrain.planning.run import for_launch, for_process
from xtrain.tasks.validation import load_config
from xtrain.train import preflight
from xtrain.train.preflight import CHECKS, WORKER, Note, Where, run_checks

pytestmark = pytest.mark.usefixtures("private_caches")  # conftest: one offline cache for the session


def test_every_check_is_a_function_of_the_run_and_where() -> None:
    assert len(CHECKS) == len(set(CHECKS)) >= 10
    for check in CHECKS:
        assert list(inspect.signature(check).parameters) == ["run", "where"], check.__name__


def test_the_launcher_says_the_plan_and_a_worker_only_its_warnings(machine, tmp_path) -> None:
    cfg = load_config(None, [f"run.output_dir={tmp_path / 'out'}", "run.tensorboard=false"])
    launch = for_launch(cfg, facts=machine("linux-cpu"))
    notes = run_checks(launch, Where(launcher=True, here=False))
    assert [n.label for n in notes] == ["Precision", "Data loading", "Threads", "Attention", "Loss"]
    assert notes[0].text.startswith("fp32 (") and all(n.level == "info" for n in notes)
    worker = for_process(cfg, LaunchContext(), plan=launch.plan)
    assert run_checks(worker, WORKER) == []  # nothing to say: the launcher said it
    assert not (tmp_path / "out").exists()  # checked, nothing written


def test_a_refusal_is_raised_where_its_check_runs(machine, tmp_path) -> None:
    """The output folder is the worker's to check (it writes there); the launcher's dry run shows
    the plan for it all the same."""
    (tmp_path / "file").write_text("")
    cfg = load_config(None, [f"run.output_dir={tmp_path / 'file' / 'out'}", "run.tensorboard=false"])
    launch = for_launch(cfg, facts=machine("linux-cpu"))
    assert run_checks(launch, Where(launcher=True, here=False, dry_run=True))
    with pytest.raises(XtrainError, match="cannot be a folder: .* is a file"):
        run_checks(for_process(cfg, LaunchContext(), plan=launch.plan))


def test_a_note_renders_as_the_command_printed_it() -> None:
    from xtrain.commands.launching import note_lines

    notes = [Note("Attention", "sdpa ([x])"), Note("warning", "w; fix: f", "warning"),
             Note("error", "e", "error"), Note("", "memory estimate skipped: s", "dim"),
             Note("Data", "", data="skipped")]  # fmt: skip
    assert note_lines(notes) == [
        "[bold]Attention:[/] sdpa (\\[x])",
        "[bold yellow]warning:[/] w; fix: f",
        "[bold red]error:[/] e",
        "[dim]memory estimate skipped: s[/]",
    ]
    assert preflight.Note("Data", "", data="skipped").data == "skipped"
