"""One ``Run`` per process (``xtrain.planning.run``): the launch context read once, the settings
resolved once, handed to the recipe and to the task's ``build``; and ``LaunchContext`` the one
reader of the launch variables in the whole tree."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from xtrain.planning.context import LaunchContext
from xtrain.planning.resolve import RunSettings

pytestmark = pytest.mark.usefixtures("private_caches")  # conftest: one offline cache for the session

REPO = Path(__file__).resolve().parent.parent
# what a launcher tells a worker: read only by xtrain/planning/context.py
LAUNCH_VARIABLES = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR",
                    "MASTER_PORT"}  # fmt: skip
READER = REPO / "xtrain" / "planning" / "context.py"


def _launch_name(node: ast.AST) -> str | None:
    value = node.value if isinstance(node, ast.Constant) else None
    if isinstance(value, str) and (value in LAUNCH_VARIABLES or value.startswith("ACCELERATE_")):
        return value
    return None


def _reads(tree: ast.AST) -> list[tuple[int, str]]:
    """Where a launch variable's value is read: ``env["RANK"]``, ``env.get("RANK")``,
    ``os.getenv("RANK")``, ``"RANK" in env`` (setting one, for a child, is no read)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            name = _launch_name(node.slice)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            name = _launch_name(node.args[0]) if node.func.attr in ("get", "getenv", "pop") else None
        elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
            name = _launch_name(node.left)
        else:
            name = None
        if name is not None:
            found.append((node.lineno, name))
    return found


def test_only_the_launch_context_reads_the_launch_variables() -> None:
    reads = [
        f"{path.relative_to(REPO)}:{line} reads {name}"
        for path in sorted((REPO / "xtrain").rglob("*.py"))
        if path != READER
        for line, name in _reads(ast.parse(path.read_text(encoding="utf-8")))
    ]
    assert not reads, "ask xtrain.planning.context.LaunchContext instead:\n" + "\n".join(reads)
    assert _reads(ast.parse(READER.read_text(encoding="utf-8")))  # the check itself sees reads


def test_a_worker_reads_its_launch_context_and_resolves_its_settings_once(tmp_path, monkeypatch, capsys):
    """``python -m xtrain.run`` in this process (one process, no launcher): one launch context,
    one ``RunSettings``, the same Run in the task's build and in the recipe."""
    from support.jobs import make_job

    from xtrain import run as worker
    from xtrain.planning.run import Run
    from xtrain.tasks.text import causal_lm

    counts = {"context": 0, "settings": 0}
    real_from_env, real_init = LaunchContext.from_env.__func__, RunSettings.__init__

    def from_env(cls, environ=None):
        counts["context"] += 1
        return real_from_env(cls, environ)

    def settings_init(self, *args, **kwargs):
        counts["settings"] += 1
        real_init(self, *args, **kwargs)

    built: list[Run] = []

    def build(run, main_process_first):
        built.append(run)
        return causal_lm.build(run, main_process_first)

    monkeypatch.setattr(LaunchContext, "from_env", classmethod(from_env))
    monkeypatch.setattr(RunSettings, "__init__", settings_init)
    monkeypatch.setattr("xtrain.tasks.build_workload", lambda run, first: build(run, first))
    job = make_job(tmp_path / "job", steps=1)
    argv = ["--config", str(job.config), f"run.output_dir={tmp_path / 'out'}", "data.eval=null"]
    assert worker.main(argv) == 0, capsys.readouterr().err
    assert counts == {"context": 1, "settings": 1}
    (run,) = built
    assert (run.device, run.precision, run.world_size, run.context.launched) == ("cpu", "no", 1, False)
    assert run.settings.global_batch == 8 and run.cfg.run.max_steps == 1


CUSTOM = """
import torch
from xtrain.tasks.contract import Workload

SEEN = []

class Collate:
    def __call__(self, rows):
        return {"x": torch.tensor([r["x"] for r in rows]), "y": torch.tensor([r["y"] for r in rows])}

class Out:
    def __init__(self, loss):
        self.loss = loss

class Regressor(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(1, 1)
    def forward(self, x, y):
        return Out(((self.lin(x[:, None]).squeeze(1) - y) ** 2).mean())

def build(run, main_process_first):
    SEEN.append(run)
    with main_process_first():
        rows = [{"x": float(i), "y": 2.0 * i} for i in range(8)]
    return Workload(model=Regressor().to(run.device), train_dataset=rows, collator=Collate(), tokens_key=None)
"""


def test_a_custom_builder_of_the_run_shape_receives_the_run(tmp_path, monkeypatch) -> None:
    """``def build(run, main_process_first)``: what every task's build receives (the config's
    shape, ``build(cfg[, main_process_first])``, still works: tests/test_tasks.py)."""
    from support.workloads import build_workload

    from xtrain.tasks.validation import load_config

    (tmp_path / "run_shaped_task.py").write_text(CUSTOM)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        cfg = load_config(None, ["model.task=custom", "model.custom=run_shaped_task:build"])
        workload = build_workload(cfg)
        (run,) = sys.modules["run_shaped_task"].SEEN
        assert run.cfg is cfg and run.device == "cpu" and len(workload.train_dataset) == 8
    finally:
        sys.modules.pop("run_shaped_task", None)
