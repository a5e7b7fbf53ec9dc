"""The checks an export runs before it hands anything over, and what quantization costs.

Checks: a failed one stops the export with what differs (``ParityError``, one line):

- ``merged``: the merged model's logits on a few prompts, rendered as training rendered its
  conversations, equal base + adapter's within the tolerance of the weights' dtype (and
  ``MergeProbe``: sampled rows of every adapted weight equal base + B @ A x scaling);
- ``file``: every tensor of a GGUF file, read back by the ``gguf`` package's reader, is the one
  xtrain meant to write, exactly: its name, type, shape and bytes (sha256) as the writer made
  them (the ``gguf`` package's own quantizer for Q8_0/Q4_0/Q5_0/Q5_1, whose bytes these are),
  and each K-quant block the format's dequantizer reads back equal, value for value, to what
  xtrain's quantizer computed before packing it (``written``);
- ``template``: the chat template stored in every output renders the same text as training did
  for the same conversations (in llama.cpp's own engine when it is installed: ``file_checks``).

Costs, measured and reported, never a refusal by themselves (a sharper model's logits move more
under the same rounding: the quickstart's q8_0 file moved 13% of the largest logit and answers
every eval prompt as the merged model does): each quantized tensor's relative rms error, the
file's logits against the merged model's (``difference``) and the eval prompts whose greedy answer
changes (``answers``); past ``COST_WARN`` the export warns.

A 16-bit model's logits carry its own arithmetic's rounding, which grows with depth (a bf16 300M
Llama's forward alone is 2-3% off from the same weights in float32), so for 16-bit weights the
merge is proven weight by weight (``MergeProbe``), and the logits check only catches what breaks a
model outright (a layer merged twice, the wrong head).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from xtrain.errors import XtrainError

if TYPE_CHECKING:
    from pathlib import Path

    import torch
    from torch.nn import Module
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from xtrain.export.gguf import Written
    from xtrain.export.templates import Render

# the merge check: largest |logit difference| / largest |logit|, by the dtype of the merged weights
# (16-bit merges: the logits check is the coarse one; MergeProbe checks the weights themselves)
TOLERANCE = {"float32": 1e-4, "float16": 5e-2, "bfloat16": 1.5e-1}
# a GGUF file's logits against the merged model past which the export warns (never refuses): about
# twice the most measured for each type (docs/export.md#types: random-weight models up to 0.04 q8_0,
# 0.16 q6_k, 0.34 q5_k_m, 0.49 q4_k_m, 0.62 q4_0; the trained quickstart model 0.13 q8_0, 0.7
# q4_0); a file broken outright reads 1 and more, and the ``file`` check refuses it
COST_WARN = {"f16": 0.05, "bf16": 0.1, "q8_0": 0.3, "q6_k": 0.5, "q5_k_m": 0.8, "q4_k_m": 1.0, "q4_0": 1.2}
CHANGED_WARN = 0.25  # the share of eval prompts answered otherwise than by the merged model
Found = tuple[str, tuple[int, ...], str]  # a tensor read back: type, shape, the bytes' sha256
ROWS_PER_WEIGHT = 8  # the merge check's sampled rows of each adapted weight (first, last, between)


class ParityError(XtrainError):
    """An export check failed: nothing was handed over (exit 1: not the user's input)."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message, hint, exit_code=1)


@dataclass
class Check:
    name: str  # merged | gguf | template
    detail: str  # what was compared and by how much


# conversations of the shapes a chat model is asked: one question, a follow-up, a system prompt
PROBES = (
    [{"role": "user", "content": "Hello! Who are you?"}],
    [
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": "And of Italy?"},
    ],
)
SYSTEM_PROBE = [
    {"role": "system", "content": "You answer in one word."},
    {"role": "user", "content": "Sky colour?"},
]
TEXT_PROBES = ("Once upon a time", "The answer to the question is")


def probe_conversations(render: Render) -> list[list[dict[str, str]]]:
    """The probe conversations this template takes (a system prompt only where it has a turn)."""
    out = [list(c) for c in PROBES]
    try:
        text = render(SYSTEM_PROBE, True)
    except Exception:  # a template without a system role (Gemma) raises
        return out
    if SYSTEM_PROBE[0]["content"] in text:
        out.append(list(SYSTEM_PROBE))
    return out


def prompt_ids(tokenizer: PreTrainedTokenizerBase, render: Render | None) -> list[list[int]]:
    """Token ids of the probe prompts as training made them: a chat run's conversations rendered
    with the generation prompt and tokenized without adding special tokens (the template holds
    them, as in ``chat_data.encode``); a plain run's texts with the tokenizer's own specials."""
    if render is None:
        return [tokenizer(t, add_special_tokens=True)["input_ids"] for t in TEXT_PROBES]
    texts = [render(c, True) for c in probe_conversations(render)]
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def logits(model: Module, prompts: list[list[int]]) -> list[torch.Tensor]:
    """The model's float32 logits on each prompt (one at a time: no padding to get right)."""
    import torch

    out = []
    device = next(model.parameters()).device
    with torch.no_grad():
        for ids in prompts:
            found = model(input_ids=torch.tensor([ids], device=device)).logits[0]
            out.append(found.float().cpu())
    return out


def logits_float32(model: Module, prompts: list[list[int]]) -> list[torch.Tensor]:
    """The logits a float32 copy of ``model`` would give, without making that copy
    (``float32_forward``)."""
    with float32_forward(model):
        return logits(model, prompts)


@contextmanager
def float32_forward(model: Module) -> Iterator[None]:
    """Inside, ``model`` computes as its float32 copy would, without that copy: each module's own
    16-bit weights are upcast for its forward only and the original tensors put back after
    (16-bit -> float32 is exact, so this is the float32 model's arithmetic), holding one module's
    float32 weights at a time instead of twice the model (a 7B bf16 model: 28 GB)."""
    import torch

    saved: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}

    def upcast(module: Module, _args: tuple) -> None:
        held = []
        for tensor in [*module.parameters(recurse=False), *module.buffers(recurse=False)]:
            if tensor.is_floating_point() and tensor.dtype != torch.float32:
                held.append((tensor, tensor.data))
                tensor.data = tensor.data.float()
        saved[id(module)] = held

    def restore(module: Module, _args: tuple, _out: object) -> None:
        for tensor, data in saved.pop(id(module), []):
            tensor.data = data

    handles = []
    for module in model.modules():
        handles.append(module.register_forward_pre_hook(upcast))
        handles.append(module.register_forward_hook(restore))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        for held in saved.values():  # a forward that raised: its weights back as they were
            for tensor, data in held:
                tensor.data = data


