"""The data checked before launch: ``xtrain train --dry-run`` and the start of every run read the
first rows of the data the way the run reads them and return a ``DataReport``.

Each task's ``check_data(cfg, limit)`` hook (``contract.Task``) loads the tokenizer or processor
(never the model weights), reads the first ``limit`` rows of each data source (``first_samples``:
streamed by the run's own ``datasets`` builders, so a 10 GB file costs its first rows) and passes
them through the task's own readers and tokenising functions, the ones its ``build`` uses: a row
the run would refuse is refused here with the same line (file, row, field), before any model loads.
The run's ``build`` calls the same task function on the first rows of the data it loaded
(``loaded_samples``: nothing read twice) and keeps the report in ``Workload.data_report``.

The report is plain data: what was read (rows, row format), token lengths and how many rows
``data.max_length`` cuts, label counts, images or audio per row, and one example as the model gets
it, split into pieces with and without loss. The CLI renders it (``xtrain/commands/data_report.py``);
the run's banner shows ``DataReport.summary()``.
"""

from __future__ import annotations

import contextlib
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from xtrain import builtin
from xtrain.data import mixing
from xtrain.data.collate import IGNORE_INDEX
from xtrain.data.labels import label_key, label_values, labels_of
from xtrain.data.rows.formats import text_names
from xtrain.data.rows.images import describe, image_size
from xtrain.data.sources import first_rows
from xtrain.errors import NoTokenizer, XtrainError
from xtrain.model.configs import read_config_offline
from xtrain.tasks.common import base_dir, media_dirs, prepare_tokenizer
from xtrain.tasks.data_report import Example, Piece, SourceCheck

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import PreTrainedTokenizerBase

    from xtrain.config.schema import TrainConfig

    # what ``labels_of`` returns: (label -> id or None, num_labels, id -> name)
    LabelMapping = tuple[dict[str, int] | None, int, dict[int, str] | None]
    # what a text task's check found of its model (``text_check``): (source, tokenizer), or None
    Tokenizer = tuple[str, PreTrainedTokenizerBase] | None

T = TypeVar("T")
ROWS = 100  # rows of each data source the check reads: about a second on any data
NO_CUT = 1 << 30  # a max_length that cuts nothing: each row's whole length
REPEAT = 4  # a special token repeated this often (expanded image placeholders) is written once


# ---------------------------------------------------------------------------------------------
# The first rows of the data


@dataclass
class Sample:
    """The first rows of one data source, as the run reads them."""

    ds: Dataset  # a datasets.Dataset of those rows
    name: str  # the source, as messages name it
    role: str  # train | eval
    total: int | None  # its row count, None where unknown
    folder: Path | None  # where its relative image and audio paths are relative to

    @property
    def whole(self) -> bool:
        return self.total is not None and self.total == len(self.ds)

    def check(self, **found: Any) -> SourceCheck:
        return SourceCheck(self.role, self.name, len(self.ds), self.total, **found)


def first_samples(cfg: TrainConfig, limit: int, media: str = "image") -> tuple[list[Sample], list[str]]:
    """The first ``limit`` rows of each ``data.train`` file and of ``data.eval`` (``first_rows``,
    cut to ``data.max_samples``), and notes on what is not read here (a hub data set, an eval
    split made at load time) and how several files are mixed. ``media``: what the rows' paths
    name ("image" or "audio": ``common.media_dirs``)."""
    d = cfg.data
    if not d.train:
        raise XtrainError(
            "data.train is not set", "set data.train to a file, a folder, a hub id or builtin:NAME"
        )
    samples, notes = [], []
    text = text_names(d)
    root = getattr(d, f"{media}_root")
    sources = [("train", f) for f in d.train_sources()] + ([("eval", d.eval)] if d.eval else [])
    for role, source in sources:
        found = first_rows(source, d.format, limit, role, f"data.{role}", text)
        if found is None:
            notes.append(
                f"data.{role} {source} is not a local file or folder: the run loads it from the "
                "Hugging Face hub (not read here: nothing is downloaded to check it)"
            )
            continue
        ds, total = found
        if d.max_samples is not None:  # the rows the run reads: at most max_samples
            known = total is not None or d.max_samples <= len(ds)
            ds = mixing.first_n(ds, d.max_samples)
            total = min(total or d.max_samples, d.max_samples) if known else None
        folder = media_dirs(cfg, media)[0] if root is not None else base_dir(source, role)
        samples.append(Sample(ds, source, role, total, folder))
    mixed = mixing.describe(d)
    if mixed:
        notes.append(mixed)
    if not d.eval and d.eval_fraction > 0:
        files = " + ".join(d.train_sources())
        notes.append(f"data.eval_fraction={d.eval_fraction}: the run splits the eval rows off {files}")
    return samples, notes


