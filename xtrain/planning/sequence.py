"""Sequence parallelism planned once (``parallel.sequence``): which processes share a sequence,
which train data-parallel, and how attention crosses the shards. Pure functions (no torch).

``parallel.sequence: N`` splits every sequence of a micro-batch into N consecutive shards, one a
process. The world's W processes form W / N groups of N consecutive ranks (``group_of``): the
ranks of a group read the same rows from the data order and hold one shard each (``shard``); the
groups train data-parallel, so the data order, the accumulation and the global batch are those of
W / N processes (``data_parallel``). A step's loss stays the sum of its token losses over its
trained tokens: each rank counts and sums its own shard's (xtrain/train/step_loss.py), and DDP's
average over all W ranks is then the step's gradient (docs/long-context.md#exact).

Attention (``choose_mode``): Ulysses (DeepSpeed-Ulysses, Jacobs et al. 2023) swaps the sequence
shards for head shards with one all-to-all before attention and back after it, so each rank runs
the model's own attention over the whole sequence for 1/N of the heads: the attention heads and
the key/value heads must divide by N. Ring attention (Liu et al. 2023) keeps the sequence shards
and passes the keys and values around the ring of the group, one block a step, for any head
count. ``auto`` takes Ulysses where the heads divide (one exchange a layer instead of N - 1), else
ring.
"""

from __future__ import annotations

from dataclasses import dataclass

from xtrain.errors import XtrainError

MODES = ("ulysses", "ring")


@dataclass(frozen=True)
class SequencePlan:
    """``parallel.sequence`` for a world of ``world`` processes: ``size`` ranks a sequence."""

    size: int = 1
    world: int = 1

    @property
    def on(self) -> bool:
        return self.size > 1

    @property
    def data_parallel(self) -> int:
        """Groups that train data-parallel: the data order's and the batch arithmetic's processes."""
        return self.world // self.size

    def group_of(self, rank: int) -> int:
        """The data-parallel rank of ``rank``: its group, whose ranks read the same rows."""
        return rank // self.size

    def shard(self, rank: int) -> int:
        """Which of its sequences' ``size`` shards ``rank`` holds (its place in its group)."""
        return rank % self.size

    def groups(self) -> list[list[int]]:
        """Every group's ranks, in order (every rank creates every group, in this order)."""
        return [list(range(g * self.size, (g + 1) * self.size)) for g in range(self.data_parallel)]


ALL = 0  # parallel.sequence: all (config/values.py): every process of the run


def sequence_plan(size: int, world: int) -> SequencePlan:
    """``parallel.sequence: size`` on ``world`` processes (``ALL``: every one of them, off on one);
    one line when it cannot divide them."""
    if size == ALL:
        size = world
    if size <= 1:
        return SequencePlan(1, world)
    if world % size:
        fits = [n for n in range(2, world + 1) if world % n == 0]
        hint = f"use parallel.sequence={' or '.join(map(str, fits))}" if fits else "use parallel.sequence=1"
        raise XtrainError(
            f"parallel.sequence={size} does not divide the {world} process{'es' if world != 1 else ''} "
            "(each sequence is split across that many processes)",
            f"{hint}, or start a multiple of {size} processes (--processes)",
        )
    return SequencePlan(size, world)


def choose_mode(asked: str, size: int, heads: int, kv_heads: int) -> tuple[str, str]:
    """(ulysses | ring, why) for ``parallel.sequence_mode`` ``asked`` (auto | ulysses | ring) on a
    model of ``heads`` attention heads and ``kv_heads`` key/value heads split ``size`` ways.
    Ulysses asked where the heads do not divide: one line that names ring mode."""
    divides = heads % size == 0 and kv_heads % size == 0
    if asked == "ring":
        return "ring", "parallel.sequence_mode=ring"
    if asked == "ulysses":
        if not divides:
            raise XtrainError(
                f"parallel.sequence_mode=ulysses splits the attention heads across the {size} processes of a "
                f"sequence, and this model has {heads} attention heads and {kv_heads} key/value heads "
                f"(both must divide by {size})",
                "set parallel.sequence_mode=ring (keys and values passed around the processes: any head "
                "count), or a parallel.sequence that divides both",
            )
        return "ulysses", "parallel.sequence_mode=ulysses"
    if divides:
        return "ulysses", f"auto: {heads} attention and {kv_heads} key/value heads divide by {size}"
    return "ring", f"auto: {heads} attention / {kv_heads} key/value heads do not divide by {size}"


def check_length(size: int, max_length: int) -> None:
    """A sequence shorter than ``size`` tokens leaves a process nothing to hold: one line."""
    if size > 1 and max_length < size:
        raise XtrainError(
            f"data.max_length={max_length} is shorter than parallel.sequence={size}: each of the {size} "
            "processes of a sequence holds at least one of its tokens",
            f"raise data.max_length (sequence parallelism is for sequences far longer than {size} tokens), "
            "or set parallel.sequence=1",
        )


INNER = ("sdpa", "eager", "flash_attention_2", "flash_attention_3")  # what the modes wrap


def check_family(model: str, registry: bool | None, attention: str | None) -> None:
    """A model whose attention layers do not call transformers' attention-function registry
    (``registry`` False: the class's ``_supports_attention_backend``), or an attention
    implementation the modes do not wrap: one line. None: not known here (checked at load)."""
    if registry is False:
        raise XtrainError(
            f"parallel.sequence: {model} does not pass its attention through transformers' "
            "attention-function registry (AttentionInterface), which sequence parallelism plugs into",
            "set parallel.sequence=1, or use a family that does (Llama, Qwen2/3, Mistral, Gemma, Phi-3, ...)",
        )
    if attention is not None and attention not in INNER:
        raise XtrainError(
            f"parallel.sequence runs sdpa, eager or flash attention, and the model loaded with {attention}",
            "set model.attn_implementation=sdpa (or auto)",
        )


def summary(size: int, world: int, mode: str, why: str) -> str:
    """The plan's and the banner's line for a sequence-parallel run."""
    groups = world // size
    return (
        f"each sequence split across {size} processes ({mode}: {why}); {groups} data-parallel "
        f"group{'s' if groups != 1 else ''}, per-process activations ~1/{size} of a sequence's"
    )


def check_entry(model_type: str | None, families: tuple[str, ...], task: str) -> None:
    """A model whose sequences are cut at its text decoder's entry (a vision-language model:
    ``Task.sequence_entry``) of a family that cut is not known to be exact for: one line."""
    if model_type is not None and model_type not in families:
        raise XtrainError(
            f"parallel.sequence: the {task} task splits the rows of {', '.join(families)} models "
            f"(their text decoder cut after the images are merged), and this model is {model_type}",
            "set parallel.sequence=1, or use one of those families",
        )