def difference(expected: list[torch.Tensor], got: list[torch.Tensor]) -> float:
    """The largest |difference| over every prompt and position, relative to the largest |logit|
    (infinite where either side is not finite: a NaN must fail the check, not pass it)."""
    import math

    if not all(bool(t.isfinite().all()) for t in (*expected, *got)):
        return math.inf
    worst = max(float((e - g).abs().max()) for e, g in zip(expected, got, strict=True))
    scale = max(float(e.abs().max()) for e in expected)
    return worst / max(scale, 1e-6)


@dataclass
class Cost:
    """What quantization cost one GGUF file: its logits against the merged model's (``difference``)
    and, where the run has eval prompts, how many of them it answers otherwise (greedy)."""

    kind: str  # the file's --type
    logits: float
    answered: int = 0
    changed: int = 0
    runtime: str = ""  # what answered for the file: llama.cpp, or transformers' GGUF reader

    def line(self) -> str:
        said = f"{self.kind}: logits within {self.logits:.1e} of the largest logit (merged model's)"
        if self.answered:
            same = self.answered - self.changed
            said += f"; {same} of {self.answered} eval prompts answered as the merged model ({self.runtime})"
        return said

    def warning(self) -> str | None:
        """One line past ``COST_WARN`` / ``CHANGED_WARN``, else None."""
        far = not self.logits <= COST_WARN[self.kind]  # NaN warns too
        changed = self.answered and self.changed > CHANGED_WARN * self.answered
        if not (far or changed):
            return None
        return (
            f"{self.kind} moves this model more than the type usually does ({self.line()}): compare "
            "its answers below with a larger type's (q8_0, f16) before you ship it"
        )


