"""The task contract (docs/architecture.md#add-a-task): every registered task has every part,
nothing outside xtrain/tasks/ names a task, and a key is refused for a task that does not
read it."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from xtrain import tasks
from xtrain.config.schema import config_keys
from xtrain.config.values import CHOICES
from xtrain.errors import XtrainError
from xtrain.tasks.contract import EVERY_KEY, Task
from xtrain.tasks.validation import load_config, task_keys

REPO = Path(__file__).resolve().parent.parent
XTRAIN = REPO / "xtrain"
TASKS_DIR = XTRAIN / "tasks"
ALL = list(tasks.all_tasks().values())
# The only task names written outside the tasks package: the config's default task (schema), and
# the task of the job that `xtrain bench` writes for itself.
ALLOWED_LITERALS = {
    ("xtrain/config/schema.py", "seq-cls"),
    ("xtrain/bench/job.py", "causal-lm"),
    ("xtrain/report/samples.py", "reward"),  # a GRPO sample's details key, not the reward task
}


@pytest.mark.parametrize("task", ALL, ids=lambda t: t.name)
def test_every_task_has_every_part_of_the_contract(task: Task):
    import transformers

    assert isinstance(task, Task) and task.name and task.about
    assert callable(task.build) and callable(task.validate)
    keys = set(config_keys())
    assert task.keys - {EVERY_KEY} <= keys, "a task owns only keys of the config"
    for key in task.resume_keys:
        assert key in keys
    if task.model_class is not None:
        assert hasattr(transformers, task.model_class)
    if task.peft_task_type is not None:
        from peft import TaskType

        assert task.peft_task_type in TaskType.__members__
    if task.predicts is not None:
        assert task.predicts.takes and callable(task.predicts.load) and callable(task.predicts.run)
        reads = task.predicts.file  # predict --data: its rows, one batch's answers, their metric
        assert reads is None or (reads.rows and all(map(callable, (reads.read, reads.answer, reads.score))))
        assert task.recognizes is not None, "a result saved without a record must still find its task"
    jobs = [task.quickstart] if task.quickstart is not None else []
    for quickstart in [*jobs, *(job for _, job in task.more_quickstarts)]:
        assert (XTRAIN / "builtin" / "jobs" / quickstart.job).is_file()
        cfg = load_config(XTRAIN / "builtin" / "jobs" / quickstart.job, [])
        assert cfg.model.task == task.name, "a task's quickstart job trains that task"
        assert quickstart.next_command.startswith("xtrain train examples/")
        assert (REPO / quickstart.next_command.split()[-1]).is_file()
    assert (REPO / "docs" / "architecture.md").read_text(encoding="utf-8").count("## Add a task") == 1


def test_the_registry_is_the_modules_of_the_tasks_package():
    # modules as the registry names them: "custom" at the top, "family.module" in a family's sub-package
    modules = {".".join(p.relative_to(TASKS_DIR).with_suffix("").parts): p for p in TASKS_DIR.rglob("*.py")}
    exporting = {m for m, p in modules.items() if "\nTASK = Task(" in p.read_text(encoding="utf-8")}
    assert exporting == set(tasks.REGISTRY), "every module that exports a TASK is registered, and only those"
    families = {m.split(".")[0] for m in tasks.REGISTRY if "." in m}
    assert all((TASKS_DIR / f / "__init__.py").is_file() for f in families), "a family is a sub-package"
    assert len(set(tasks.names())) == len(tasks.REGISTRY)
    spellings = list(tasks.aliases())
    assert len(spellings) == len(set(spellings)) and not set(spellings) & set(tasks.names())


def _task_literals(path: Path) -> list[str]:
    names = set(tasks.names()) | set(tasks.aliases())
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names
    ]


def test_no_task_name_literal_outside_the_tasks_package():
    found = {
        (str(p.relative_to(REPO).as_posix()), literal)
        for p in XTRAIN.rglob("*.py")
        if TASKS_DIR not in p.parents
        for literal in _task_literals(p)
    }
    assert found <= ALLOWED_LITERALS, f"task names outside xtrain/tasks/: {sorted(found - ALLOWED_LITERALS)}"
    assert len(ALLOWED_LITERALS) <= 3


def test_what_every_task_shares_imports_no_task_family():
    """The modules at tasks/' top (prompt_predict, predicting, common, ...) import no module of a
    task family's sub-package: a family's hooks come in through the contract (``ToolUse``)."""
    families = {p.name for p in TASKS_DIR.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    found = []
    for module in sorted(TASKS_DIR.glob("*.py")):
        if module.name == "__init__.py":  # the registry names the task modules, as data
            continue
        for node in ast.walk(ast.parse(module.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("xtrain.tasks."):
                part = node.module.split(".")[2]
                if part in families:
                    found.append(f"{module.name}: {node.module}")
    assert not found, found


def test_reading_the_registry_imports_no_heavy_library():
    code = (
        "import sys; from xtrain import tasks; tasks.all_tasks();"
        "from xtrain.tasks.validation import load_config; load_config(None, []);"
        "print([m for m in ('torch', 'transformers', 'datasets', 'peft', 'PIL') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def _other_value(key: str, value):
    """A value of ``key``'s type that is not its default."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 2 if value else 3
    if isinstance(value, float):
        return value + 1
    if key.endswith("_column") or key in ("data.chat_template", "data.tools"):
        return "other"
    if key == "data.chat_template_kwargs":
        return "{enable_thinking: false}"
    if key == "lora.apply_to":
        return "decoder"
    if key == "data.long_audio":
        return "cut"
    if key == "generation.speech_task":
        return "translate"
    if key == "generation.language":
        return "en"
    if key == "model.custom":
        return "mod:fn"
    if key in CHOICES:  # another of its choices (data.row_format)
        return next(c for c in CHOICES[key] if c != value)
    return 1000 if value is None else "other"


@pytest.mark.parametrize("task", ALL, ids=lambda t: t.name)
def test_a_key_of_other_tasks_is_refused_naming_it(task: Task):
    from xtrain.config.schema import TrainConfig

    defaults = TrainConfig()
    refused = 0
    for key, owners in task_keys().items():
        if key in task.keys or EVERY_KEY in task.keys:
            continue
        section, name = key.split(".")
        value = _other_value(key, getattr(getattr(defaults, section), name))
        extra = ["model.custom=mod:fn"] if task.name == "custom" else []
        with pytest.raises(XtrainError) as e:
            load_config(None, [f"model.task={task.name}", *extra, f"{key}={value}"])
        assert e.value.message.startswith(f"{key} is for task"), e.value.message
        assert all(o in e.value.message for o in owners) and task.name in e.value.message
        refused += 1
    assert refused or EVERY_KEY in task.keys


def test_a_custom_task_reads_any_key():
    cfg = load_config(
        None, ["model.task=custom", "model.custom=m:f", "data.packing=true", "lora.projector=true"]
    )
    assert cfg.data.packing and cfg.lora.projector


@pytest.mark.parametrize("task", ALL, ids=lambda t: t.name)
def test_a_task_that_generates_says_its_prompt(task: Task):
    """generation.max_new_tokens is checked against the model's positions on top of the prompt
    (xtrain.tasks.model_checks): a task that reads it must say how long its prompt can be."""
    if "generation.max_new_tokens" in task.keys:
        assert task.generation_prompt is not None
