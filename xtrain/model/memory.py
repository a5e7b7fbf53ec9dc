"""The per-GPU memory check: the estimate (xtrain/model/estimate.py, whose docstring says what
each term counts) against the smallest card a run uses, and the one-line warning when it does not
fit, with the changes that make it fit. Pure functions (no torch, no machine). ``xtrain train``
shows it with the plan (sizes from the model's config, ``tasks.sizes.offline_sizes``) and the
training loop checks it again on CUDA with the real counts and the card's memory
(``model_size.live_sizes``).

When a run does not fit, the warning computes the same estimate for what the config does not do
yet and names the smallest sets of those changes that fit, in the order of their cost (``_levers``:
the chunked loss, gradient checkpointing, activation offloading within the machine's RAM, 4-bit
weights, ``batch.per_device=1``): the sets whose costliest change is cheapest first, then fewer
changes before more. Each is a list of ``key=value`` overrides a user can paste after ``xtrain
train CONFIG``.

Above ``TIGHT`` (90 %) of the card the warning says "tight" with the same changes (those that
leave 10 % free), and on Windows that the card driving the display has less free.

It is meant to tell "fits" from "far too big" before a long download, not to the last gigabyte.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import combinations

from xtrain.model.activations import (
    CHUNK_ENTRIES,
    MIN_CHUNK_ROWS,
    OFFLOAD_LAYERS,
    activation_term,
    chunk_rows,
    chunked_logits_bytes,
)
from xtrain.model.estimate import (
    GATED_ACTS,
    GIB,
    HALF,
    KBIT_REST_BYTES,
    MIN_8BIT_SIZE,
    MOMENT_BYTES,
    MOMENT_BYTES_8BIT,
    NF4_BITS,
    TRAINED_BYTES,
    MemoryLevers,
    ModelSizes,
    Shape,
    activation_bytes,
    estimate_gib,
    estimate_run,
    kv_cache_bytes,
    kv_values,
    model_shape,
    quantized_bytes,
    saved_bytes,
    smallest_gpu,
    trained_bytes,
    weight_bytes,
)

# the estimate's terms are read through this module too (callers: ``memory.ModelSizes``, ...)
__all__ = [
    "CHUNK_ENTRIES",
    "GATED_ACTS",
    "GIB",
    "HALF",
    "KBIT_REST_BYTES",
    "MIN_8BIT_SIZE",
    "MIN_CHUNK_ROWS",
    "MOMENT_BYTES",
    "MOMENT_BYTES_8BIT",
    "MemoryCheck",
    "MemoryLevers",
    "ModelSizes",
    "NF4_BITS",
    "OFFLOAD_LAYERS",
    "Shape",
    "TIGHT",
    "TRAINED_BYTES",
    "activation_bytes",
    "activation_term",
    "alternatives",
    "check_memory",
    "chunk_rows",
    "chunked_logits_bytes",
    "estimate_gib",
    "estimate_run",
    "kv_cache_bytes",
    "kv_values",
    "memory_warning",
    "model_shape",
    "quantized_bytes",
    "saved_bytes",
    "size",
    "smallest_gpu",
    "trained_bytes",
    "weight_bytes",
]

# above this share of the card a process is "tight": the allocator's fragmentation, a longer batch
# or another process on the card tips it over
TIGHT = 0.9


def size(gib: float, digits: int) -> str:
    """``24 GiB``, ``17.9 GiB``; below 1 GiB in MiB, below 1 MiB in KiB (tiny models, test cards)."""
    if gib >= 1:
        return f"{gib:.{digits}f} GiB"
    return f"{gib * 1024:.0f} MiB" if gib * 1024 >= 1 else f"{gib * 2**20:.0f} KiB"


def memory_warning(
    estimate: float,
    gpu_gib: float,
    name: str = "the GPU",
    *,
    half_weights: bool = False,
    checkpointing: bool = False,
    per_device: int | None = None,
    images: bool = True,
    fits: Sequence[tuple[str, float]] = (),
    windows: bool = False,
) -> str | None:
    """One line when ``estimate`` is above ``TIGHT`` of ``gpu_gib`` (tight) or above all of it
    (does not fit), naming what lowers it (leaving out what the config already does); else None.
    ``fits``: (overrides, estimate) of the changes that bring it under ``TIGHT`` of the card, best
    first (``alternatives``): named first, as overrides to paste. ``windows``: the card that
    drives the desktop has less free, said in the line."""
    if estimate <= TIGHT * gpu_gib:
        return None
    if estimate <= gpu_gib:
        head = f"the estimated training memory ({size(estimate, 1)} a process) is {estimate / gpu_gib:.0%}"
        head += f" of {name} ({size(gpu_gib, 0)}): tight"
    else:
        head = f"the estimated training memory ({size(estimate, 1)} a process)"
        head += f" exceeds {name} ({size(gpu_gib, 0)})"
    if windows:
        head += " (on Windows the card that drives the display has less free: the desktop uses some of it)"
    length = "lower data.max_pixels / data.max_length" if images else "lower data.max_length"
    if fits:
        named = ", ".join(f"{overrides} fits (~{size(gib, 1)})" for overrides, gib in fits)
        others = ([] if half_weights else ["load the weights in bf16/fp16 (model.dtype)"]) + [length]
        return f"{head}: {named}; or {', or '.join(others)}"
    fixes = [] if half_weights else ["load the weights in bf16/fp16 (model.dtype)"]
    fixes += [] if checkpointing else ["set model.gradient_checkpointing=true"]
    fixes.append(length)
    if per_device != 1:
        fixes.append("use batch.per_device=1 with batch.global_batch for accumulation")
    return f"{head}: " + ", ".join(fixes[:-1]) + (", and " if len(fixes) > 1 else "") + fixes[-1]


@dataclass(frozen=True)
class MemoryCheck:
    """The estimate for one process against the smallest card it runs on."""

    estimate_gib: float
    gpu_gib: float
    gpu_name: str
    warning: str | None  # one line when it does not fit
    host_gib: float = 0.0  # activations a process keeps in host memory (model.activation_offload)
    kv_gib: float = 0.0  # of the estimate: generation's KV cache (a task that generates in training)

    def summary(self) -> str:
        host = f"; ~{size(self.host_gib, 1)} of activations in host memory" if self.host_gib else ""
        kv = f", generation's KV cache ~{size(self.kv_gib, 2)} of it" if self.kv_gib else ""
        return (f"~{size(self.estimate_gib, 1)} a process (estimate{kv}; {self.gpu_name}: "
                f"{size(self.gpu_gib, 0)}){host}")  # fmt: skip


@dataclass(frozen=True)
class _Lever:
    """One change the warning may offer: its override, its place in the order of cost, and the run
    it makes (None: as the config has it)."""

    override: str
    cost: int
    per_device: int | None = None
    checkpointing: bool | None = None
    quantization: str | None = None
    chunked: bool | None = None
    offload: bool | None = None
    frozen: float | None = None  # the frozen models' bytes (a teacher loaded in 4 bits)


def _levers(sizes: ModelSizes, per_device: int, checkpointing: bool, levers: MemoryLevers) -> list[_Lever]:
    """The changes a config does not make yet, in the order of their cost: the chunked loss (none
    in time), gradient checkpointing (~30% more compute), activation offloading (copies to host
    memory and back), 4-bit weights (other weights), a micro-batch of 1 (slower steps)."""
    found = []
    if levers.chunkable and not levers.chunked:
        found.append(_Lever("model.chunked_loss=auto", 0, chunked=True))
    if not checkpointing:
        found.append(_Lever("model.gradient_checkpointing=true", 1, checkpointing=True))
    if not levers.offload and levers.host_gib is not None:
        found.append(_Lever("model.activation_offload=true", 2, offload=True))
    if sizes.quantization is None and sizes.quantizable:
        found.append(_Lever("model.quantization=4bit", 3, quantization="4bit"))
    if sizes.frozen_4bit is not None:  # a teacher beside the model, in 4 bits
        found.append(_Lever(sizes.frozen_4bit[0], 3, frozen=sizes.frozen_4bit[1]))
    if per_device > 1:
        found.append(_Lever("batch.per_device=1", 4, per_device=1))
    return found


def _fits_host(host_gib: float, levers: MemoryLevers) -> bool:
    return levers.host_gib is None or host_gib * levers.processes <= TIGHT * levers.host_gib


def alternatives(
    sizes: ModelSizes,
    per_device: int,
    max_length: int,
    checkpointing: bool,
    precision: str | None,
    gpu_gib: float,
    levers: MemoryLevers = MemoryLevers(),
) -> list[tuple[str, float]]:
    """The smallest sets of the changes the config does not make yet (``_levers``: the chunked
    loss, gradient checkpointing, activation offloading within the machine's RAM, 4-bit weights,
    a micro-batch of 1) whose estimate fits ``gpu_gib``, best first: the cheapest most costly
    change first, then fewer changes, then the cheaper ones. Each is (the overrides, its estimate
    in GiB)."""
    offered = _levers(sizes, per_device, checkpointing, levers)
    sets = [c for n in range(1, len(offered) + 1) for c in combinations(offered, n)]
    sets.sort(key=lambda c: (max(lever.cost for lever in c), len(c), sum(lever.cost for lever in c)))
    found: list[tuple[tuple[str, ...], float]] = []
    for chosen in sets:
        names = tuple(lever.override for lever in chosen)
        if any(set(smaller) <= set(names) for smaller, _ in found):
            continue  # a subset fits already: this one changes more than needed
        batch = min([per_device] + [lever.per_device for lever in chosen if lever.per_device])
        ckpt = checkpointing or any(lever.checkpointing for lever in chosen)
        quantized = next((lever.quantization for lever in chosen if lever.quantization), sizes.quantization)
        run = replace(levers, chunked=levers.chunked or any(lever.chunked for lever in chosen),
                      offload=levers.offload or any(lever.offload for lever in chosen))  # fmt: skip
        frozen = next((lever.frozen for lever in chosen if lever.frozen is not None), sizes.frozen_bytes)
        sized = replace(sizes, quantization=quantized, frozen_bytes=frozen)
        gib, host = estimate_run(sized, batch, max_length, ckpt, precision, run)
        if gib <= gpu_gib and _fits_host(host, run):
            found.append((names, gib))
    return [(" ".join(names), gib) for names, gib in found]


LONGEST = 1 << 22  # data.max_length's upper bound (config/values.py)


def longest_sequence(
    sizes: ModelSizes,
    per_device: int,
    checkpointing: bool,
    precision: str | None,
    gpu_gib: float,
    levers: MemoryLevers = MemoryLevers(),
) -> int:
    """The longest ``data.max_length`` whose estimate stays under ``TIGHT`` of a card of
    ``gpu_gib`` (the levers as given: ``levers.sequence`` splits each sequence); 0: none fits.
    The estimate grows with the length: a binary search."""
    budget = TIGHT * gpu_gib

    def fits(length: int) -> bool:
        gib, host = estimate_run(sizes, per_device, length, checkpointing, precision, levers)
        return gib <= budget and _fits_host(host, levers)

    low, high = 0, LONGEST
    if fits(high):
        return high
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low


def longest_line(
    sizes: ModelSizes,
    per_device: int,
    checkpointing: bool,
    precision: str | None,
    gpu_gib: float,
    levers: MemoryLevers,
    split: int,
) -> str:
    """The longest sequence that fits a card as the config runs, and split across ``split``
    processes (``parallel.sequence``) or on one process (when the run splits already)."""

    extra = max((s.extra for s in sizes.stacks), default=0)  # a completion after the prompt (GRPO's)

    def longest(n: int) -> str:
        found = longest_sequence(
            sizes, per_device, checkpointing, precision, gpu_gib, replace(levers, sequence=n)
        )
        if found and extra:
            return f"~{found + extra:,} tokens ({found:,} of prompt + {extra:,} of completion)"
        return f"~{found:,} tokens" if found else "none"

    own = levers.sequence
    other = split if own == 1 else 1
    other_words = (
        f"split across {other} processes (parallel.sequence={other})" if other > 1 else "on one card alone"
    )
    own_words = (
        f"split across {own} (parallel.sequence={own}, this run)" if own > 1 else "on one card (this run)"
    )
    return f"{longest(own)} {own_words}; {longest(other)} {other_words}"


def check_memory(
    sizes: ModelSizes,
    per_device: int,
    max_length: int,
    gradient_checkpointing: bool,
    precision: str | None,
    gpu_gib: float,
    gpu_name: str,
    images: bool = False,
    windows: bool = False,
    levers: MemoryLevers = MemoryLevers(),
) -> MemoryCheck:
    """The estimate for a config's batch and length on a card of ``gpu_gib``, with the warning
    when it is tight (above ``TIGHT`` of the card) or does not fit (``images``: a vision-language
    model, whose image tokens ``data.max_pixels`` bounds; ``windows``: the card may drive the
    desktop), naming the changes that bring it under ``TIGHT`` of the card (``alternatives``);
    ``levers``: the chunked loss and activation offloading as the run has them (offloaded
    activations held against the machine's RAM, ``levers.host_gib``, shared by its processes)."""
    gib, host = estimate_run(sizes, per_device, max_length, gradient_checkpointing, precision, levers)
    budget = TIGHT * gpu_gib
    fits = (
        alternatives(sizes, per_device, max_length, gradient_checkpointing, precision, budget, levers)
        if gib > budget
        else []
    )
    warning = memory_warning(
        gib,
        gpu_gib,
        gpu_name,
        # a quantized run's float32 rest is peft's doing: model.dtype would not change it
        half_weights=sizes.weight_bytes == 2 or sizes.quantization is not None,
        checkpointing=gradient_checkpointing,
        per_device=per_device,
        images=images,
        fits=fits,
        windows=windows,
    )
    if levers.offload and not _fits_host(host, levers):
        assert levers.host_gib is not None
        ram = (
            f"model.activation_offload keeps ~{size(host * levers.processes, 1)} of activations in host "
            f"memory ({levers.processes} process(es)), more than {TIGHT:.0%} of this machine's "
            f"{size(levers.host_gib, 0)}"
        )
        warning = f"{warning}; and {ram}" if warning else ram
    act = activation_bytes(precision, sizes.weight_bytes)
    kv = kv_cache_bytes(per_device, sizes.kv_tokens, sizes.kv_values, act) / GIB
    return MemoryCheck(gib, gpu_gib, gpu_name, warning, host, kv)
