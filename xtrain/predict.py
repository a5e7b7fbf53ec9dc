"""Run a trained result with its task's own predict: an adapter, a full model, or a run's output
folder. ``xtrain predict`` dispatches on the task the run was trained for (``xtrain.trained``:
the run's record, its checkpoints' config, or the head its config names) to that task's
``Task.predicts`` (``xtrain.tasks``): its loader (the same processors training used) and
its ``run``. Results of tasks without one (seq-cls, custom) are refused in one line.
``predict_file`` runs every row of a data file, read by the task's ``Predicts.file`` readers
(the run's own row readers, with the run's data settings from its record), batched, and scores
the outputs against the rows' references. Images are read within the run's own
``data.max_image_pixels`` (``image_limit``), input files and a data file's rows alike.

An adapter folder loads its base model from its record's ``base`` (else peft's own
``base_model_name_or_path``) and the processor/tokenizer saved next to the adapter; a chained
result (``model.start``) applies every adapter of its lineage in order (``model.chain``). The base
of a run trained with ``model.quantization`` (``trained.trained_quantization``) loads in 4 or 8
bits as training loaded it (``quantization.predict_kwargs``, passed to the task's loader as the
record's ``BASE_LOAD``), on the GPU and on the CPU alike: a 14B QLoRA run predicts on the card
it trained on. Library code: returns data, prints nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xtrain import tasks
from xtrain.config.schema import DataConfig
from xtrain.data.files import builder_of
from xtrain.errors import XtrainError
from xtrain.model import chain, quantization
from xtrain.model import load as models
from xtrain.model.start import start_of
from xtrain.tasks.contract import BASE_LOAD, Example, Loaded, PredictRequest, Task
from xtrain.tasks.predicting import IMAGE_LIMIT, in_batches
from xtrain.tasks.validation import reader_config
from xtrain.trained import (
    OUTPUT_FOLDERS,
    RunTask,
    model_folder,
    read_json_object,
    run_data,
    run_task,
    trained_quantization,
)

if TYPE_CHECKING:
    import torch

    from xtrain.config.schema import TrainConfig


def predicting_task(folder: Path) -> tuple[Task, RunTask]:
    """The run's task, refused in one line when it has no predict (seq-cls, custom) or when the
    result does not say what it was trained for."""
    found = run_task(folder)
    known = tasks.all_tasks()
    runnable = [t.name for t in known.values() if t.predicts is not None]
    if found.task is None:
        raise XtrainError(
            f"cannot tell which task {folder} was trained for (no xtrain_run.json, no checkpoint config)",
            f"predict runs {', '.join(runnable)} results trained by xtrain",
        )
    task = known.get(found.task)
    if task is None or task.predicts is None:
        raise XtrainError(
            f"{folder} is a {found.task} result: xtrain predict cannot run it",
            f"predict runs {', '.join(runnable)} results; a run's eval metrics are in its train_result.json",
        )
    return task, found


def pick_device() -> str:
    """Where predict runs, for every task: the GPU when there is one."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def load_predictor(path: str | Path) -> tuple[Task, Loaded]:
    """The result at ``path`` loaded by its task's own loader, its adapter applied, on the GPU
    when there is one, in eval mode."""
    import torch

    folder = model_folder(path)
    task, trained = predicting_task(folder)
    assert task.predicts is not None
    start = start_of(str(folder))  # an adapter's base and, for a chained result, its every adapter
    adapter = bool(start.adapters)
    base = models.resolve_model(start.base) if adapter else str(folder)
    models.load_config(base, trust_remote_code=False)  # predict runs no hub code; one line if absent
    device = torch.device(pick_device())
    load = base_load(folder, task, trained, device) if adapter else {}
    model, tokenizer, parts = task.predicts.load(folder, base, {**trained.record, BASE_LOAD: load})
    if adapter:
        model = chain.load(model, start)  # base + every adapter in order: the chain's model
    if not load:  # a quantized base is on its device already (bitsandbytes' weights do not move)
        model.to(device)
    model.eval()
    limit = image_limit(run_data(folder, trained))
    parts = {**trained.record, **parts, "chat": trained.chat, IMAGE_LIMIT: limit}
    return task, Loaded(model=model, tokenizer=tokenizer, source=str(folder), parts=parts)


