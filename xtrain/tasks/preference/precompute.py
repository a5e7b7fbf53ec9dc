"""``preference.precompute_reference``: the reference's log-probs of every answer, computed once
before training, each process its share, and stored with the data's fingerprint.

The task's build runs on the main process first (it fills the datasets cache), so no collective
can run inside it; the computation is the workload's ``shared_pass``, which the loop calls on
every process after the build and the memory levers (so the numbers are computed as the live
reference would compute them: chunked when the run's loss is) and before ``prepare`` (the model
is whole in each process, as it was built). Each process reads ``ceil(rows / processes)``
consecutive rows of each split, one gather joins the shares in row order, the main process
writes the file (atomically) and every process attaches the numbers to its rows
(``ref_first``/``ref_second``: the batches carry the reference from then on). When the file of
this fingerprint exists, the main process's word (one broadcast) makes every process read it
instead: a resumed run, or one with another process count, computes nothing again.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from xtrain.model.start import start_of

if TYPE_CHECKING:
    from accelerate import Accelerator

    from xtrain.planning.run import Run
    from xtrain.tasks.preference.reference import PreferenceForward

REFERENCE_DIR = "preference-reference"  # under run.output_dir
# rows -> a batch: collate.PreferenceCollator; vision-preference's KeyedCollator (rows with images)
Collate = Callable[[list[dict[str, Any]]], dict[str, Any]]
# a split's rows: encoded rows (``encoded.WithNumbers``: the numbers attached to it) or row dicts
Rows = Sequence[dict[str, Any]]


def fingerprint(run: Run, splits: dict[str, Rows]) -> str:
    """What the reference log-probs depend on: the model the stage starts from (a result's base
    and adapters), how it is loaded and computes, and every sequence of the data (token ids and
    labels: encoded rows' own fingerprint, else the rows hashed). Not the process count."""
    m = run.cfg.model
    start = start_of(m.name_or_path)  # a trained result: its base and every adapter, by hash
    model = [start.base, [a.sha256 for a in start.adapters], run.cfg.lora.continue_adapter]
    h = hashlib.sha256()
    h.update(json.dumps([model, m.dtype, m.quantization, run.precision, sorted(splits)]).encode())
    for name in sorted(splits):
        rows = splits[name]
        if getattr(rows, "fingerprint", None) is not None:  # encoded rows (encoded.WithNumbers)
            h.update(json.dumps([name, len(rows), rows.fingerprint]).encode())  # type: ignore[union-attr]
            continue
        for row in rows:
            h.update(json.dumps([v for k, v in sorted(row.items()) if not k.startswith("ref_")]).encode())
    return h.hexdigest()[:24]


def compute(
    forward: PreferenceForward,
    model: torch.nn.Module,
    rows: Rows,
    collator: Collate,
    device: str,
    batch: int,
    span: range | None = None,
) -> torch.Tensor:
    """[len(span), 2]: the reference's summed log-probs of the two sequences of each row in
    ``span`` (all of them), on the CPU."""
    values = [torch.zeros(0, 2)]
    span = span if span is not None else range(len(rows))
    was_training = model.training
    model.train()  # dropout is off; a 4-bit layer keeps its training layout (no eval-mode repacking)
    for start in range(span.start, span.stop, batch):
        features = [rows[i] for i in range(start, min(start + batch, span.stop))]
        b = {k: v.to(device) if torch.is_tensor(v) else v for k, v in collator(features).items()}
        with forward.autocast():
            logps = forward.reference_logps(model, b).float().cpu()
        n = len(features)
        values.append(torch.stack([logps[:n], logps[n:]], dim=1))
    model.train(was_training)
    return torch.cat(values)


@dataclass
class Precompute:
    """``Workload.shared_pass`` of a preference run with ``preference.precompute_reference``."""

    run: Run
    forward: PreferenceForward
    model: torch.nn.Module
    splits: dict[str, Rows]
    collator: Collate

    @property
    def path(self) -> Path:
        out = Path(self.run.cfg.run.output_dir).expanduser()
        return out / REFERENCE_DIR / f"{fingerprint(self.run, self.splits)}.pt"

    def __call__(self, accelerator: Accelerator | None) -> None:
        """Compute (each process its share, gathered) or read the stored numbers, and attach
        them to the rows. ``accelerator``: the run's; None for one process outside the loop."""
        path = self.path
        if _main_says(accelerator, path.is_file()):
            stored = torch.load(path, map_location="cpu", weights_only=True)
        else:
            stored = {name: self._shared(accelerator, rows) for name, rows in sorted(self.splits.items())}
            if accelerator is None or accelerator.is_main_process:
                from xtrain.atomic import write_bytes

                buffer = io.BytesIO()
                torch.save(stored, buffer)
                path.parent.mkdir(parents=True, exist_ok=True)
                write_bytes(path, buffer.getvalue())
        for name, rows in self.splits.items():
            if hasattr(rows, "attach"):  # encoded rows: the numbers beside them, read with each row
                rows.attach("ref_first", stored[name][:, 0].numpy())  # type: ignore[union-attr]
                rows.attach("ref_second", stored[name][:, 1].numpy())  # type: ignore[union-attr]
                continue
            for row, (first, second) in zip(rows, stored[name].tolist(), strict=True):
                row["ref_first"], row["ref_second"] = float(first), float(second)
        self.forward.reference = None  # nothing live from now on: a full fine-tune's copy is freed

    def _shared(self, accelerator: Accelerator | None, rows: Rows) -> torch.Tensor:
        """This process's consecutive share of ``rows`` computed, every share gathered in order."""
        world = accelerator.num_processes if accelerator is not None else 1
        rank = accelerator.process_index if accelerator is not None else 0
        share = math.ceil(len(rows) / world)
        mine = range(min(rank * share, len(rows)), min((rank + 1) * share, len(rows)))
        per_device = self.run.settings.per_device
        values = compute(self.forward, self.model, rows, self.collator, self.run.device, per_device, mine)
        if accelerator is None or world == 1:
            return values
        padded = torch.zeros(share, 2)
        padded[: len(values)] = values
        gathered = accelerator.gather(padded.to(accelerator.device)).cpu()  # [world * share, 2]
        return gathered[: len(rows)]


def _main_says(accelerator: Accelerator | None, answer: bool) -> bool:
    """The main process's ``answer``, on every process (one broadcast): all read, or all compute."""
    if accelerator is None or accelerator.num_processes == 1:
        return answer
    from accelerate.utils import broadcast_object_list

    word = [answer]
    broadcast_object_list(word, from_process=0)
    return bool(word[0])