def loaded_samples(
    cfg: TrainConfig, sets: list[tuple[Dataset | None, str, str]], limit: int = ROWS, media: str = "image"
) -> list[Sample]:
    """The first ``limit`` rows of data sets the run loaded: [(data set or None, name, role)]."""
    folders = dict(zip(("train", "eval"), media_dirs(cfg, media), strict=True))
    return [
        Sample(ds.select(range(min(limit, len(ds)))), name, role, len(ds), folders[role])
        for ds, name, role in sets
        if ds is not None
    ]


def loaded_or_note(cfg: TrainConfig, notes: list[str], load: Callable[[], T]) -> T | None:
    """``load()`` (the tokenizer or processor); where it fails for a hub model (not on this
    machine, no network; a folder with a config.json and no tokenizer files, as for a memory plan),
    None and a note: the rows are then checked without tokenising them. A local or built-in model
    that fails to load otherwise is the run's own error."""
    try:
        return load()
    except XtrainError as e:
        name = cfg.model.name_or_path
        local = builtin.is_builtin(name) or Path(name).expanduser().exists()
        if local and not isinstance(e, NoTokenizer):
            raise
        notes.append(f"rows checked without tokenizing them, no example: {e.message}")
        return None


def text_check(cfg: TrainConfig, limit: int) -> tuple[Tokenizer, list[Sample], list[str]]:
    """What a text task's ``check_data`` reads: (the model's source and tokenizer, or None where
    it cannot load here: ``loaded_or_note``), the first ``limit`` rows of each source and the
    notes."""
    samples, notes = first_samples(cfg, limit)
    return loaded_or_note(cfg, notes, lambda: prepare_tokenizer(cfg, contextlib.nullcontext)), samples, notes


# ---------------------------------------------------------------------------------------------
# Shared pieces of the tasks' checks


def trained_tokens(labels: list[int]) -> int:
    """A row's tokens with loss, as the step's loss counts them (a row's first label is never a
    next-token target: ``train/step_loss.py``)."""
    return sum(1 for t in labels[1:] if t != IGNORE_INDEX)


def pieces(
    tokenizer: PreTrainedTokenizerBase, ids: list[int], labels: list[int] | None = None
) -> list[Piece]:
    """Token ids as text pieces, exactly as the model gets them: each run of tokens with loss (a
    label other than -100) or without decoded together, special tokens shown. Only a run of
    ``REPEAT`` or more of one special token (an image placeholder expanded into its patches) is
    cut, to its first token and a count (``Piece.more``: the renderer's marker); text is never
    cut, so a row's ``}}}}}`` reads as it is."""
    flags = [False] * len(ids) if labels is None else [t != IGNORE_INDEX for t in labels[: len(ids)]]
    special = _special_ids(tokenizer)
    out: list[Piece] = []
    start = i = 0
    while i < len(ids):
        j = i
        while j < len(ids) and ids[j] == ids[i] and flags[j] == flags[i]:
            j += 1
        if ids[i] in special and j - i >= REPEAT:  # written once, with how many more follow
            out += _plain(tokenizer, ids, flags, start, i)
            out.append(Piece(_text(tokenizer, ids[i : i + 1]), flags[i], more=j - i - 1))
            start = j
        i = j
    return out + _plain(tokenizer, ids, flags, start, len(ids))