def image_limit(settings: dict[str, Any]) -> int | None:
    """The run's ``data.max_image_pixels`` (``run_data``): predict refuses the images its training
    would have refused; Pillow's default (the schema's) for a run that does not say, or says
    something this version would not accept."""
    from xtrain.data.rows.images import MAX_PIXELS

    found = settings.get("max_image_pixels", MAX_PIXELS)
    whole = isinstance(found, int) and not isinstance(found, bool) and found > 0
    return found if found is None or whole else MAX_PIXELS


def base_load(folder: Path, task: Task, trained: RunTask, device: torch.device) -> dict[str, Any]:
    """The ``from_pretrained`` keywords of the adapter's base: a quantized run's base in 4 or 8
    bits on ``device`` as training loaded it ({} for a 16-bit run)."""
    found = trained_quantization(folder, trained)
    if found is None:
        return {}
    whole = read_json_object(folder / "adapter_config.json").get("modules_to_save") or []
    return quantization.predict_kwargs(found, device, task.unquantized, whole)


def check_request(task: Task, request: PredictRequest) -> None:
    """Sampling options only for tasks that sample, tools only for tasks whose prompts take them
    (one line naming those that do)."""
    assert task.predicts is not None
    if request.tools and not task.predicts.tools:
        known = [t.name for t in tasks.all_tasks().values() if t.predicts is not None and t.predicts.tools]
        raise XtrainError(
            f"--tools gives a chat prompt the functions it may call; a {task.name} result takes none",
            f"leave out --tools (it is for {', '.join(known)} chat runs)",
        )
    if request.answers and not task.predicts.answers:
        known = [t.name for t in tasks.all_tasks().values() if t.predicts is not None and t.predicts.answers]
        raise XtrainError(
            f"--answer gives a reward model answers to score; a {task.name} result scores none",
            f"leave out --answer: it is for {', '.join(known)} results",
        )
    if request.sampling and not task.predicts.samples:
        known = tasks.all_tasks().values()
        sampling = [t.name for t in known if t.predicts is not None and t.predicts.samples]
        raise XtrainError(
            f"--temperature and --top-p sample generated text; a {task.name} result does not sample",
            f"leave them out (they are for {', '.join(sampling)} results)",
        )


def _seed(request: PredictRequest) -> None:
    if request.seed is not None:
        from transformers import set_seed

        set_seed(request.seed)  # python, numpy and torch (every device): the same draws again


def predict(path: str | Path, request: PredictRequest) -> list[dict[str, str]]:
    """Rows (``input``, maybe ``prompt``, ``text``, maybe ``probability``) for the request."""
    task, _ = predicting_task(model_folder(path))
    check_request(task, request)
    task, loaded = load_predictor(path)
    assert task.predicts is not None
    _seed(request)
    return task.predicts.run(loaded, request)


# ---------------------------------------------------------------------------------------------
# predict --data FILE: every row of a data file, in the run's own format

RESULTS_PREFIX = "predictions-"  # the results file's default name: predictions-<data file stem>.jsonl


def default_output(path: str | Path, file: str | Path) -> Path:
    """Where ``--data FILE`` writes without ``--output``: ``predictions-<FILE's stem>.jsonl`` in
    the run's output_dir (the folder given, or the run holding the adapter/model/best folder given)."""
    folder = Path(path).expanduser()
    run = folder.parent if folder.name in OUTPUT_FOLDERS else folder
    return run / f"{RESULTS_PREFIX}{Path(file).stem}.jsonl"


def file_config(task: Task, settings: dict[str, Any], file: str | Path) -> TrainConfig:
    """A config holding the run's data settings with ``file`` as its data: what the task's row
    readers take. The chat template is the one saved with the result (training saved the one it
    used there); nothing is packed or split; a file whose extension names its format is read as
    that format (``data.format`` is for the training files' names)."""
    known = {f.name for f in dataclasses.fields(DataConfig)}  # a record from another xtrain version
    data = {k: v for k, v in settings.items() if k in known}
    if builder_of(Path(file)) is not None:  # a CSV to predict after training on JSON lines
        data["format"] = "auto"
    data.update(
        train=str(file), eval=str(file), eval_fraction=0.0, chat_template=None, packing="off",
        group_by_length=False, num_workers=None, mix="concat", mix_probs=None, max_samples=None,
    )  # fmt: skip
    return reader_config({"model": {"task": task.name}, "data": data})


