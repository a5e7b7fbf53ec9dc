"""The preference task's evaluation (``Workload.evaluate``): the reward metrics over the whole eval
set, gathered from every rank in data order (as the loop's forward-only evaluation gathers them),
the share of the first eval prompts whose greedy answer is their chosen answer (``greedy/match``:
a run whose reward accuracy climbs while this falls is losing the answers it should keep, the
task's notes say so), and the policy's greedy answers to the first few eval prompts next to their
chosen answers, so a run shows its generations change from one evaluation to the next (the
quickstart's closing table prints the last ones).

Every process generates the same prompts (a sharded model's forwards are collective), in batches
of ``MATCH_BATCH`` left-padded prompts, each up to the longest chosen answer of its batch plus one
token (past the answer, a model that does not stop says more: no match) and at least
``NEW_TOKENS``. An answer matches when its text (special tokens left out, spaces at the ends
stripped) is the chosen answer's."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from xtrain.data.collate import IGNORE_INDEX
from xtrain.tasks.contract import Prediction
from xtrain.tasks.preference import losses as pl

if TYPE_CHECKING:
    from collections.abc import Sequence

    from accelerate import Accelerator
    from torch.utils.data import DataLoader
    from transformers import PreTrainedTokenizerBase

    from xtrain.tasks.preference.reference import PreferenceForward

SAMPLES = 3  # eval prompts whose answers are shown at each evaluation
NEW_TOKENS = 24  # generated answers run at least this long (tokens)
MATCH_PROMPTS = 64  # the greedy match is measured on this many eval prompts (the first)
MATCH_BATCH = 16  # prompts a generate call
MATCH = "greedy/match"


class PreferenceEval:
    """``evaluate(accelerator, model, eval_loader) -> (metrics with eval_loss, predictions)``."""

    def __init__(
        self,
        forward: PreferenceForward,
        rows: Sequence[dict[str, Any]],
        tokenizer: PreTrainedTokenizerBase,
        part: str = "chosen",
    ) -> None:
        self.forward, self.tokenizer = forward, tokenizer
        first = [rows[i] for i in range(min(MATCH_PROMPTS, len(rows)))]
        rows = [r for r in first if r.get("desirable", True)]  # KTO: the good completions
        self.samples = [self._prompt_and_answer(r, part) for r in rows]

    @staticmethod
    def _prompt_and_answer(row: dict[str, Any], part: str) -> tuple[list[int], list[int]]:
        ids, labels = row[f"{part}_input_ids"], row[f"{part}_labels"]
        first = next(i for i, t in enumerate(labels) if t != IGNORE_INDEX)
        return ids[:first], [t for t in labels[first:] if t != IGNORE_INDEX]

    def __call__(
        self, accelerator: Accelerator, model: torch.nn.Module, loader: DataLoader
    ) -> tuple[dict[str, float], list[Prediction]]:
        parts: dict[str, list[torch.Tensor]] = {}
        model.eval()
        with torch.no_grad():
            for batch in loader:
                stats = self.forward(model, batch).stats
                gathered = accelerator.gather_for_metrics({k: v.detach() for k, v in stats.items()})
                for k, v in gathered.items():
                    parts.setdefault(k, []).append(v.reshape(-1))
            answers = self._generate(model, accelerator.device)
        model.train()
        stats = {k: torch.cat(v).float().cpu() for k, v in parts.items()}
        metrics = {"eval_loss": float(stats["loss_sum"].sum() / stats["count"].sum().clamp(min=1))}
        metrics.update(pl.reduce(stats))
        if answers:
            metrics[MATCH] = sum(matches(p) for p in answers) / len(answers)
        return metrics, answers[:SAMPLES]

    def _generate(self, model: torch.nn.Module, device: torch.device) -> list[Prediction]:
        """The greedy answers to ``self.samples``' prompts, next to their chosen answers."""
        from accelerate.utils import extract_model_from_parallel

        inner = extract_model_from_parallel(model)
        tok, out = self.tokenizer, []
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        for start in range(0, len(self.samples), MATCH_BATCH):
            batch = self.samples[start : start + MATCH_BATCH]
            width = max(len(p) for p, _ in batch)
            ids = torch.tensor([[pad] * (width - len(p)) + p for p, _ in batch], device=device)
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p, _ in batch], device=device)
            longest = max(len(a) for _, a in batch) + 1
            generated = inner.generate(
                input_ids=ids, attention_mask=mask, max_new_tokens=max(NEW_TOKENS, longest),
                do_sample=False, pad_token_id=pad, eos_token_id=tok.eos_token_id,
            )  # fmt: skip
            for row, (_, answer) in zip(generated[:, width:].tolist(), batch, strict=True):
                said = tok.decode(row, skip_special_tokens=True)
                out.append(Prediction(tok.decode(answer, skip_special_tokens=True), said))
        return out


def matches(p: Prediction) -> bool:
    """The greedy answer is the chosen one (texts compared with their end spaces stripped)."""
    return p.prediction.strip() == p.reference.strip()
