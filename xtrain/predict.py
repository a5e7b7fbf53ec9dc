"""Run a trained result with its task's own predict: an adapter, a full model, or a run's output
folder. ``xtrain predict`` dispatches on the task the run recorded (``xtrain_run.json`` next to
the adapter, else the config in its checkpoints, else the head its config names) to that task's
``Task.predicts`` (``xtrain.tasks``): its loader (the same processors training used) and
its ``run``. Results of tasks without one (seq-cls, custom) are refused in one line.
``predict_file`` runs every row of a data file, read by the task's ``Predicts.file`` readers
(the run's own row readers, with the run's data settings from its record), batched, and scores
the outputs against the rows' references. Images are read within the run's own
``data.max_image_pixels`` (``image_limit``), input files and a data file's rows alike.

An adapter folder loads its base model from ``base_model_name_or_path`` (peft's own record) and the
processor/tokenizer saved next to the adapter. The base of a run trained with
``model.quantization`` (its record's ``quantization``, else its checkpoints' config) loads in 4 or
8 bits as training loaded it (``quantization.predict_kwargs``, passed to the task's loader as the
record's ``BASE_LOAD``), on the GPU and on the CPU alike: a 14B QLoRA run predicts on the card
it trained on. Library code: returns data, prints nothing.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xtrain import tasks
from xtrain.config.schema import DataConfig
from xtrain.data.files import builder_of
from xtrain.errors import XtrainError
from xtrain.model import load as models
from xtrain.model import quantization
from xtrain.tasks.contract import BASE_LOAD, Example, Loaded, PredictRequest, Task
from xtrain.tasks.predicting import IMAGE_LIMIT, in_batches
from xtrain.tasks.validation import config_from_dict
from xtrain.train.checkpoint.layout import STATE_FILE, list_checkpoints
from xtrain.train.result import RUN_FILE

if TYPE_CHECKING:
    import torch

    from xtrain.config.schema import TrainConfig

_OUTPUT_FOLDERS = ("adapter", "model", "merged", "best")  # what a run's output_dir holds, preferred first


@dataclass
class RunTask:
    """What a result was trained for: ``task`` (None: not recorded) and chat conversations;
    ``templated``: a folder xtrain did not train (no record, no checkpoints) whose tokenizer has
    a chat template, so its prompts are rendered through it (``chat`` is then true)."""

    task: str | None
    chat: bool = False
    record: dict[str, Any] = field(default_factory=dict, compare=False)
    templated: bool = False


# where ``save_pretrained`` keeps a tokenizer's chat template: its own file (transformers >= 4.47)
# or a key of tokenizer_config.json (older saves, and most models on the hub)
_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")


def has_chat_template(folder: Path) -> bool:
    """The tokenizer saved in ``folder`` carries a chat template."""
    if any((folder / name).is_file() for name in _TEMPLATE_FILES):
        return True
    return bool(read_json_object(folder / "tokenizer_config.json").get("chat_template"))


def model_folder(path: str | Path) -> Path:
    """``path`` itself when it holds a model or an adapter, else the result inside a run folder."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise XtrainError(
            f"{folder} is not a folder", "pass a run's output_dir, its adapter/ or a model folder"
        )
    if (folder / "adapter_config.json").is_file() or (folder / "config.json").is_file():
        return folder
    for name in _OUTPUT_FOLDERS:
        if (folder / name / "adapter_config.json").is_file() or (folder / name / "config.json").is_file():
            return folder / name
    raise XtrainError(
        f"{folder} holds no adapter or model",
        "pass a finished run's output_dir (with adapter/ or model/), or the adapter folder itself",
    )


