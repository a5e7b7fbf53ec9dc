"""The memory levers a run's settings chose, put into the model's training forward: the chunked
loss (``model.chunked_loss``, xtrain/model/chunked_loss.py) and activation offloading
(``model.activation_offload``, xtrain/model/offload.py). Both are module hooks on the model the
task built, before accelerate wraps it: the loop's ``model(**batch).loss`` is the same call."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from xtrain.config.schema import TrainConfig
from xtrain.errors import XtrainError
from xtrain.planning.resolve import RunSettings

if TYPE_CHECKING:
    from torch.nn import Module

    from xtrain.model.chunked_loss import LogitMap


@dataclass(frozen=True)
class Levers:
    """What runs: the chunked loss, activation offloading; the banner's lines, one a lever."""

    chunked_loss: bool = False
    activation_offload: bool = False
    lines: tuple[str, ...] = field(default=(), compare=False)

    def record(self) -> dict[str, bool]:
        """For ``train_result.json``'s ``run_info``."""
        return {"chunked_loss": self.chunked_loss, "activation_offload": self.activation_offload}


# token losses whose task reads log-probs off the head itself and chunks them when told
OWN_CHUNKS = ("sequence", "logps", "divergence")


def loss_words(token_loss: str | None, chunked: bool) -> str:
    """What loss a run of a task with ``token_loss`` trains with (the plan's ``Loss:`` line)."""
    if token_loss == "sequence":  # preference: log-probs of two answers, not the model's own loss
        return "per-sequence log-probs of the trained tokens, " + ("chunked" if chunked else "all logits")
    if token_loss == "logps":  # GRPO: each completion token's log-prob
        return "per-token log-probs of the completions, " + ("chunked" if chunked else "all logits")
    if token_loss == "divergence":  # distillation: each token's distribution against the teacher's
        return "per-token divergence from the teacher over the vocabulary, " + (
            "chunked" if chunked else "all logits"
        )
    return "chunked cross-entropy over the trained tokens" if chunked else "the model's own, every position"


def attach(
    model: Module,
    cfg: TrainConfig,
    settings: RunSettings,
    distributed_type: str,
    own_chunks: Callable[[LogitMap, int], None] | None = None,
) -> Levers:
    """Attach what ``settings`` chose to ``model`` (the task's, not yet prepared).
    ``distributed_type``: accelerate's (DeepSpeed partitions the head's weights in its own hooks:
    neither lever runs under it). ``own_chunks``: the workload's ``use_chunked_loss`` (a task
    whose forward reads log-probs off the head: told to chunk them instead of a hook)."""
    from xtrain import tasks
    from xtrain.model import chunked_loss, offload

    deepspeed = "DEEPSPEED" in str(distributed_type).upper()
    task = tasks.get(cfg.model.task)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    mapping = chunked_loss.logit_map(getattr(model, "config", None)) if head is not None else None
    refusal = None
    if head is None:
        refusal = "the model has no output head transformers knows (get_output_embeddings)"
    elif isinstance(mapping, str):
        refusal = f"{type(model).__name__}: {mapping}"
    elif deepspeed:
        refusal = "DeepSpeed gathers the head's weights in hooks of its own"
    chunked, why = settings.loss_for(task.token_loss, refusal)
    if chunked:
        assert isinstance(mapping, chunked_loss.LogitMap) and task.token_loss is not None
        vocab = int(getattr(head, "out_features", 0) or head.weight.shape[0])
        rows = chunked_loss.chunk_rows(vocab)
        if task.token_loss in OWN_CHUNKS:
            assert own_chunks is not None, f"token_loss {task.token_loss} needs Workload.use_chunked_loss"
            own_chunks(mapping, rows)
        else:
            chunked_loss.ChunkedLoss(model, task.token_loss, mapping, rows).attach()
        what = loss_words(task.token_loss, True)
        lines = [f"loss: {what}, {rows} positions of {vocab:,} logits a chunk ({why})"]
    elif task.token_loss in OWN_CHUNKS:
        lines = [f"loss: {loss_words(task.token_loss, False)} ({why})"]
    else:
        lines = [f"loss: the model's own, logits at every position ({why})"]
    if settings.activation_offload:
        if deepspeed:
            raise XtrainError(
                "model.activation_offload does not run under DeepSpeed (it offloads in its own way)",
                "set model.activation_offload=false, or use DeepSpeed's offload settings",
            )
        offload.ActivationOffload(model, pin=settings.pin_memory).attach()
        lines.append("activations: saved for the backward pass in host memory (model.activation_offload)")
    return Levers(chunked, settings.activation_offload, tuple(lines))
