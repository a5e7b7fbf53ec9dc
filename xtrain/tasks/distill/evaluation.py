"""Distillation's evaluation (``Workload.evaluate``): every eval prompt answered greedily by the
student and by the teacher (the teacher's answers made once a run: it does not change), each
process its share of the eval loader, gathered in data order:

- ``agreement``: the share of prompts the student answers exactly as the teacher (the texts, their
  ends' white space aside): the run's headline;
- ``kl``: the reverse KL(student || teacher) a token, exact over the vocabulary, on the teacher's
  answers (the same tokens at every evaluation, so the curve compares);
- ``token_agreement``: on those tokens, the share where the student's most likely next token is
  the teacher's;
- ``completion_length``: the student's answers' mean length in tokens.

And the first few prompts with both answers. No ``eval_loss``: the training loss is measured on
the student's own samples, which change with the student.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from xtrain.model.decoding import generate
from xtrain.tasks.contract import Prediction
from xtrain.tasks.distill.step import divergence_sums
from xtrain.tasks.grpo.rollout import unwrapped

if TYPE_CHECKING:
    from accelerate import Accelerator
    from torch.utils.data import DataLoader
    from transformers import PreTrainedTokenizerBase

    from xtrain.tasks.distill.rows import DistillRows
    from xtrain.tasks.distill.step import DistillStep

SAMPLES = 4  # eval prompts shown with both answers at each evaluation
METRIC = "agreement"


class DistillEval:
    """``evaluate(accelerator, model, eval_loader) -> (metrics, predictions)``."""

    def __init__(self, step: DistillStep, rows: DistillRows, tokenizer: PreTrainedTokenizerBase) -> None:
        self.step, self.rows, self.tokenizer = step, rows, tokenizer
        self.teacher_answers: dict[int, list[int]] = {}  # data row -> the teacher's greedy answer

    def __call__(
        self, accelerator: Accelerator, model: torch.nn.Module, loader: DataLoader
    ) -> tuple[dict[str, float], list[Prediction]]:
        from xtrain.model.sharding import generate_kwargs

        s = self.step
        inner = unwrapped(model)
        was_training = model.training
        model.eval()
        sharded = bool(generate_kwargs(accelerator))
        gathered: list[torch.Tensor] = []
        shown: list[tuple[int, str, str]] = []
        with torch.no_grad():
            for batch in loader:
                batch = {k: v.to(accelerator.device) for k, v in batch.items()}
                rows = batch["row"].tolist()
                with accelerator.autocast():
                    mine = generate(inner, batch["input_ids"], batch["attention_mask"],
                                    max_new_tokens=s.d.max_completion_length, pad_id=s.pad_id, stop=s.stop,
                                    synced=sharded)  # fmt: skip
                    theirs = self._teacher_answers(batch, rows)
                    scored = self._scored(inner, batch, theirs)
                texts = self.tokenizer.batch_decode(mine.ids, skip_special_tokens=True)
                wanted = self.tokenizer.batch_decode(theirs[0], skip_special_tokens=True)
                same = [float(a.strip() == b.strip()) for a, b in zip(texts, wanted, strict=True)]
                lengths = mine.mask.sum(1).float().cpu()
                local = torch.cat(
                    [torch.tensor([rows, same], dtype=torch.float32).T, scored, lengths.unsqueeze(1)], 1
                )
                gathered.append(accelerator.gather_for_metrics(local.to(accelerator.device)).cpu())
                shown += list(zip(rows, wanted, texts, strict=True))[: max(0, SAMPLES - len(shown))]
        if was_training:
            model.train()
        if not gathered:
            return {}, []
        table = torch.cat(gathered)
        tokens = float(table[:, 4].sum())
        metrics = {
            METRIC: float(table[:, 1].mean()),
            "kl": float(table[:, 2].sum()) / max(tokens, 1.0),
            "token_agreement": float(table[:, 3].sum()) / max(tokens, 1.0),
            "completion_length": float(table[:, 5].mean()),
        }
        samples = [
            Prediction(
                reference=wanted.strip(), prediction=text.strip(),
                labels=("the teacher's greedy answer", "the student's greedy answer"),
                details={"prompt": self.rows[row].shown},
            )
            for row, wanted, text in shown
        ]  # fmt: skip
        return metrics, samples

    def _teacher_answers(self, batch: dict[str, Any], rows: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """([B, L] the teacher's greedy answers to the batch's prompts, [B, L] which are tokens),
        made once a row."""
        s = self.step
        missing = [i for i, r in enumerate(rows) if r not in self.teacher_answers]
        if missing:
            at = torch.tensor(missing, device=batch["input_ids"].device)
            done = generate(
                s.teacher.model, batch["input_ids"][at], batch["attention_mask"][at],
                max_new_tokens=s.d.max_completion_length, pad_id=s.pad_id, stop=s.stop,
            )  # fmt: skip
            for i, ids, mask in zip(missing, done.ids.tolist(), done.mask.tolist(), strict=True):
                self.teacher_answers[rows[i]] = [t for t, m in zip(ids, mask, strict=True) if m]
        answers = [self.teacher_answers[r] for r in rows]
        width = max(1, max(len(a) for a in answers))
        device = batch["input_ids"].device
        ids = torch.tensor(
            [a + [s.pad_id] * (width - len(a)) for a in answers], dtype=torch.long, device=device
        )
        mask = torch.tensor([[1] * len(a) + [0] * (width - len(a)) for a in answers], device=device)
        return ids, mask

    def _scored(
        self, model: torch.nn.Module, batch: dict[str, Any], answers: tuple[torch.Tensor, torch.Tensor]
    ) -> torch.Tensor:
        """[B, 3] each row's summed exact reverse KL, top-1 agreements and tokens on the teacher's
        answer (teacher-forced: the prompt, then the answer)."""
        from xtrain.tasks.distill.losses import Divergence

        s = self.step
        (ids, mask), prompt = answers, batch["input_ids"]
        completed = {
            "input_ids": torch.cat([prompt, ids], 1),
            "attention_mask": torch.cat([batch["attention_mask"], mask], 1),
            "labels": torch.cat([torch.full_like(prompt, -100), ids.masked_fill(mask == 0, -100)], 1),
        }
        how = Divergence("gkd", 1.0, s.how.vocab)  # (its loss is not read: the KL and agreement are)
        sums, keep = divergence_sums(model, s.teacher, completed, how, s.chunks)
        row = torch.div(keep, completed["input_ids"].size(1), rounding_mode="floor").cpu()
        out = torch.zeros(prompt.size(0), 3)
        out[:, 0].index_add_(0, row, sums.kl.float().cpu())
        out[:, 1].index_add_(0, row, sums.agree.float().cpu())
        out[:, 2].index_add_(0, row, torch.ones(len(row)))
        return out