def read_json_object(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``; {} when it is missing, unreadable or not an object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _checkpoint_section(folder: Path, section: str) -> dict[str, Any]:
    """A section (``model``, ``data``) of the config saved in the newest checkpoint of the run
    ``folder`` is in ({} when there is none)."""
    if folder.name not in _OUTPUT_FOLDERS:
        return {}
    found = list_checkpoints(folder.parent)
    config = read_json_object(found[-1][1] / STATE_FILE).get("config") if found else None
    part = config.get(section) if isinstance(config, dict) else None
    return part if isinstance(part, dict) else {}


def _checkpoint_model(folder: Path) -> dict[str, Any]:
    return _checkpoint_section(folder, "model")


def _checkpoint_task(folder: Path) -> str | None:
    """The ``model.task`` of the config saved in the newest checkpoint of the run ``folder`` is in."""
    task = _checkpoint_model(folder).get("task")
    return task if isinstance(task, str) else None


def trained_quantization(folder: Path, trained: RunTask) -> str | None:
    """How the run loaded the base of the adapter in ``folder`` (``model.quantization``: 4bit,
    8bit, None): its record's word, else its newest checkpoint's config (runs recorded before
    the record said it)."""
    if "quantization" in trained.record:
        found = trained.record["quantization"]
    else:
        found = _checkpoint_model(folder).get("quantization")
    return found if found in ("4bit", "8bit") else None


def _head_task(folder: Path) -> str | None:
    """The task whose head a result's config names (``architectures``, peft's ``task_type``):
    the first task of the registry that ``recognizes`` it."""
    config = {**read_json_object(folder / "config.json"), **read_json_object(folder / "adapter_config.json")}
    base = config.get("base_model_name_or_path")
    if isinstance(base, str) and Path(base).is_dir():  # an adapter: its base's architectures
        config = {**read_json_object(Path(base) / "config.json"), **config}
    for task in tasks.all_tasks().values():
        if task.recognizes is not None and task.recognizes(config):
            return task.name
    return None


def run_task(folder: Path) -> RunTask:
    """What the result in ``folder`` was trained for: the run's own record first (``RUN_FILE``,
    saved with the adapter), then its checkpoints' config, then the model's head."""
    record = read_json_object(folder / RUN_FILE)
    if isinstance(record.get("task"), str):
        return RunTask(record["task"], bool(record.get("chat")), record)
    trained = _checkpoint_task(folder)
    if trained is not None:
        return RunTask(trained)
    # a base model (or a bare adapter) that xtrain did not train: a chat model is prompted as one
    templated = has_chat_template(folder)  # the tokenizer predict loads is the one saved here
    return RunTask(_head_task(folder), chat=templated, templated=templated)


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
    adapter = (folder / "adapter_config.json").is_file()
    base = str(folder)
    if adapter:
        base = json.loads((folder / "adapter_config.json").read_text(encoding="utf-8"))[
            "base_model_name_or_path"
        ]
        base = models.resolve_model(base) if base.startswith("builtin:") else base
    models.load_config(base, trust_remote_code=False)  # predict runs no hub code; one line if absent
    device = torch.device(pick_device())
    load = base_load(folder, task, trained, device) if adapter else {}
    model, tokenizer, parts = task.predicts.load(folder, base, {**trained.record, BASE_LOAD: load})
    if adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(folder))
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
    run = folder.parent if folder.name in _OUTPUT_FOLDERS else folder
    return run / f"{RESULTS_PREFIX}{Path(file).stem}.jsonl"


def run_data(folder: Path, trained: RunTask) -> dict[str, Any]:
    """The run's data settings (columns, row format, media roots, ...): its record's, else its
    newest checkpoint's config's; {} (the defaults) when neither says."""
    found = trained.record.get("data")
    if not isinstance(found, dict):
        found = _checkpoint_section(folder, "data")
    return found if isinstance(found, dict) else {}


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
    return config_from_dict({"model": {"task": task.name}, "data": data})


@dataclass
class FileResults:
    """What ``predict_file`` produced: one results line per row, and the metrics over the rows
    that have a reference."""

    rows: list[dict[str, Any]]
    metrics: dict[str, float]
    scored: int  # rows with a reference


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
    (+ ``probability``), and where the row has one ``reference`` and the task's metric."""
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
    return FileResults(rows, reads.score(refs, outs) if refs else {}, len(refs))


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
