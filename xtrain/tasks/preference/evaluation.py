"""The preference task's evaluation (``Workload.evaluate``): the reward metrics over the whole eval
set, gathered from every rank in data order (as the loop's forward-only evaluation gathers them),
and the policy's greedy answers to the first few eval prompts next to their chosen answers, so a
run shows its generations change from one evaluation to the next (the quickstart's closing table
prints the last ones)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from xtrain.data.collate import IGNORE_INDEX
from xtrain.tasks.contract import Prediction
from xtrain.tasks.preference import losses as pl

if TYPE_CHECKING:
    from accelerate import Accelerator
    from torch.utils.data import DataLoader
    from transformers import PreTrainedTokenizerBase

    from xtrain.tasks.preference.reference import PreferenceForward

SAMPLES = 3  # eval prompts answered at each evaluation
NEW_TOKENS = 24  # longest generated answer (tokens)


class PreferenceEval:
    """``evaluate(accelerator, model, eval_loader) -> (metrics with eval_loss, predictions)``."""

    def __init__(
        self,
        forward: PreferenceForward,
        rows: list[dict[str, Any]],
        tokenizer: PreTrainedTokenizerBase,
        part: str = "chosen",
    ) -> None:
        self.forward, self.tokenizer = forward, tokenizer
        self.samples = [self._prompt_and_answer(r, part) for r in rows[:SAMPLES]]

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
            predictions = self._generate(model, accelerator.device)
        model.train()
        stats = {k: torch.cat(v).float().cpu() for k, v in parts.items()}
        metrics = {"eval_loss": float(stats["loss_sum"].sum() / stats["count"].sum().clamp(min=1))}
        return {**metrics, **pl.reduce(stats)}, predictions

    def _generate(self, model: torch.nn.Module, device: torch.device) -> list[Prediction]:
        from accelerate.utils import extract_model_from_parallel

        inner = extract_model_from_parallel(model)
        tok, out = self.tokenizer, []
        for prompt, answer in self.samples:
            ids = torch.tensor([prompt], device=device)
            generated = inner.generate(
                input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
                do_sample=False, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
            )  # fmt: skip
            text = tok.decode(generated[0, len(prompt) :], skip_special_tokens=True)
            out.append(Prediction(tok.decode(answer, skip_special_tokens=True), text))
        return out
