"""Where checkpoints live under ``run.output_dir`` and what xtrain's state file holds: the names,
``TrainState``, finding the complete and the unfinished ones."""

from __future__ import annotations

import json
import re
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, get_type_hints

from xtrain import structured
from xtrain.errors import XtrainError
from xtrain.model.start import CHECKPOINTS, STATE_FILE, STEP_DIR

MANIFEST_FILE = "manifest.json"
RESULT_FILE = "train_result.json"  # in output_dir: what the run produced (outputs.write_result)
STATE_VERSION = 1
TMP_DIR = re.compile(r"^step-(\d+)\.tmp$")


@dataclass
class TrainState:
    """What xtrain itself adds to accelerate's state: the position and the run's history."""

    step: int  # optimizer steps done
    epoch: int  # epoch of the next step
    step_in_epoch: int  # position of the next step inside its epoch
    samples_seen: int
    seed: int
    global_batch: int
    per_device: int
    world_size: int
    accumulation: int
    num_samples: int
    total_steps: int
    config: dict[str, dict[str, Any]] = field(default_factory=dict)  # {section: {key: value}}
    losses: list[list[float]] = field(default_factory=list)  # [[step, loss], ...] at log points
    eval_history: list[dict[str, float]] = field(default_factory=list)
    skipped_steps: int = 0  # fp16 overflow steps the scaler skipped
    # each logging window's logged values with its step (an older checkpoint's: [], its losses only)
    log_history: list[dict[str, float]] = field(default_factory=list)
    # the sha256 of each adapter the run started from (model.start: a trained result), in order
    start: list[str] = field(default_factory=list)
    version: int = STATE_VERSION

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, default=str)

    @classmethod
    def from_file(cls, path: Path) -> TrainState:
        """The state file, typed field by field: a wrong type is a ``ValueError`` naming the file
        and the field (a hand-edited or foreign file), never a ``TypeError`` later in the loop."""
        try:
            return cls.from_dict(structured.load_json(path.read_text(encoding="utf-8")))
        except ValueError as e:  # JSON syntax, a key twice, nesting, a field's type
            raise ValueError(f"{path.name}: {e}") from None

    @classmethod
    def from_dict(cls, data: object) -> TrainState:
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        hints = get_type_hints(cls)
        values = {}
        for f in fields(cls):
            if f.name not in data:
                if f.default is MISSING and f.default_factory is MISSING:
                    raise ValueError(f"field '{f.name}' is missing")
                continue  # a field newer than the file: its default
            value = data[f.name]
            why = structured.field_error(value, hints[f.name])
            if why is None and isinstance(value, int) and value < 0:
                why = f"a count >= 0 expected, got {value}"
            if why is not None:
                raise ValueError(f"field '{f.name}': {why}")
            values[f.name] = value
        return cls(**values)


def written_by(path: Path) -> str:
    """How a checkpoint's model was saved: "FSDP" (accelerate's torch.distributed.checkpoint
    folder), "DeepSpeed" (its engine's folder) or "plain" (xtrain's trainable weights file)."""
    if (path / "pytorch_model_fsdp_0").is_dir():
        return "FSDP"
    if (path / "pytorch_model").is_dir():
        return "DeepSpeed"
    return "plain"


def checkpoints_dir(output_dir: str | Path) -> Path:
    return Path(output_dir) / CHECKPOINTS


def is_complete(path: Path) -> bool:
    return path.is_dir() and STEP_DIR.match(path.name) is not None and (path / STATE_FILE).is_file()


def list_checkpoints(output_dir: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints, oldest first, as (step, path)."""
    root = checkpoints_dir(output_dir)
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = STEP_DIR.match(p.name)
        if m and is_complete(p):
            found.append((int(m.group(1)), p))
    return sorted(found)


def partial_checkpoints(output_dir: str | Path) -> list[Path]:
    """Checkpoints whose write did not finish (``step-N.tmp``)."""
    root = checkpoints_dir(output_dir)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if TMP_DIR.match(p.name))


def check_output_dir(output_dir: str | Path) -> Path:
    """``run.output_dir`` must be a folder or not exist yet (checked before anything starts)."""
    out = Path(output_dir).expanduser()
    for p in (out, *out.parents):
        if p.exists() and not p.is_dir():
            raise XtrainError(
                f"run.output_dir {out} cannot be a folder: {p} is a file", "choose another run.output_dir"
            )
    return out
