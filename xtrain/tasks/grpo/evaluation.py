"""GRPO's evaluation (``Workload.evaluate``): every eval prompt answered greedily (each process its
share of the eval loader), scored by the run's reward functions, gathered in data order: the mean
reward (``reward``, the weighted sum), each function's mean (``rewards/NAME``, NAME the function's
name), the completions' mean length; and the first few prompts with their completion and reward.
No ``eval_loss``: GRPO's loss has no meaning on prompts alone; ``reward`` is its metric."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

from xtrain.model.decoding import generate
from xtrain.tasks.contract import Prediction
from xtrain.tasks.grpo import loss as gl

if TYPE_CHECKING:
    from accelerate import Accelerator
    from torch.utils.data import DataLoader

    from xtrain.tasks.grpo.episodes import Episode
    from xtrain.tasks.grpo.rows import PromptRow
    from xtrain.tasks.grpo.step import GrpoStep

SAMPLES = 4  # eval completions shown at each evaluation
Shown = tuple[int, str, float, dict[str, Any]]  # (row, completion, reward, Prediction.details)


class GrpoEval:
    """``evaluate(accelerator, model, eval_loader) -> (metrics, predictions)``."""

    def __init__(self, step: GrpoStep, rows: list[PromptRow]) -> None:
        self.step, self.rows = step, rows

    def __call__(
        self, accelerator: Accelerator, model: torch.nn.Module, loader: DataLoader
    ) -> tuple[dict[str, float], list[Prediction]]:
        from xtrain.model.sharding import generate_kwargs
        from xtrain.tasks.grpo.step import _unwrapped, eos_ids

        s = self.step
        inner = _unwrapped(model)
        eos = eos_ids(s.encoder.tokenizer, inner)
        was_training = model.training
        model.eval()
        gathered: list[torch.Tensor] = []
        shown: list[Shown] = []  # this process's first completions (the main's: the first rows)
        with torch.no_grad():
            for batch in loader:
                rows = batch["row"].tolist()
                if s.agent is not None:  # episodes: greedy turns with the tools
                    texts, values, lengths, done = self._episodes(accelerator, model, batch, rows)
                    gathered.append(self._gathered(accelerator, rows, values, lengths))
                    shown += self._shown(rows, texts, values, SAMPLES - len(shown), done)
                    continue
                # the model's own cache: a compiled step would compile again for each eval batch size
                with accelerator.autocast():
                    done = generate(
                        inner, batch["input_ids"].to(accelerator.device),
                        batch["attention_mask"].to(accelerator.device),
                        max_new_tokens=s.g.max_completion_length, pad_id=s.pad_id, stop=eos,
                        synced=bool(generate_kwargs(accelerator)),
                    )  # fmt: skip
                texts = s.encoder.tokenizer.batch_decode(done.ids, skip_special_tokens=True)
                values = s.score(rows, texts, s.step, self.rows)
                shown += self._shown(rows, texts, values, SAMPLES - len(shown))
                lengths = done.mask.sum(1).float().cpu().unsqueeze(1)
                gathered.append(self._gathered(accelerator, rows, values, lengths))
        if was_training:
            model.train()
        if not gathered:
            return {}, []
        table = torch.cat(gathered)
        per_fn = table[:, 1 : 1 + len(s.rewards)]
        weights = torch.tensor([r.weight for r in s.rewards])
        rewards = gl.total_rewards(per_fn, weights)
        metrics = {"reward": float(rewards.mean())}
        for r, column in zip(s.rewards, per_fn.T, strict=True):
            given = column[~column.isnan()]
            metrics[f"rewards/{r.metric}"] = float(given.mean()) if len(given) else 0.0
        metrics["completion_length"] = float(table[:, -1].mean())
        samples = [
            Prediction(
                reference=self.rows[row].shown,
                prediction=f"{text.strip()}  [reward {r:.2f}]",
                labels=("prompt", "completion"),
                details=details,
            )
            for row, text, r, details in shown
        ]
        return metrics, samples

    def _episodes(
        self, accelerator: Accelerator, model: torch.nn.Module, batch: dict, rows: list[int]
    ) -> tuple[list[str], torch.Tensor, torch.Tensor, list[Episode]]:
        """A batch's eval episodes, greedy: (each on one line, [n, F] rewards, [n, 1] lengths, the
        episodes)."""
        from xtrain.model.sharding import generate_kwargs
        from xtrain.tasks.grpo import episodes as ep

        s = self.step
        assert s.agent is not None
        decoder = s.decoder(model, bool(generate_kwargs(accelerator)), trained=False)
        ids, mask = batch["input_ids"].to(accelerator.device), batch["attention_mask"].to(accelerator.device)
        with accelerator.autocast():
            done = s.agent.run(decoder, ids, mask, 1, None, None)
        values = s.score_episodes(rows, done, s.step, self.rows)
        lengths = torch.tensor([[float(sum(e.trained))] for e in done])
        return [ep.shown(e) for e in done], values, lengths, done

    @staticmethod
    def _gathered(
        accelerator: Accelerator, rows: list[int], values: torch.Tensor, lengths: torch.Tensor
    ) -> torch.Tensor:
        local = torch.cat([torch.tensor(rows, dtype=torch.float32).unsqueeze(1), values, lengths], 1)
        return accelerator.gather_for_metrics(local.to(accelerator.device)).cpu()

    def _shown(
        self,
        rows: list[int],
        texts: list[str],
        values: torch.Tensor,
        room: int,
        done: list[Episode] | None = None,
    ) -> list[Shown]:
        """The first ``room`` completions: (row, text, reward, details: each function's reward and
        an episode's tool calls with their results and its answer)."""
        rewards = self.step.rewards
        total = gl.total_rewards(values, torch.tensor([r.weight for r in rewards]))
        out = []
        for i, (row, text, r) in enumerate(zip(rows, texts, total.tolist(), strict=True)):
            given = zip(rewards, values[i].tolist(), strict=True)
            per_fn = {f.metric: v for f, v in given if not math.isnan(v)}  # NaN: the function gave None
            details: dict[str, Any] = {"reward": r, "rewards": per_fn}
            if done is not None:
                details |= {"calls": done[i].calls, "answer": done[i].answer}
            out.append((row, text, r, details))
        return out[: max(0, room)]
