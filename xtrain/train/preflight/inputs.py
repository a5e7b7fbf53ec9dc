"""The checks that look at the run's inputs: where the model is (``_model_source``: a local path
that is not there, a hub model neither cached nor reachable), what a trained result as the start
holds against this stage (``_start``: its model class, the adapter options), the config against the
model's config (``--dry-run``) and the task's data check on the first rows (``--dry-run``: refused
where no checked row has anything left to learn)."""

from __future__ import annotations

from xtrain import tasks
from xtrain.config.schema import given_keys
from xtrain.errors import XtrainError
from xtrain.model import hub
from xtrain.model.lora import BASE_CHANGING
from xtrain.model.start import Start, start_of
from xtrain.planning.run import Run
from xtrain.runtime.quiet import quiet_libraries
from xtrain.tasks import model_checks
from xtrain.train.preflight.notes import Note, Where


def _model_source(run: Run, where: Where) -> list[Note]:
    """Where ``model.name_or_path`` is (``model.hub.locate``), before anything loads it: a local
    path that is not there, or a hub model neither in the cache nor reachable, is one line at once
    (for another machine's plan, ``--facts``, a warning); a hub that cannot be reached while the
    cache holds the model is said, and nothing waits for the network after."""
    source = hub.locate(start_of(run.cfg.model.name_or_path).base, here=where.here)  # a result's base
    if source.note is None or not where.launcher:
        return []
    return [
        Note("Model", source.note) if source.kind == "cached" else Note("warning", source.note, "warning")
    ]


# the keys that shape a new adapter: a continued adapter keeps its own (its adapter_config.json)
NEW_ADAPTER_KEYS = (
    "lora.r", "lora.alpha", "lora.dropout", "lora.target_modules", "lora.modules_to_save", "lora.apply_to",
    "lora.projector", "lora.vision_blocks", "lora.use_dora", "lora.use_rslora", "lora.init_weights",
)  # fmt: skip


def _start(run: Run, where: Where) -> list[Note]:
    """A trained result as the start (``model.start``), from its files alone: a result of another
    model class or head, ``lora.continue_adapter`` without an adapter to continue (or with keys
    that shape a new one), a full fine-tune or a base-changing init on top of adapters: one line
    each. The launcher says what the stage starts from."""
    cfg, start = run.cfg, start_of(run.cfg.model.name_or_path)
    check_start(run, start)
    if not start.result or not where.launcher:
        return []
    mode = "the last adapter trained on" if cfg.lora.continue_adapter else "a new adapter on top"
    return [Note("Start", f"{start.shown()}; {mode}" if start.adapters else start.shown())]


def check_start(run: Run, start: Start) -> None:
    """``_start``'s refusals (a ``Start`` against this stage's task and LoRA settings)."""
    cfg, task = run.cfg, tasks.get(run.cfg.model.task)
    lora, name = cfg.lora, cfg.model.name_or_path
    theirs = tasks.all_tasks().get(start.task) if start.task else None
    classes = {task.model_class, *task.starts_from}  # (a reward model starts from an SFT result)
    if theirs is not None and task.model_class and theirs.model_class not in classes:
        raise XtrainError(
            f"{name} is a {theirs.name} result ({theirs.model_class}); a {task.name} stage trains "
            f"{task.model_class}",
            f"start from a base model or from a result of a task that trains {task.model_class}",
        )
    kind = task.peft_task_type
    kinds = {kind, *(t.peft_task_type for t in tasks.all_tasks().values() if t.model_class in classes)}
    if theirs is None and start.peft_task_type and kind and start.peft_task_type not in kinds:
        raise XtrainError(
            f"{name} is a {start.peft_task_type} adapter; a {task.name} stage trains {kind} adapters",
            "start from a base model or from an adapter of the same kind",
        )
    if lora.continue_adapter and not start.adapters:
        raise XtrainError(
            f"lora.continue_adapter=true trains a result's last adapter on, and {name} holds no adapter",
            "set model.name_or_path to a trained result (its output_dir or adapter/), or leave it out",
        )
    if not start.adapters:
        return
    if not lora.enabled:
        raise XtrainError(
            f"lora.enabled=false trains every weight, and {name} is a base with adapters",
            f"start from its merged model (xtrain export {name} --to merged), or keep LoRA",
        )
    if lora.init_weights in BASE_CHANGING:
        raise XtrainError(
            f"lora.init_weights={lora.init_weights} rewrites the base weights under the start's adapters",
            "use lora.init_weights=default (or gaussian) on a trained result",
        )
    given = sorted(set(NEW_ADAPTER_KEYS) & (given_keys(cfg) or set()))
    if lora.continue_adapter and given:
        raise XtrainError(
            f"lora.continue_adapter=true trains {name}'s adapter on with its own settings (its "
            f"adapter_config.json); {', '.join(given)} are a new adapter's",
            f"leave out {', '.join(given)}, or lora.continue_adapter to train a new adapter on top",
        )


def _model(run: Run, where: Where) -> list[Note]:
    """``--dry-run``: the checks a worker runs on the loaded model (lengths, LoRA targets), on the
    model's config where it is on this machine (nothing is downloaded); a failure is the run's own
    line; and the layers LoRA goes on (what ``auto`` picked). A full fine-tune's plan without CUDA
    checks the lengths from config.json only (no skeleton: no transformers modeling import)."""
    if not where.dry_run:
        return []
    light = run.plan.device != "cuda" and not run.cfg.lora.enabled
    if not light:
        quiet_libraries()  # building the model's skeleton: no library chatter
    checked, lora = model_checks.checked_offline(run.cfg, light)
    return [Note("Model checks", checked), *([Note("LoRA", lora)] if lora else [])]


def _data(run: Run, where: Where) -> list[Note]:
    """``--dry-run``: the task's data check on the first rows of this machine's data, also for
    another machine's plan (``Task.check_data``; a bad row raises its line). A worker's task checks
    the rows it loaded in its build (``Workload.data_report``)."""
    if not where.dry_run:
        return []
    from xtrain.tasks.data_check import ROWS
    from xtrain.tasks.data_report import cut_warnings, nothing_to_learn

    task = tasks.get(run.cfg.model.task)
    if task.check_data is None:
        return [Note("Data", "", data=f"skipped: task {task.name} reads its own data")]
    quiet_libraries()  # tokenizer and builder chatter
    report = task.check_data(run.cfg, ROWS)
    if (refused := nothing_to_learn(report)) is not None:  # the run would stop after loading it all
        raise refused
    report.notes += cut_warnings(report)
    return [Note("Data", "", data=report)]