def _plain(
    tokenizer: PreTrainedTokenizerBase, ids: list[int], flags: list[bool], start: int, end: int
) -> list[Piece]:
    """``ids[start:end]`` as pieces, one for each run of tokens with loss or without."""
    out = []
    for i in range(start + 1, end + 1):
        if i == end or flags[i] != flags[start]:
            out.append(Piece(_text(tokenizer, ids[start:i]), flags[start]))
            start = i
    return out


def _special_ids(tokenizer: PreTrainedTokenizerBase) -> set[int]:
    """The ids of the tokenizer's special tokens (its added ones marked special too)."""
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    return set(tokenizer.all_special_ids) | {i for i, t in added.items() if getattr(t, "special", False)}


def _text(tokenizer: PreTrainedTokenizerBase, ids: list[int]) -> str:
    if not ids:
        return ""
    return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


def example_of(
    sample: Sample,
    row: int,
    tokenizer: PreTrainedTokenizerBase,
    ids: list[int],
    labels: list[int] | None,
    **more: Any,
) -> Example:
    """Row ``row`` of ``sample`` as the model gets it: ``ids`` with their ``labels``."""
    trained = 0 if labels is None else sum(1 for t in labels[: len(ids)] if t != IGNORE_INDEX)
    shown = pieces(tokenizer, ids, labels)
    return Example(sample.name, row, shown, tokens=len(ids), trained=trained, **more)


def label_counts(ds: Dataset, column: str) -> dict[str, int]:
    """Rows per label of ``column`` (label names of a ``ClassLabel`` column)."""
    feature = ds.features.get(column)
    names = list(feature.names) if hasattr(feature, "names") else None
    values = [names[v] if names is not None and isinstance(v, int) else label_key(v) for v in ds[column]]
    return dict(Counter(values))


def check_labels(cfg: TrainConfig, samples: list[Sample], column: str) -> LabelMapping | None:
    """The run's label mapping (``labels_of``) when the samples are the whole data; on the
    first rows only, each value is checked to be one label (a count of classes needs every row).
    Returns the mapping's (label -> id or None, num_labels, id -> name) or None."""
    train = next((s for s in samples if s.role == "train"), None)
    if train is None:
        return None
    other = next((s for s in samples if s.role == "eval"), None)
    if all(s.whole for s in samples) and (other is not None or not cfg.data.eval):
        names = (train.name, other.name if other is not None else "")
        return labels_of(
            train.ds, other.ds if other is not None else None, column, cfg.model.num_labels, names
        )
    for s in samples:
        label_values(s.ds, column, s.name)
    return None


GENERIC_LABEL = re.compile(r"^LABEL_\d+$")


def labels_against_model(
    cfg: TrainConfig, labels: list[str], ints: bool, head: str, new_head: bool, complete: bool
) -> list[str]:
    """The data's labels against the classes of a checkpoint that already has a trained ``head``
    (its architecture's suffix, e.g. ``ForSequenceClassification``) naming them (``id2label``),
    read where its config is on this machine. ``new_head``: the run replaces a head of another
    size (image-classification) instead of refusing to load it (seq-cls). ``complete``: ``labels``
    are every label of the data (else the first rows'). Returns notes; refuses what would fail at
    load or train the head's classes under other names."""
    config = read_config_offline(cfg)
    if isinstance(config, str) or not any(str(a).endswith(head) for a in config.architectures or []):
        return []
    classes = {int(k): str(v) for k, v in (getattr(config, "id2label", None) or {}).items()}
    if not classes or all(GENERIC_LABEL.match(v) for v in classes.values()):
        return []
    name, m = cfg.model.name_or_path, len(classes)
    theirs = ", ".join(f"{i} = {classes[i]}" for i in sorted(classes)[:8]) + (", ..." if m > 8 else "")
    if ints:
        n = cfg.model.num_labels or (max(int(v) for v in labels) + 1 if labels else 0)
        known = complete or cfg.model.num_labels is not None or n > m
        if n == m or not known:
            return [f"integer labels are the classes of {name}'s head: {theirs}"]
        return _other_size(name, n, m, theirs, new_head)
    ours = sorted(labels)
    if set(ours) == set(classes.values()):
        if ours == [classes[i] for i in sorted(classes)]:
            return [f"the labels are the classes of {name}'s head, in its order"]
        mine = ", ".join(f"{i} = {v}" for i, v in enumerate(ours[:8]))
        raise XtrainError(
            f"the labels are the classes of {name}'s head in another order: xtrain numbers label "
            f"names in sorted order ({mine}), the head has {theirs}",
            "use the head's ids as integer labels, so each class keeps its trained row",
        )
    if complete and len(ours) != m:
        return _other_size(name, len(ours), m, theirs, new_head)
    if complete:
        return [f"{name}'s head ({theirs}) trains on as the data's labels, in sorted order"]
    return []


