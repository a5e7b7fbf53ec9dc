"""One GRPO step on the loop's hooks: ``at_step`` (the step's number: the sampling seeds),
``step_start`` (the rollout: every micro-batch of this process generated, scored, its advantages
taken over the step's global batch) and the forward (the clipped surrogate's loss of a
micro-batch), with the metrics a user watches and the warnings of a broken run.

``step_start`` replaces each micro-batch's prompts by prompt + completion sequences and adds
what the loss reads: ``completion_mask``, ``loss_mask`` (truncated completions out when
``grpo.mask_truncated_completions``), ``advantages``, ``old_logps`` (``num_iterations`` > 1),
``ref_logps`` (``beta`` > 0) and the step's statistics (``stat/...``, the same on every process).
One gather a step brings every process's rewards and token counts together, ordered by the
global micro-batch number, so the advantages (``scale_rewards: batch``), dapo's normaliser and the
metrics are the same numbers at any process count.

``num_iterations`` > 1 reuses the generation of the cycle's first step for the next
``num_iterations - 1`` steps (their prompts from the loader are not used), with the old policy's
log-probabilities from that first step. A run resumed inside a cycle generates again at its first
step (docs/grpo.md: resume is exact at cycle boundaries: ``run.save_every`` a multiple).
``parallel.sequence``: generated whole, the same in a group, trained on shards (sharded.py).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from xtrain.data.sampler import mix_seed
from xtrain.data.sequence_shards import KEY
from xtrain.model import chain
from xtrain.model import sequence_parallel as sp
from xtrain.model.decoding import Decoder, DecodeSettings, Sampling, generate
from xtrain.model.shard_exchange import active
from xtrain.tasks.grpo import loss as gl
from xtrain.tasks.grpo import rewards as rw
from xtrain.tasks.grpo import sharded
from xtrain.tasks.grpo.episodes import episode_stats
from xtrain.tasks.grpo.rollout import token_logps

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from xtrain.config.schema import GrpoConfig
    from xtrain.model.chunked_loss import LogitMap
    from xtrain.tasks.grpo.episodes import Agent
    from xtrain.tasks.grpo.rows import PromptEncoder, PromptRow

Batch = dict[str, Any]
Gather = "Callable[[torch.Tensor], torch.Tensor]"
ZERO_SPREAD = 1e-6  # a group's reward std below this gives no signal


@dataclass
class StepOutput:
    loss: torch.Tensor
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)


def _unwrapped(model: torch.nn.Module) -> torch.nn.Module:
    from xtrain.tasks.grpo.rollout import unwrapped

    return unwrapped(model)


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def eos_ids(tokenizer: PreTrainedTokenizerBase, model: torch.nn.Module) -> list[int]:
    """The end tokens a completion stops at: the tokenizer's and the model's generation config's."""
    found = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    found = found if isinstance(found, list) else [found]
    ids = [tokenizer.eos_token_id, *found]
    return list(dict.fromkeys(i for i in ids if i is not None))