def compare(name: str, what: str, expected: list[torch.Tensor], got: list[torch.Tensor], kind: str) -> Check:
    """``got`` against ``expected`` within ``TOLERANCE[kind]``, or a ``ParityError``."""
    found, limit = difference(expected, got), TOLERANCE[kind]
    if found > limit:
        raise ParityError(
            f"{what} differ by {found:.2e} of the largest logit (a {kind} export allows {limit:.2g})",
            "nothing was written; report it with the model's name: the export is wrong for this model",
        )
    return Check(name, f"{what}: within {found:.1e} of the largest logit ({kind}, allowed {limit:.2g})")


class MergeProbe:
    """Sampled rows of every LoRA-adapted weight as the merge must leave them: base + B @ A x
    scaling (a chain's adapters summed), computed in float32 from the adapted model before
    merging (a few KiB per layer). ``check`` compares them with the merged model's weights,
    allowing the weight dtype's rounding of the sum and of the delta (peft rounds the delta to the
    weight's dtype before adding it, one adapter at a time).
    DoRA layers (a magnitude rescales the merged weight) and embedding adapters are left to the
    logits check."""

    PREFIX = "base_model.model."

    def __init__(self, adapted: Module) -> None:
        from peft.tuners.lora import LoraLayer

        self.rows: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self.skipped = 0
        for name, module in adapted.named_modules():
            if not isinstance(module, LoraLayer):
                continue
            found = self._expected(module)
            if found is None:
                self.skipped += 1
            else:
                self.rows[name.removeprefix(self.PREFIX)] = found

    @staticmethod
    def _expected(module: Module) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        import torch

        adapters = [a for a in module.active_adapters if a in module.lora_A]
        weight = getattr(module.get_base_layer(), "weight", None)
        if (
            not adapters
            or weight is None
            or weight.dim() != 2
            or any(module.use_dora.get(a) for a in adapters)
        ):
            return None
        with torch.no_grad():  # a chain's adapters add (model.chain): their deltas summed
            deltas = [
                module.lora_B[a].weight.float() @ module.lora_A[a].weight.float() * module.scaling[a]
                for a in adapters
            ]
            deltas = [d.T for d in deltas] if module.fan_in_fan_out else deltas
            delta, size = sum(deltas), sum(d.abs() for d in deltas)
            n = weight.shape[0]
            rows = torch.unique(torch.linspace(0, n - 1, min(ROWS_PER_WEIGHT, n)).round().long())
            base, delta, size = weight[rows].float(), delta[rows], size[rows]
            eps = torch.finfo(weight.dtype).eps
            n = len(adapters)  # peft adds each adapter's delta in turn: a rounding each
            allowed = eps * (n * base.abs() + (n + 1) * size) + torch.finfo(torch.float32).tiny
        return rows, base + delta, allowed

    def check(self, merged: Module) -> Check:
        """The merged model's sampled rows against the expected ones, or a ``ParityError``."""
        worst, where = 0.0, ""
        for name, (rows, expected, allowed) in self.rows.items():
            got = merged.get_submodule(name).weight[rows].detach().float()
            excess = float(((got - expected).abs() / allowed).max())
            if excess > worst:
                worst, where = excess, name
        if worst > 1:
            raise ParityError(
                f"the merged weight {where} is not base + adapter: off by {worst:.1f}x the rounding "
                "its dtype allows",
                "nothing was written; report it with the model's name: the merge is wrong for this model",
            )
        dtype = str(next(merged.parameters()).dtype).removeprefix("torch.")
        left = f", {self.skipped} DoRA/embedding layers by the logits only" if self.skipped else ""
        detail = (
            f"{len(self.rows)} adapted weights: sampled rows equal base + B @ A x scaling (float32) "
            f"within {dtype} rounding{left}"
        )
        return Check("weights", detail)


