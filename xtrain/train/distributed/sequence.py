"""Sequence parallelism in a training process (``parallel.sequence``, planned in
xtrain/planning/sequence.py): its group, the model's attention switched to the sequence-parallel
function around the one it loaded with, and this process's shard of every training batch.

``attach`` runs in the recipe's setup after the workload is built and before accelerate's
``prepare``: every rank creates every group (torch.distributed's rule), keeps its own, checks the
model (its family calls transformers' attention registry; its heads decide the mode), registers and
switches the attention (xtrain/model/sequence_parallel.py) and says which shard it holds. The
training loader's collator is then the task's, cut (``collator``), unless the task's step makes its
sequences (GRPO's and distillation's completions: ``Workload.cuts_sequences``) and cuts them
itself; evaluation batches stay whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from xtrain.data.entry_shards import EntryShardCollator
from xtrain.data.sequence_shards import ShardCollator
from xtrain.errors import XtrainError
from xtrain.model import neftune
from xtrain.model import sequence_parallel as sp
from xtrain.model.shard_exchange import Exchange, activate
from xtrain.planning.sequence import SequencePlan, check_entry, check_family, choose_mode, summary

if TYPE_CHECKING:
    from collections.abc import Callable

    import torch

    from xtrain.config.schema import TrainConfig


@dataclass(frozen=True)
class SequenceRun:
    """What this process runs: the plan, the mode and why, the attention it wraps, its shard."""

    plan: SequencePlan
    mode: str
    why: str
    inner: str
    shard: int
    staged: bool
    entry: bool = False  # cut at the text decoder's entry (Task.sequence_entry), not before the model

    @property
    def line(self) -> str:
        staged = "; exchanged through host memory (gloo with CUDA tensors)" if self.staged else ""
        return summary(self.plan.size, self.plan.world, self.mode, self.why) + staged

    def record(self) -> dict[str, Any]:
        """For ``train_result.json``'s ``run_info`` (the report's mode)."""
        return {
            "sequence_parallel": self.plan.size,
            "sequence_mode": self.mode,
            "sequence_attention": self.inner,
        }


def inner_attention(model: torch.nn.Module) -> str:
    """The attention implementation the model loaded with (its text model's)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = base.config
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    return str(text._attn_implementation)


def attach(
    model: torch.nn.Module, cfg: TrainConfig, plan: SequencePlan, rank: int, backend: str | None,
    device: torch.device, distributed_type: str = "",
) -> SequenceRun | None:  # fmt: skip
    """Set this process up for ``plan`` (None when it is off); see the module docstring.
    ``distributed_type``: accelerate's (FSDP and DeepSpeed shard the weights: refused)."""
    if not plan.on:
        activate(None)  # (a run before this one in the process may have had a group)
        return None
    import torch.distributed as dist

    kind = str(distributed_type).upper()
    if "FSDP" in kind or "DEEPSPEED" in kind:
        raise XtrainError(
            "parallel.sequence runs with every process holding the whole model (DDP), not under FSDP or "
            "DeepSpeed sharding",
            "launch without --fsdp/--deepspeed (LoRA's weights are small), or set parallel.sequence=1",
        )

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    facts = sp.model_facts(type(base), base.config)
    inner = inner_attention(model)
    check_family(facts.name, facts.registry, inner)
    mode, why = choose_mode(cfg.parallel.sequence_mode, plan.size, facts.heads, facts.kv_heads)
    mine = None
    for ranks in plan.groups():  # every rank creates every group, in the same order
        group = dist.new_group(ranks)
        if rank in ranks:
            mine = group
    staged = backend == "gloo" and device.type == "cuda"
    activate(Exchange(mine, plan.size, plan.shard(rank), staged, mode))
    sp.use(model, inner, sp.register(inner))
    entry = _entry_cut(model, base, cfg)
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    for hook in getattr(embeddings, "_forward_hooks", {}).values():
        if isinstance(hook, neftune.NEFTuneHook) and not entry:  # its noise scale: the whole sequence's
            hook.shards = plan.size
    return SequenceRun(plan, mode, why, inner, plan.shard(rank), staged, entry)


def _entry_cut(model: torch.nn.Module, base: torch.nn.Module, cfg: TrainConfig) -> bool:
    """A task whose rows the model sees whole first (``Task.sequence_entry``: vision-language):
    its family checked, the cut hooked in at its text decoder's entry; False for text rows."""
    from xtrain import tasks
    from xtrain.model.sequence_entry import EntryCut

    entry = tasks.get(cfg.model.task).sequence_entry
    if entry is None:
        return False
    check_entry(getattr(base.config, "model_type", None), entry.families, cfg.model.task)
    EntryCut(model, base.get_submodule(entry.decoder(base))).attach()
    return True


def collator(collate: Callable[..., Any], run: SequenceRun | None, whole: bool = False) -> Callable[..., Any]:
    """The training loader's collator: the task's, and this process's shard of what it makes;
    ``whole``: the task's own (``Workload.cuts_sequences``: its step completes the rows, GRPO's
    rollout, and cuts them)."""
    if run is None or whole:
        return collate
    return (EntryShardCollator if run.entry else ShardCollator)(collate, run.plan.size, run.shard)