def _other_size(name: str, n: int, m: int, theirs: str, new_head: bool) -> list[str]:
    if new_head:
        return [f"a new head of {n} classes replaces {name}'s head of {m} ({theirs})"]
    raise XtrainError(
        f"{name} has a trained head of {m} classes ({theirs}) and the data has {n}",
        "start from the checkpoint without that head, or label the data with its classes",
    )


@dataclass
class Classes:
    """The labels a classification check found: the run's mapping where the check read every row."""

    mapping: dict[str, int] | None  # label name -> id; None: integer labels (or unknown, partial)
    id2label: dict[int, str] | None
    notes: list[str]
    seen: list[str] = field(default_factory=list)  # label names of the checked rows (no mapping)

    def to_id(self) -> dict[str, int] | None:
        """``label_to_id`` for the tokenising functions: the run's mapping, else the checked
        rows' names numbered in sorted order (None: integer labels)."""
        if self.mapping is not None or not self.seen:
            return self.mapping
        return {name: i for i, name in enumerate(self.seen)}

    def text(self, value: Any) -> str:
        """A label value as the example shows it: ``positive (id 1)``, ``2``, ``circle (id 0)``."""
        key = label_key(value)
        if self.mapping is not None:
            return f"{key} (id {self.mapping[key]})" if key in self.mapping else key
        name = (self.id2label or {}).get(int(value)) if key.lstrip("-").isdigit() else None
        return f"{name} (id {key})" if name is not None else key


def classes(
    cfg: TrainConfig,
    samples: list[Sample],
    column: str,
    head: str,
    new_head: bool,
    found: LabelMapping | None = None,
) -> Classes:
    """The labels of ``column`` checked (``check_labels``, or ``found``: the run's own
    ``labels_of``) and held against the model's classes (``labels_against_model``)."""
    found = found or check_labels(cfg, samples, column)
    if found is not None:
        mapping, n, id2label = found
        labels = [str(i) for i in range(n)] if mapping is None else list(mapping)
        notes = labels_against_model(cfg, labels, mapping is None, head, new_head, complete=True)
        return Classes(mapping, id2label, notes)
    values = [v for s in samples for v in label_values(s.ds, column, s.name)]
    ints = all(isinstance(v, int) and not isinstance(v, bool) for v in values)
    labels = sorted({label_key(v) for v in values})
    notes = labels_against_model(cfg, labels, ints, head, new_head, complete=False)
    return Classes(None, None, notes, seen=[] if ints else labels)


# ---------------------------------------------------------------------------------------------
# Media


def image_line(ref: str | dict[str, Any], folder: Path | None) -> str:
    """``image /data/img/0.png (640x480)``: an image cell and its size, for the example."""
    try:
        height, width = image_size(ref, folder)
    except Exception:  # the run says it in its own line when it reads the row
        return f"image {describe(ref, folder)}"
    return f"image {describe(ref, folder)} ({width}x{height})"