@dataclass
class FileResults:
    """What ``predict_file`` produced: one results line per row, and the metrics over the rows
    that have a reference."""

    rows: list[dict[str, Any]]
    metrics: dict[str, float]
    scored: int  # rows with a reference
    # the means of the task's own per-row scores over every row (GRPO's rewards: FileRows.averaged)
    means: dict[str, float] = dataclasses.field(default_factory=dict)


def read_examples(path: str | Path, file: str | Path) -> tuple[Task, list[Example]]:
    """The rows of ``file`` read by the run's own row readers, every row checked: a bad row is
    one line (file, row, field) before any model loads."""
    folder = model_folder(path)
    task, trained = predicting_task(folder)
    assert task.predicts is not None
    reads = task.predicts.file
    if reads is None:
        raise XtrainError(
            f"{folder} is a {task.name} result: it reads {task.predicts.takes}, not data files",
            f"pass {task.predicts.takes} instead of --data",
        )
    cfg = file_config(task, run_data(folder, trained), file)
    return task, reads.read(cfg, {**trained.record, "chat": trained.chat})


def predict_file(
    path: str | Path,
    file: str | Path,
    request: PredictRequest,
    progress: Callable[[int, int], None] | None = None,
) -> FileResults:
    """Every row of ``file`` through the result at ``path``, ``request.batch_size`` rows a call;
    ``progress(done, total)`` after each batch. Each results line: ``row``, the input, ``output``
    (+ ``probability``, a GRPO run's rewards), and where the row has one ``reference`` and the
    task's metric."""
    task, examples = read_examples(path, file)
    check_request(task, request)
    reads = task.predicts.file if task.predicts is not None else None
    assert reads is not None
    _, loaded = load_predictor(path)
    _seed(request)
    outputs = in_batches(reads.answer, loaded, examples, request, progress)
    rows, refs, outs = [], [], []
    for e, o in zip(examples, outputs, strict=True):
        row = {"row": e.row, **e.shown, **o}
        if e.reference is not None:
            row["reference"] = e.reference
            row.update(reads.score([e.reference], [o["output"]]))
            refs.append(e.reference)
            outs.append(o["output"])
        rows.append(row)
    metrics = reads.score(refs, outs) if refs else {}
    return FileResults(rows, metrics, len(refs), averaged(rows, reads.averaged))


def averaged(rows: list[dict[str, Any]], keys: tuple[str, ...]) -> dict[str, float]:
    """The mean over the rows of each per-row score a task's answers carry (``FileRows.averaged``:
    GRPO's rewards), over the rows where it is a number."""
    import math

    names = dict.fromkeys(k for r in rows for k in r if any(k == p or k.startswith(p) for p in keys))
    out = {}
    for name in names:
        values = [r[name] for r in rows if isinstance(r.get(name), (int, float)) and math.isfinite(r[name])]
        if values:
            out[name] = sum(values) / len(values)
    return out


# ---------------------------------------------------------------------------------------------
# xtrain chat: a conversation with a chat result or a chat model


@dataclass
class Chat:
    """A result loaded for ``xtrain chat``: ``reply`` answers the conversation so far."""

    loaded: Loaded
    request: PredictRequest
    answer: Callable[[Loaded, list[dict[str, str]], PredictRequest], str]
    templated: bool  # a base model prompted through its own chat template (no xtrain run)

    def reply(self, messages: list[dict[str, str]]) -> str:
        """The next assistant turn of ``messages`` (ending in a user turn)."""
        return self.answer(self.loaded, messages, self.request)


def load_chat(path: str | Path, request: PredictRequest) -> Chat:
    """The result at ``path`` ready to chat: refused in one line, before the model loads, when
    its task does not chat or it knows no chat template (a run on plain text, a model without one)."""
    folder = model_folder(path)
    task, trained = predicting_task(folder)
    assert task.predicts is not None
    if task.predicts.chat is None:
        known = tasks.all_tasks().values()
        chatting = [t.name for t in known if t.predicts is not None and t.predicts.chat is not None]
        raise XtrainError(
            f"{folder} is a {task.name} result: xtrain chat cannot run it",
            f"chat runs {', '.join(chatting)} results; xtrain predict runs this one",
        )
    if not trained.chat:
        raise XtrainError(
            f"{folder} was not trained on chat conversations and its tokenizer has no chat template",
            "xtrain predict RUN --prompt TEXT continues a text; train on messages data to chat",
        )
    check_request(task, request)
    _, loaded = load_predictor(folder)
    _seed(request)
    return Chat(loaded, request, task.predicts.chat, trained.templated)