def written(meant: list[Written], found: dict[str, Found], where: str) -> list[Check]:
    """Every tensor of the file as it was meant (``gguf.Written``) against what the reader ``found``
    in it (``gguf.read_tensors``), exactly, or a ``ParityError`` naming the first that is not; then
    the quantized tensors' measured error (a line, no limit)."""
    fix = "nothing was written; report it with the model's name: the export is wrong for this model"
    for w in meant:
        got = found.get(w.name)
        if got is None:
            raise ParityError(f"{where} holds no tensor {w.name}", fix)
        if got[:2] != (w.qtype, w.shape) or got[2] != w.digest:
            what = "other bytes" if got[:2] == (w.qtype, w.shape) else f"{got[0]} {list(got[1])}"
            raise ParityError(
                f"{where}: the tensor {w.name} reads back as {what}, not the {w.qtype} {list(w.shape)} "
                "xtrain wrote",
                fix,
            )
        if w.differs_at is not None:
            raise ParityError(
                f"{where}: the tensor {w.name} ({w.qtype}) reads back unlike xtrain's quantizer made "
                f"it (value {w.differs_at} differs)",
                fix,
            )
    extra = sorted(set(found) - {w.name for w in meant})
    if extra:
        raise ParityError(f"{where} holds tensors xtrain did not write: {', '.join(extra[:3])}", fix)
    exact = [Check("file", f"{where}: {len(meant)} tensors read back by gguf exactly as written")]
    by_type: dict[str, float] = {}
    for w in meant:
        if w.error is not None:
            by_type[w.qtype] = max(by_type.get(w.qtype, 0.0), w.error)
    if not by_type:
        return exact
    worst = ", ".join(f"{q} {e:.1e}" for q, e in sorted(by_type.items()))
    count = sum(w.error is not None for w in meant)
    detail = f"{where}: {count} tensors, relative rms error (worst by type) {worst}"
    return [*exact, Check("quantized", detail)]


def same_text(name: str, where: str, expected: list[str], got: list[str]) -> Check:
    """Rendered conversations identical, or a ``ParityError`` naming the first difference."""
    for e, g in zip(expected, got, strict=True):
        if e != g:
            at = next((i for i, (a, b) in enumerate(zip(e, g, strict=False)) if a != b), min(len(e), len(g)))
            raise ParityError(
                f"the chat template in {where} renders differently from training at character {at}: "
                f"{g[at : at + 30]!r} instead of {e[at : at + 30]!r}",
                "nothing was written; report it with the run's chat template",
            )
    return Check(name, f"{where}: {len(expected)} conversations render as in training")


def rendered(render: Render, conversations: list[list[dict[str, str]]]) -> list[str]:
    return [render(c, True) for c in conversations]


def gguf_template(path: str | Path) -> str | None:
    """The ``tokenizer.chat_template`` a GGUF file holds (read with the gguf package's reader)."""
    from gguf import GGUFReader

    field = GGUFReader(str(path)).fields.get("tokenizer.chat_template")
    if field is None:
        return None
    return bytes(field.parts[field.data[0]]).decode("utf-8")


# the dtype a GGUF file is read back in: its own 16 bits (exact for f16/bf16; a quantized block's
# scale x level rounded to float16's 11 bits, 16x finer than q8_0's own step and finer still than
# the 4-6 bit types'), half what float32 would hold; the forward still runs in float32
# (``logits_float32``); types not named: float16
READ_BACK_DTYPE = {"f16": "float16", "bf16": "bfloat16"}


def load_gguf(path: str | Path, kind: str = "f16") -> PreTrainedModel:
    """The GGUF file as a transformers model, dequantized to ``READ_BACK_DTYPE`` of ``kind``, in eval mode.

    transformers' own GGUF reading (its config and tensor conversion: the q/k permutation undone,
    the norm shifts), holding one copy of the weights: ``from_pretrained(gguf_file=)`` dequantizes
    every tensor into a dict and then copies it into the model (twice the weights, measured on a
    300M Llama); here the model is built without its weights (accelerate's ``init_empty_weights``,
    the rotary buffers computed as usual) and the dict's tensors become its parameters
    (``assign=True``)."""
    import torch
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint
    from transformers.utils import logging

    was = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()  # its tqdm bars would print under the export's own progress
    dtype = getattr(torch, READ_BACK_DTYPE.get(kind, "float16"))
    try:
        config = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name, trust_remote_code=False)
        with init_empty_weights(include_buffers=False):
            model = AutoModelForCausalLM.from_config(config)
        found = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model, torch_dtype=dtype)
        model.load_state_dict(found.pop("tensors"), strict=False, assign=True)
    finally:
        if was:
            logging.enable_progress_bar()
    model.tie_weights()
    missing = [name for name, p in model.named_parameters() if p.is_meta]
    if missing:
        raise ParityError(
            f"{path.name} read back without the weights {', '.join(missing[:3])}",
            "nothing was written; report it with the model's name: the export is wrong for this model",
        )
    model.eval()
    return model