class GrpoStep:
    """``Workload.at_step``, ``step_start`` and ``forward`` of the grpo task."""

    def __init__(
        self,
        g: GrpoConfig,
        rewards: list[rw.Reward],
        rows: list[PromptRow],
        encoder: PromptEncoder,
        seed: int,
        decode: DecodeSettings | None = None,
        agent: Agent | None = None,
    ) -> None:
        self.g, self.rewards, self.rows, self.encoder, self.seed = g, rewards, rows, encoder, seed
        self.decode = decode or DecodeSettings()  # how the decode steps run (decoding.decode_settings)
        self.chunks: tuple[LogitMap, int] | None = None  # the chunked log-probs (use_chunked_loss)
        self.agent = agent  # grpo.tools: each completion is an episode (episodes.py)
        self.settings = gl.LossSettings(
            g.loss, g.epsilon, g.epsilon_high if g.epsilon_high is not None else g.epsilon, g.beta,
            g.max_episode_length if agent is not None else g.max_completion_length,
        )  # fmt: skip
        tok = encoder.tokenizer
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        self.step = 0
        self.cycle: tuple[int, list[Batch]] | None = None  # num_iterations > 1: (first step, batches)
        # the warnings' evidence since the last evaluation (``notes``)
        self.steps_seen = 0
        self.all_zero_steps = 0
        self.truncated_sum = 0.0
        self.completions: list[
            tuple[int, str, str, float]
        ] = []  # the last step's (row, prompt, text, reward)

    # -- hooks ----------------------------------------------------------------------------------
    def use_chunked_loss(self, mapping: LogitMap, rows: int) -> None:
        """``Workload.use_chunked_loss``: log-probs from the head on the completions' tokens only,
        ``rows`` at a time (``model.chunked_loss``)."""
        self.chunks = (mapping, rows)

    def at_step(self, step: int) -> None:
        """``Workload.at_step``: the optimizer step about to run (seeds the sampling)."""
        self.step = step

    def step_start(self, model: torch.nn.Module, micro_batches: list[Batch], gather: Any) -> None:
        """``Workload.step_start``: the rollout of this process's micro-batches (module docstring)."""
        mu, step = self.g.num_iterations, self.step
        first = step - step % mu
        if mu > 1 and self.cycle is not None and self.cycle[0] == first:
            for batch, kept in zip(micro_batches, self.cycle[1], strict=True):
                batch.clear()
                batch.update(kept)
            return
        ex = active()
        scored: list[torch.Tensor | None] = [None] * len(micro_batches)
        if sharded.generates(ex):  # (sharded.py: one set of episodes a group, made by its first rank)
            with contextlib.nullcontext() if ex is None else sp.whole_attention(_unwrapped(model)):
                scored = [self._rollout(model, b, first) for b in micro_batches]
        if ex is not None:  # ... handed to the group, each process's shard of it
            for a, b in enumerate(micro_batches):
                scored[a] = sharded.same_in_group(ex, b, sharded.ROLLED, scored[a])
                sharded.keep(b, sharded.cut(ex, b["input_ids"], b["attention_mask"], b["loss_mask"]))
        self._advantages(micro_batches, scored, gather)
        if mu > 1 or self.g.beta:
            for batch in micro_batches:
                self._side_logps(model, batch)
        if mu > 1:
            self.cycle = (first, [dict(b) for b in micro_batches])

    def __call__(self, model: torch.nn.Module, batch: Batch) -> StepOutput:
        """``Workload.forward``: the micro-batch's loss (``loss.micro_batch_loss``) and metrics."""
        s, shard = self.settings, batch.get(sharded.CUT)
        logps = self._logps(model, batch)
        per_token, clipped, kl = gl.per_token_loss(
            s, logps, batch.get("old_logps"), batch.get("ref_logps"), batch["advantages"]
        )
        total, micro = float(batch["stat/total_tokens"]), int(batch["stat/micro_batches"])
        mask = (batch["loss_mask"] if shard is None else sharded.trained_mask(shard)).to(per_token)
        if shard is None:
            loss = gl.micro_batch_loss(s, per_token, mask, total, micro)
        else:  # this shard's part of the group's loss (sharded.py: times N); grpo: each row's tokens
            rows = batch["loss_mask"].sum(-1)
            loss = gl.micro_batch_loss(s, per_token, mask, total, micro, rows) * shard[KEY].size
        sums = [
            mask.sum(),
            (clipped.to(mask) * mask).sum(),
            (kl.detach() * mask).sum() if kl is not None else mask[:0].sum(),
        ]
        if shard is not None:  # the metrics over the group's shards
            sums = sharded.group_sums(shard, *sums)
        tokens = sums[0].clamp(min=1.0)
        metrics = {k[5:]: v for k, v in batch.items() if k.startswith("stat/") and k not in _NOT_SHOWN}
        metrics["clip_ratio"] = sums[1].detach() / tokens
        if kl is not None:
            metrics["kl"] = sums[2] / tokens
        return StepOutput(loss, metrics)

    def _logps(self, model: torch.nn.Module, batch: Batch) -> torch.Tensor:
        """The completions' token log-probs under ``model``: [N, completion width], or on a
        sequence shard (``sharded.CUT``) [N, the shard's positions]."""
        shard = batch.get(sharded.CUT)
        if shard is not None:
            return sharded.token_logps(model, shard, self.g.temperature, self.chunks)
        width = batch["completion_mask"].size(1)
        return token_logps(
            model, batch["input_ids"], batch["attention_mask"], width, self.g.temperature, self.chunks,
            self.g.num_generations,
        )  # fmt: skip

    # -- the rollout --------------------------------------------------------------------------------
    def _rollout(self, model: torch.nn.Module, batch: Batch, step: int) -> torch.Tensor:
        """One micro-batch generated and scored in place; returns its [N, F] rewards (NaN: None)."""
        if self.agent is not None:
            return self._episodes(model, batch, step)
        G, rows = self.g.num_generations, batch["row"].tolist()
        seeds = [mix_seed(self.seed, step, r, k) for r in rows for k in range(G)]
        inner = _unwrapped(model)
        done = generate(
            inner, batch["input_ids"], batch["attention_mask"], max_new_tokens=self.g.max_completion_length,
            pad_id=self.pad_id, stop=eos_ids(self.encoder.tokenizer, inner), group=G,
            sampling=Sampling(self.g.temperature, self.g.top_p), seeds=seeds, synced=synced(model),
            settings=self.decode,
        )  # fmt: skip
        prompt_ids = batch["input_ids"].repeat_interleave(G, dim=0)
        prompt_mask = batch["attention_mask"].repeat_interleave(G, dim=0)
        each = [r for r in rows for _ in range(G)]
        texts = self.encoder.tokenizer.batch_decode(done.ids, skip_special_tokens=True)
        values = self.score(each, texts, step)
        prompts = {r: self._prompt_text(r) for r in rows}  # rendered once a prompt, not a completion
        totals = values.nansum(1).tolist()
        self.completions = [(each[i], prompts[each[i]], texts[i], totals[i]) for i in range(len(texts))]
        loss_mask = (
            done.mask * (~done.truncated).long().unsqueeze(1)
            if self.g.mask_truncated_completions
            else done.mask
        )
        batch.update(
            input_ids=torch.cat([prompt_ids, done.ids], dim=1),
            attention_mask=torch.cat([prompt_mask, done.mask], dim=1),
            completion_mask=done.mask,
            loss_mask=loss_mask,
            truncated=done.truncated,
        )
        return values.to(prompt_ids.device)

    def _episodes(self, model: torch.nn.Module, batch: Batch, step: int) -> torch.Tensor:
        """``_rollout`` with tools: each completion an episode of turns (``episodes.Agent``), the
        model's own tokens trained, the tool turns context only."""
        from xtrain.tasks.grpo import episodes as ep

        assert self.agent is not None
        G, rows = self.g.num_generations, batch["row"].tolist()
        seeds = [mix_seed(self.seed, step, r, k) for r in rows for k in range(G)]
        self.agent.runner.where = f" (step {step}, rows {sorted(set(rows))})"
        sampling = Sampling(self.g.temperature, self.g.top_p)
        decoder = self.decoder(model, synced(model))
        done = self.agent.run(decoder, batch["input_ids"], batch["attention_mask"], G, sampling, seeds)
        prompt_ids = batch["input_ids"].repeat_interleave(G, dim=0)
        prompt_mask = batch["attention_mask"].repeat_interleave(G, dim=0)
        each = [r for r in rows for _ in range(G)]
        values = self.score_episodes(each, done, step)
        prompts = {r: self._prompt_text(r) for r in rows}  # rendered once a prompt
        totals = values.nansum(1).tolist()
        self.completions = [(each[i], prompts[each[i]], ep.shown(e), totals[i]) for i, e in enumerate(done)]
        t = ep.as_batch(done, self.pad_id, prompt_ids.device)
        keep = (~t["truncated"]).long().unsqueeze(1) if self.g.mask_truncated_completions else 1
        stats = [[e.turns, len(e.calls), e.failures] for e in done]
        batch.update(
            input_ids=torch.cat([prompt_ids, t["ids"]], dim=1),
            attention_mask=torch.cat([prompt_mask, t["mask"]], dim=1),
            completion_mask=t["trained"],
            loss_mask=t["trained"] * keep,
            truncated=t["truncated"],
            episode_stats=torch.tensor(stats, dtype=torch.float32, device=prompt_ids.device),
        )
        return values.to(prompt_ids.device)

    def decoder(self, model: torch.nn.Module, sharded: bool, trained: bool = True) -> Decoder:
        """A decode loop over the unwrapped ``model`` for episodes, in training (``trained``: the
        run's decode settings) or evaluation (the model's own cache: a compiled step would compile
        again for each eval batch size); ``sharded`` weights are refused (each process's episodes
        take their own turns, where every forward of sharded weights is a collective)."""
        if sharded:
            from xtrain.errors import XtrainError

            raise XtrainError(
                "grpo.tools with sharded weights (--fsdp, DeepSpeed ZeRO-3) is not supported: each "
                "process's episodes take their own number of turns",
                "train without sharding: LoRA's model is whole on each process",
            )
        inner = _unwrapped(model)
        settings = self.decode if trained else None
        return Decoder(inner, self.pad_id, eos_ids(self.encoder.tokenizer, inner), settings=settings)

    def score_episodes(
        self, each: list[int], done: list[Any], step: int, rows: list[PromptRow] | None = None
    ) -> torch.Tensor:
        """[N, F] rewards of episodes ``done`` of data rows ``each``: ``completions`` their turns
        (OpenAI messages), ``tool_calls`` the calls each made ({name, arguments, result})."""
        texts = [e.answer for e in done]
        turns = [e.messages for e in done]
        return self.score(each, texts, step, rows, turns, {"tool_calls": [e.calls for e in done]})

    def _prompt_text(self, row: int) -> str:
        return self.encoder.text(self.rows[row])

    def score(
        self,
        each: list[int],
        texts: list[str],
        step: int,
        rows: list[PromptRow] | None = None,
        turns: list[Any] | None = None,
        more: dict[str, list[Any]] | None = None,
    ) -> torch.Tensor:
        """[N, F] rewards of completions ``texts`` of data rows ``each`` (NaN: no reward);
        ``turns``: each completion as its turns (episodes), ``more``: columns beside the rows'."""
        source = rows if rows is not None else self.rows
        picked = [source[r] for r in each]
        prompts = [p.prompt for p in picked]
        completions: list[Any] = (
            turns
            if turns is not None
            else [[{"role": "assistant", "content": t}] for t in texts]
            if picked and picked[0].conversational
            else texts
        )
        names = sorted({k for p in picked for k in p.columns})
        columns = {**{k: [p.columns.get(k) for p in picked] for k in names}, **(more or {})}
        out = [rw.call(r, prompts, completions, columns, step, each) for r in self.rewards]
        return torch.tensor(out, dtype=torch.float32).T.reshape(len(texts), len(self.rewards))

    def _advantages(self, batches: list[Batch], scored: list[torch.Tensor], gather: Any) -> None:
        """Every process's rewards and token counts (one gather), in global micro-batch order: the
        advantages of this process's completions and the step's statistics."""
        G, A, rank, ex = self.g.num_generations, len(batches), _rank(), active()
        n, F = scored[0].shape
        device = scored[0].device
        local = []
        for a, (batch, values) in enumerate(zip(batches, scored, strict=True)):
            lengths = batch["completion_mask"].sum(1).float()
            parts = [
                values.reshape(-1),
                lengths,
                batch["truncated"].float(),
                *([batch["episode_stats"].T.reshape(-1)] if "episode_stats" in batch else []),
                batch["loss_mask"].sum().float().reshape(1),
            ]
            local.append(torch.cat([torch.tensor([float(a), float(rank)], device=device), *parts]))
        everything = gather(torch.stack(local))  # [world x A, 2 + N F + 2 N + 1]
        if ex is not None:  # a sequence-parallel group's rows once, by data-parallel rank
            everything, rank = sharded.distinct(everything, ex.size), rank // ex.size
        world = everything.size(0) // A
        key = everything[:, 0] * world + everything[:, 1]  # the global micro-batch number
        everything = everything[key.argsort()]
        per_fn = everything[:, 2 : 2 + n * F].reshape(-1, F)  # [M N, F]
        lengths = everything[:, 2 + n * F : 2 + n * F + n].reshape(-1)
        truncated = everything[:, 2 + n * F + n : 2 + n * F + 2 * n].reshape(-1)
        total_tokens = float(everything[:, -1].sum())
        weights = torch.tensor([r.weight for r in self.rewards], device=device)
        rewards = gl.total_rewards(per_fn, weights)
        adv = gl.advantages(rewards, G, self.g.scale_rewards)
        stats = self._stats(per_fn, rewards, lengths, truncated)
        if "episode_stats" in batches[0]:  # [turns, calls, failures] x n per micro-batch
            turns, calls, failed = everything[:, 2 + n * F + 2 * n : -1].reshape(-1, 3, n).sum(0)
            stats.update(episode_stats(turns, calls, failed, everything.size(0)))
        stats.update(
            total_tokens=torch.tensor(total_tokens), micro_batches=torch.tensor(float(everything.size(0)))
        )
        for a, batch in enumerate(batches):
            m = a * world + rank
            batch["advantages"] = adv[m * n : (m + 1) * n].to(device)
            batch.update({f"stat/{k}": v.to(device) for k, v in stats.items()})

    def _stats(
        self, per_fn: torch.Tensor, rewards: torch.Tensor, lengths: torch.Tensor, truncated: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        spread = gl.group_std(rewards, self.g.num_generations)
        zero = (spread < ZERO_SPREAD).float().mean()
        out = {"reward": rewards.mean(), "reward_std": rewards.std(), "frac_reward_zero_std": zero}
        for r, column in zip(self.rewards, per_fn.T, strict=True):
            given = column[~column.isnan()]
            out[f"rewards/{r.metric}/mean"] = given.mean() if len(given) else torch.tensor(0.0)
            out[f"rewards/{r.metric}/std"] = given.std() if len(given) > 1 else torch.tensor(0.0)
        out["completions/mean_length"] = lengths.mean()
        out["completions/max_length"] = lengths.max()
        out["completions/clipped_ratio"] = truncated.mean()
        self.steps_seen += 1
        self.all_zero_steps += int(float(zero) == 1.0)
        self.truncated_sum += float(truncated.mean())
        return {k: v.detach().float().cpu() for k, v in out.items()}

    def _side_logps(self, model: torch.nn.Module, batch: Batch) -> None:
        """The old policy's (``num_iterations`` > 1) and the reference's (``beta`` > 0) log-probs
        (on a sequence shard: its positions, as the forward's)."""
        with torch.no_grad():
            if self.g.num_iterations > 1:
                batch["old_logps"] = self._logps(model, batch)
            if self.g.beta:
                inner = _unwrapped(model)
                with chain.reference(inner):  # the stage's start: the base, or its earlier adapters
                    batch["ref_logps"] = self._logps(inner, batch)

    # -- warnings -------------------------------------------------------------------------------------
    def notes(self, history: list[dict[str, float]]) -> list[str]:
        """``Workload.notes``: every group without reward spread through the steps since the last
        evaluation (no signal: the task is too hard or too easy), or completions at the length limit."""
        out = self.agent.runner.notes() if self.agent is not None else []
        seen, zero, cut = self.steps_seen, self.all_zero_steps, self.truncated_sum
        self.steps_seen, self.all_zero_steps, self.truncated_sum = 0, 0, 0.0
        if seen and zero == seen:
            out.append(
                f"grpo: every group's completions got the same reward in the last {seen} "
                f"step{'s' * (seen > 1)}: no learning signal (the task is too hard or too easy for the "
                "model; check the reward functions on a few completions, raise grpo.temperature or "
                "grpo.num_generations; docs/grpo.md#a-broken-run)"
            )
        if seen and cut / seen > 0.5:
            limit = f"grpo.max_completion_length={self.g.max_completion_length}"
            if self.agent is not None:
                limit = f"a turn's {limit} or grpo.max_episode_length={self.g.max_episode_length}"
            out.append(
                f"grpo: {cut / seen:.0%} of completions ran to {limit} without ending (raise it, or "
                "reward shorter answers)"
            )
        return out


_NOT_SHOWN = ("stat/total_tokens", "stat/micro_batches")


def synced(model: torch.nn.Module) -> bool:
    """Weights sharded over several processes (FSDP2, DeepSpeed ZeRO-3): every forward is a
    collective, so every rank steps the decode loop until all are done."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return False
    from torch.distributed.fsdp import FSDPModule

    fsdp = any(isinstance(m, FSDPModule) for m in model.modules())
    return fsdp or any(hasattr(p, "ds_id") for p in model.parameters())  # ZeRO-3's partitioned params
