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

The record names the lineage, oldest first: ``{"task", "source" (the result folder the stage
wrote), "adapter_sha256", "mode": "new" | "continue" | "full"}``, and ``"base"``, the model the
adapters apply to (the original base; a merged or fully fine-tuned start's own folder).
"""

from __future__ import annotations

import hashlib
import json
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
MODES = ("new", "continue", "full")  # how a stage trained: a new adapter, the last one continued, whole
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
    raise XtrainError(
        f"{folder} holds no adapter or model",
        "pass a finished run's output_dir (with adapter/ or model/), or the adapter folder itself",
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
        adapters = f"{len(self.adapters)} adapter{'s' * (len(self.adapters) != 1)}"
        return f"{self.name} ({stages}: {adapters} on {self.base})"

    def lineage_with(self, own: dict[str, Any]) -> list[dict[str, Any]]:
        """The lineage of a stage trained from this start: this start's, then the stage's ``own``."""
        return [*self.lineage, own]


def stage_record(start: Start, task: str, output_dir: str, mode: str) -> dict[str, Any]:
    """The run record's ``lineage`` and ``base`` for a stage of ``task`` trained from ``start``
    into ``output_dir`` (``mode``: new, continue or full); its adapter's hash is filled when the
    adapter is written (``seal``)."""
    own = {"task": task, "source": _absolute(output_dir), "adapter_sha256": None, "mode": mode}
    base = start.base if builtin.is_builtin(start.base) else _absolute(start.base)
    return {LINEAGE: start.lineage_with(own), BASE: base}


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
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def start_of(name: str) -> Start:
    """The ``Start`` of ``model.name_or_path``: a trained result read from its files, anything
    else (a built-in, a hub id, a model folder without a record, a path not there: the preflight
    says so) its own base. A folder that is neither a model nor a result is one line."""
    if builtin.is_builtin(name) or not Path(name).expanduser().is_dir():
        return Start(name, name)
    try:
        folder = model_folder(name)
    except XtrainError:  # neither a model nor a result: the load says what it lacks
        return Start(name, name)
    record_path = folder / RUN_FILE
    stamp = record_path.stat().st_mtime_ns if record_path.is_file() else 0
    return _read_start(name, str(folder), stamp)


@lru_cache(maxsize=32)
def _read_start(name: str, where: str, stamp: int) -> Start:
    """``start_of``'s reading, once per name, folder and record (``stamp``: its time)."""
    folder = Path(where)
    record = read_json_object(folder / RUN_FILE)
    lineage = tuple(e for e in record.get(LINEAGE) or () if isinstance(e, dict))
    task = record.get("task") if isinstance(record.get("task"), str) else None
    if not (folder / ADAPTER_CONFIG).is_file():  # a whole model: its own base, its history kept
        if not record:
            return Start(name, name)
        return Start(name, str(folder), task=task, lineage=lineage)
    config = read_json_object(folder / ADAPTER_CONFIG)
    base = record.get(BASE) or config.get("base_model_name_or_path")
    if not isinstance(base, str) or not base:
        raise XtrainError(
            f"{folder / ADAPTER_CONFIG} does not name its base model (base_model_name_or_path)",
            "set base_model_name_or_path in it to the model the adapter was trained on",
        )
    if not lineage:  # an adapter trained before records named their lineage, or by another tool
        own = {"task": task, "source": str(folder), "adapter_sha256": None, "mode": "new"}
        lineage = (own,)
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
    """The run record ``record`` (JSON text) with its own lineage entry's ``adapter_sha256``
    filled from the adapter just written into ``folder`` (a whole model's stays None)."""
    data = json.loads(record)
    lineage = data.get(LINEAGE)
    weights = folder / ADAPTER_WEIGHTS
    if lineage and lineage[-1].get("adapter_sha256") is None and weights.is_file():
        lineage[-1]["adapter_sha256"] = file_sha256(weights)
    return json.dumps(data)
