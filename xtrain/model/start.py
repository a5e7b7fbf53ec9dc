"""What a stage starts from: ``model.name_or_path`` read once into a ``Start`` (plain data).

A base model (a built-in, a folder with ``config.json``, a hub id) is its own start. A trained
result (what ``xtrain predict`` takes: a run's output folder, its ``adapter/`` or ``best/``, a
merged or fully fine-tuned folder) is read from its files, never its weights: its record
(``RUN_FILE``: the task, the quantization, the ``lineage``), peft's ``adapter_config.json`` (the
base an adapter goes on) and, for a chain, the earlier stages' adapters it keeps beside its own
(``CHAIN_DIR``/<i>, copied byte for byte). So a ``Start`` holds the base to load, every adapter
in order with its sha256, the quantization the result trained with and the folder its tokenizer
(with the chat template it trained with) or processor was saved in.

Loading (``tasks.common``, ``model.chain``), the memory estimate (``model.configs``: the base's
config.json), the dry run (``train.preflight.inputs``), the preference reference's fingerprint,
``xtrain predict``, ``chat`` and ``export`` (``model.merge``) and the run record's ``lineage``
all read the same ``Start`` (``start_of``, resolved once per process and name).

The record names the stages the result came from under ``lineage``, oldest first (``[]`` for a
run from a base model): ``{"task", "source" (the result folder that stage wrote), "adapter_sha256",
"mode": "new" | "continue" | "full"}``; ``"base"``, the model the adapters apply to (the original
base; a merged or fully fine-tuned start's own folder); and the stage's own ``"mode"`` and
``"adapter_sha256"`` (None for a whole model), from which the next stage's entry is made
(``Start.lineage``: the chain through the result, its own entry last, its source the folder it is
read from).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from xtrain import builtin
from xtrain.errors import XtrainError

RUN_FILE = "xtrain_run.json"  # saved next to the adapter (or full model): what the run trained
OUTPUT_FOLDERS = ("adapter", "model", "merged", "best")  # what a run's output_dir holds, preferred first
CHAIN_DIR = "lineage"  # in a chained result's adapter folder: <i>/, the earlier stages' adapters
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
LINEAGE = "lineage"  # the record's keys
BASE = "base"
MODE = "mode"
SHA = "adapter_sha256"
MODES = ("new", "continue", "full")  # how a stage trained: a new adapter, the last one continued, whole
# a run's checkpoints (train/checkpoint/layout.py names them from here: the model layer reads them
# too, to say what a checkpoint or an unfinished run is when one is given as a start)
CHECKPOINTS = "checkpoints"
STATE_FILE = "xtrain_state.json"
STEP_DIR = re.compile(r"^step-(\d+)$")
HF_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")  # HF Trainer's (LLaMA-Factory's, axolotl's) checkpoints
# the files a tokenizer or a processor is saved as (one of them): where a result's tokenizer is
_TOKENIZER_FILES = (
    "tokenizer_config.json",
    "tokenizer.json",
    "processor_config.json",
    "preprocessor_config.json",
)


def read_json_object(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``; {} when it is missing, unreadable or not an object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def model_folder(path: str | Path) -> Path:
    """``path`` itself when it holds a model or an adapter, else the result inside a run folder."""
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise XtrainError(
            f"{folder} is not a folder", "pass a run's output_dir, its adapter/ or a model folder"
        )
    if (folder / ADAPTER_CONFIG).is_file() or (folder / "config.json").is_file():
        return folder
    for name in OUTPUT_FOLDERS:
        if (folder / name / ADAPTER_CONFIG).is_file() or (folder / name / "config.json").is_file():
            return folder / name
    not_a_result(folder)
    raise XtrainError(
        f"{folder} holds no adapter or model",
        "pass a finished run's output_dir (with adapter/ or model/), or the adapter folder itself",
    )


class NotAResult(XtrainError):
    """A folder a training run wrote that holds no result to start from or run (a checkpoint
    without its adapter, a run stopped before its outputs): one line saying what it is and what
    to pass instead, never a load that fails on a missing tokenizer."""


def _is_model(folder: Path) -> bool:
    return (folder / ADAPTER_CONFIG).is_file() or (folder / "config.json").is_file()


def _newest(folders: list[tuple[int, Path]]) -> tuple[int, Path] | None:
    return max(folders) if folders else None


def not_a_result(folder: Path) -> None:
    """Raise ``NotAResult`` when ``folder`` (holding no adapter or model of its own) is a run's
    checkpoint or a run stopped before it wrote its result; return for any other folder.

    An xtrain checkpoint (``checkpoints/step-N``) holds its adapter in ``adapter/`` (a LoRA run's,
    since checkpoints carry it: ``model_folder`` finds it there); one without (an older run's, a
    full fine-tune's, a sharded one's) holds the training state only. A run folder whose
    ``adapter/`` is missing names its newest checkpoint. A HF Trainer run folder (LLaMA-Factory,
    axolotl) keeps each ``checkpoint-N`` as a peft adapter or model folder: its newest is named."""
    state = read_json_object(folder / STATE_FILE)
    if STEP_DIR.match(folder.name) and (folder / STATE_FILE).is_file():
        run = folder.parent.parent
        config = state.get("config") if isinstance(state.get("config"), dict) else {}
        lora = config.get("lora") if isinstance(config.get("lora"), dict) else {}
        full = lora.get("enabled") is False
        why = "a full fine-tune's" if full else "a sharded run's, or an older xtrain's"
        raise NotAResult(
            f"{folder} is a checkpoint of the xtrain run {run} (step {state.get('step', '?')}, {why}): it "
            "holds the training state only, no adapter to start from",
            f"run that run's config again to finish it, resuming from its newest checkpoint; then pass {run}",
        )
    steps = []
    if (folder / CHECKPOINTS).is_dir():
        steps = [
            (int(m.group(1)), p)
            for p in (folder / CHECKPOINTS).iterdir()
            if (m := STEP_DIR.match(p.name)) and (p / STATE_FILE).is_file()
        ]
    if (newest := _newest(steps)) is not None:
        step, path = newest
        total = read_json_object(path / STATE_FILE).get("total_steps")
        of = f" of {total}" if isinstance(total, int) else ""
        said = f"{folder} holds no finished result: its run stopped at step {step}{of} before its adapter/"
        finish = f"run its config again to finish it, resuming from step {step}"
        if _is_model(path / OUTPUT_FOLDERS[0]):
            raise NotAResult(said, f"pass {path} to start from its newest checkpoint, or {finish}")
        raise NotAResult(said, f"{finish}; then pass {folder}")
    hf = [
        (int(m.group(1)), p) for p in folder.iterdir() if (m := HF_CHECKPOINT.match(p.name)) and _is_model(p)
    ]
    if (newest := _newest(hf)) is not None:
        raise NotAResult(
            f"{folder} holds no final adapter or model, only a trainer's checkpoints",
            f"pass one of them, e.g. the newest: {newest[1]}",
        )


@dataclass(frozen=True)
class StartAdapter:
    """One adapter of a start: its folder (adapter_config.json + weights), its weights' sha256
    and its place in the lineage (the record's list)."""

    path: str
    sha256: str
    index: int


@dataclass(frozen=True)
class Start:
    """What ``model.name_or_path`` names, read once: the base to load (a folder, a hub id, or
    ``builtin:NAME``), the adapters applied on it in order (frozen; the last continued with
    ``lora.continue_adapter``), the quantization the result trained with, the folder its
    tokenizer or processor comes from (None: the base's), the task it was trained for and its
    lineage. A base model: ``base`` is the name, nothing else set."""

    name: str
    base: str
    adapters: tuple[StartAdapter, ...] = ()
    quantization: str | None = None
    tokenizer: str | None = None
    task: str | None = None  # the result's task (None: a base model, or an adapter xtrain did not train)
    peft_task_type: str | None = None  # the last adapter's peft task type (CAUSAL_LM, SEQ_CLS, ...)
    # the chain through the result, oldest first, its own stage last (() for a base model)
    lineage: tuple[dict[str, Any], ...] = field(default=(), compare=False)

    @property
    def result(self) -> bool:
        """A trained result (adapters to apply, or a record of how it was trained)."""
        return bool(self.adapters) or bool(self.lineage) or self.task is not None

    def shown(self) -> str:
        """One line: the result and its base, for the dry run and the banner."""
        if not self.result:
            return self.base
        stages = " -> ".join(str(e.get("task")) for e in self.lineage) or "a result"
        if not self.adapters:
            return f"{self.name} ({stages}: a whole model, {self.base})"
        adapters = f"{len(self.adapters)} adapter{'s' * (len(self.adapters) != 1)}"
        return f"{self.name} ({stages}: {adapters} on {self.base})"


def stage_record(start: Start, mode: str) -> dict[str, Any]:
    """The run record's ``lineage`` (the stages ``start`` came from, then itself), ``base`` and the
    stage's ``mode`` (new, continue or full); its adapter's hash is filled when the adapter is
    written (``seal``)."""
    base = start.base if builtin.is_builtin(start.base) else _absolute(start.base)
    return {LINEAGE: list(start.lineage), BASE: base, MODE: mode, SHA: None}


def _absolute(name: str) -> str:
    """A local folder as an absolute path (a record read from elsewhere still finds it); a hub id
    as it is."""
    path = Path(name).expanduser()
    return str(path.resolve()) if path.exists() else name


def file_sha256(path: Path) -> str:
    """The sha256 of a file's bytes (an adapter's weights), remembered per path, size and time."""
    stat = path.stat()
    return _sha256(str(path), stat.st_size, stat.st_mtime_ns)


@lru_cache(maxsize=64)
def _sha256(path: str, size: int, mtime: int) -> str:
    return sha256_of(Path(path))


def sha256_of(path: Path) -> str:
    """The sha256 of a file's bytes, read now (a checkpoint's manifest checks them too)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def start_of(name: str) -> Start:
    """The ``Start`` of ``model.name_or_path``: a trained result read from its files, anything
    else (a built-in, a hub id, a model folder without a record, a path not there: the preflight
    says so) its own base. A folder that is neither a model nor a result is one line."""
    if builtin.is_stage(name):  # a trained built-in: its result (one line when not built yet)
        return _start_in(name, model_folder(builtin.stage_result(name)))
    if builtin.is_builtin(name) or not Path(name).expanduser().is_dir():
        return Start(name, name)
    try:
        folder = model_folder(name)
    except NotAResult:  # a checkpoint without its adapter, an unfinished run: what to pass instead
        raise
    except XtrainError:  # neither a model nor a result: the load says what it lacks
        return Start(name, name)
    return _start_in(name, folder)


def _start_in(name: str, folder: Path) -> Start:
    record_path = folder / RUN_FILE
    stamp = record_path.stat().st_mtime_ns if record_path.is_file() else 0
    return _read_start(name, str(folder), stamp)


@lru_cache(maxsize=32)
def _read_start(name: str, where: str, stamp: int) -> Start:
    """``start_of``'s reading, once per name, folder and record (``stamp``: its time)."""
    folder = Path(where)
    record = read_json_object(folder / RUN_FILE)
    earlier = tuple(e for e in record.get(LINEAGE) or () if isinstance(e, dict))
    task = record.get("task") if isinstance(record.get("task"), str) else None
    adapter = (folder / ADAPTER_CONFIG).is_file()
    if not adapter and not record:  # a model folder: its own base
        return Start(name, name)
    mode = record.get(MODE) if record.get(MODE) in MODES else ("new" if adapter else "full")
    sha = record.get(SHA) if isinstance(record.get(SHA), str) else None
    run = (folder.parent if folder.name in OUTPUT_FOLDERS else folder).absolute()  # its stage's folder
    lineage = (*earlier, {"task": task, "source": str(run), "adapter_sha256": sha, "mode": mode})
    if not adapter:  # a whole model (a full fine-tune, a merged chain): its own base, its history kept
        return Start(name, str(folder), task=task, lineage=lineage)
    config = read_json_object(folder / ADAPTER_CONFIG)
    base = record.get(BASE) or config.get("base_model_name_or_path")
    if not isinstance(base, str) or not base:
        raise XtrainError(
            f"{folder / ADAPTER_CONFIG} does not name its base model (base_model_name_or_path)",
            "set base_model_name_or_path in it to the model the adapter was trained on",
        )
    adapters = (*_chain(folder, lineage), _adapter(folder, lineage, len(lineage) - 1))
    tokenizer = str(folder) if any((folder / f).is_file() for f in _TOKENIZER_FILES) else None
    quantization = record.get("quantization") if record.get("quantization") in ("4bit", "8bit") else None
    peft_type = config.get("task_type") if isinstance(config.get("task_type"), str) else None
    return Start(name, base, adapters, quantization, tokenizer, task, peft_type, lineage)


def _chain(folder: Path, lineage: tuple[dict[str, Any], ...]) -> list[StartAdapter]:
    """The earlier stages' adapters kept in ``folder/CHAIN_DIR/<i>``, in lineage order; a copy
    the record names but the folder lacks is one line."""
    found = []
    chain = folder / CHAIN_DIR
    kept = sorted(int(p.name) for p in chain.iterdir() if p.name.isdigit()) if chain.is_dir() else []
    for i in kept:
        if i >= len(lineage) - 1:
            raise XtrainError(
                f"{chain / str(i)} is not an earlier stage of {folder} (its record names {len(lineage)})",
                "use the result folder as its run wrote it",
            )
        found.append(_adapter(chain / str(i), lineage, i))
    return found


def _adapter(folder: Path, lineage: tuple[dict[str, Any], ...], index: int) -> StartAdapter:
    """The adapter in ``folder`` with the hash its lineage entry records (its weights' own when
    the record says none)."""
    weights = folder / ADAPTER_WEIGHTS
    if not (folder / ADAPTER_CONFIG).is_file() or not weights.is_file():
        raise XtrainError(
            f"{folder} lacks {ADAPTER_CONFIG} or {ADAPTER_WEIGHTS}: a chained result's adapter is missing",
            "use the result folder as its run wrote it (every file of adapter/ kept)",
        )
    recorded = lineage[index].get("adapter_sha256")
    sha = recorded if isinstance(recorded, str) and recorded else file_sha256(weights)
    return StartAdapter(str(folder), sha, index)


def check_unchanged(adapter: StartAdapter) -> None:
    """The adapter's weights are the ones its record names (read before they are applied): a
    file replaced since its run wrote it is one line, not another model silently."""
    path = Path(adapter.path) / ADAPTER_WEIGHTS
    if file_sha256(path) != adapter.sha256:
        raise XtrainError(
            f"{path} changed since its run recorded it (sha256 {adapter.sha256[:12]}...)",
            "train that stage again, or start from the result folder as its run wrote it",
        )


def seal(record: str, folder: Path) -> str:
    """The run record ``record`` (JSON text) with its ``adapter_sha256`` filled from the adapter
    just written into ``folder`` (a whole model's stays None)."""
    data = json.loads(record)
    weights = folder / ADAPTER_WEIGHTS
    if SHA in data and data[SHA] is None and weights.is_file():
        data[SHA] = file_sha256(weights)
    return json.dumps(data)
