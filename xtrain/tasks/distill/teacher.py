"""The teacher: ``distill.teacher`` read as ``model.name_or_path`` is read (``model.start``'s
``Start``: a base model, a built-in, a hub id, or a trained run or chain: its base and its
adapters in order, each checked against its record), loaded frozen on the student's device in eval
mode, its 4-bit or 8-bit weights through bitsandbytes (``distill.teacher_quantization``), computing
as a plain forward does (a 4-bit layer never repacked for the CPU's inference kernel:
``quantization.keep_training_layout``).

The teacher must share the student's tokenizer (``check_vocabulary``: the same tokens at the same
ids and the same special tokens): the losses compare the two next-token distributions entry by
entry. Where the heads' widths differ (padding rows past the tokenizer's tokens), the distributions
are taken over the tokenizer's tokens (``shared_width``).

``hidden_at``: the teacher's hidden states at the trained positions and its head, for the losses'
chunks (its logits are made a chunk at a time, never for every position at once).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xtrain.errors import XtrainError
from xtrain.model.start import Start, start_of

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

    from xtrain.config.schema import TrainConfig
    from xtrain.model.chunked_loss import LogitMap
    from xtrain.planning.run import Run
    from xtrain.tasks.distill.losses import Head

KEY = "distill.teacher"
CAUSAL_LM = "AutoModelForCausalLM"


@dataclass
class Teacher:
    """The loaded teacher: its model (frozen, eval mode), what its forward does to its head's
    logits (``mapping``), the width both distributions are taken over (None: the heads' whole
    width) and where it came from."""

    model: torch.nn.Module
    mapping: LogitMap
    vocab: int | None
    start: Start


def teacher_start(cfg: TrainConfig) -> Start:
    """``distill.teacher`` as a ``Start``; a result of a task that trains another kind of model is
    one line."""
    from xtrain import tasks

    name = cfg.distill.teacher
    if not name:
        raise XtrainError(
            f"model.task=distill needs {KEY}", f"set {KEY} to the model the student learns from"
        )
    start = start_of(name)
    theirs = tasks.all_tasks().get(start.task) if start.task else None
    if theirs is not None and theirs.model_class != CAUSAL_LM:
        raise XtrainError(
            f"{KEY}={name} is a {theirs.name} result ({theirs.model_class}); a teacher is a causal LM",
            "name a causal LM or a result of a task that trains one (causal-lm, preference, grpo, distill)",
        )
    return start


def source_of(cfg: TrainConfig) -> str:
    """The folder or hub id the teacher's weights load from (a built-in written once)."""
    from xtrain.model import load as models

    return models.resolve_model(teacher_start(cfg).base)


def load_tokenizer(cfg: TrainConfig, source: str) -> PreTrainedTokenizerBase:
    """The teacher's tokenizer: a trained result's own (saved beside its adapter), else its base's."""
    from xtrain.model import load as models

    return models.load_tokenizer(teacher_start(cfg).tokenizer or source, cfg.model.trust_remote_code)


def _specials(tok: PreTrainedTokenizerBase) -> dict[str, int | None]:
    return {name: getattr(tok, f"{name}_token_id", None) for name in ("bos", "eos", "unk")}


def check_vocabulary(student: PreTrainedTokenizerBase, teacher: PreTrainedTokenizerBase, name: str) -> None:
    """The teacher's tokenizer against the student's: the same tokens at the same ids and the same
    start, end and unknown tokens; one line naming the first difference otherwise."""
    head = f"{KEY}={name} has another tokenizer than the student"
    fix = (
        "distillation compares the two models' next-token distributions token by token: pick a teacher "
        "of the student's family (the same tokenizer), e.g. a bigger model of the same release"
    )
    mine, theirs = student.get_vocab(), teacher.get_vocab()
    if len(mine) != len(theirs):
        raise XtrainError(f"{head}: {len(theirs):,} tokens, the student's {len(mine):,}", fix)
    if mine != theirs:
        by_id = {i: t for t, i in mine.items()}
        other = {i: t for t, i in theirs.items()}
        first = min(i for i in set(by_id) | set(other) if by_id.get(i) != other.get(i))
        raise XtrainError(
            f"{head}: token {first} is {other.get(first)!r} in the teacher's and {by_id.get(first)!r} in "
            "the student's",
            fix,
        )
    a, b = _specials(student), _specials(teacher)
    if a != b:
        differ = ", ".join(f"{k} {b[k]} (the student's {a[k]})" for k in a if a[k] != b[k])
        raise XtrainError(f"{head}: its special tokens differ: {differ}", fix)


def shared_width(student_vocab: int, teacher_vocab: int, tokens: int, name: str) -> int | None:
    """The width both distributions are taken over: the whole heads' where they are as wide (None),
    else the tokenizer's ``tokens`` (the rows past them pad the heads to a multiple)."""
    if student_vocab == teacher_vocab:
        return None
    if tokens > min(student_vocab, teacher_vocab):
        raise XtrainError(
            f"{KEY}={name}'s head has {teacher_vocab:,} rows and the student's {student_vocab:,}, fewer "
            f"than their tokenizer's {tokens:,} tokens",
            "use a teacher and a student whose heads cover every token of their tokenizer",
        )
    return tokens


def quantization_kwargs(cfg: TrainConfig, device: str, precision: str) -> dict[str, Any]:
    """``from_pretrained`` keywords of ``distill.teacher_quantization`` ({} without): the model's
    own 4/8-bit loading (``model.quantization``'s rules), on this process's device."""
    import torch

    from xtrain.model import quantization

    q = cfg.distill.teacher_quantization
    if q is None:
        return {}
    where = torch.device(device).type
    problem = quantization.bnb_problem(
        f"distill.teacher_quantization={q}", where, quantization.read_backend(),
        "set distill.teacher_quantization=null",
    )  # fmt: skip
    if problem is not None:
        raise problem
    as_model = dataclasses.replace(cfg.model, quantization=q)
    plain = dataclasses.replace(cfg, model=as_model, lora=dataclasses.replace(cfg.lora, modules_to_save=None))
    return quantization.load_kwargs(plain, device, precision)


def load(run: Run, student_tokenizer: PreTrainedTokenizerBase, student_vocab: int) -> Teacher:
    """The teacher for this process's ``run``: its tokenizer checked against the student's, its
    weights loaded (a trained result's adapters applied in order), frozen, in eval mode, on
    ``run.device``."""
    import transformers

    from xtrain.model import attention, chain, quantization
    from xtrain.model import load as models
    from xtrain.model.chunked_loss import logit_map

    cfg = run.cfg
    name, start = str(cfg.distill.teacher), teacher_start(cfg)
    source = models.resolve_model(start.base)
    check_vocabulary(student_tokenizer, load_tokenizer(cfg, source), name)
    auto = transformers.AutoModelForCausalLM
    chosen = attention.for_load(cfg, auto, source, run.device, run.precision)
    extra = {**chosen.kwargs(), **quantization_kwargs(cfg, run.device, run.precision)}
    model = models.load_model(source, CAUSAL_LM, "distill teacher", cfg.model.dtype,
                              cfg.model.trust_remote_code, run.device_type, **extra)  # fmt: skip
    if "device_map" not in extra:
        model.to(run.device)
    if start.adapters:
        model = chain.load(model, start)  # every adapter, in order, frozen (their hashes checked)
    model.eval()
    model.requires_grad_(False)
    quantization.keep_training_layout(model)  # a 4-bit teacher computes as its plain forward
    mapping = logit_map(model.config)
    if isinstance(mapping, str):
        raise XtrainError(f"{KEY}={name}: {mapping}", "use a teacher whose head's logits are its output")
    head = model.get_output_embeddings()
    width = int(getattr(head, "out_features", 0) or head.weight.shape[0])
    vocab = shared_width(student_vocab, width, len(student_tokenizer), name)
    return Teacher(model, mapping, vocab, start)


def hidden_at(
    model: torch.nn.Module, inputs: dict[str, torch.Tensor], keep: torch.Tensor
) -> tuple[torch.Tensor, Head]:
    """([K, H] the hidden states at the flat positions ``keep`` of ``model(**inputs)``, its head's
    forward): the head runs on nothing here (the losses run it a chunk at a time)."""
    from xtrain.model.chunked_logps import with_head

    def compute(head: torch.nn.Module, hidden: torch.Tensor) -> tuple[Any, torch.Tensor]:
        flat = hidden.reshape(-1, hidden.shape[-1]).index_select(0, keep)
        return (flat, head.forward), hidden[..., :0]

    return with_head(model, inputs, compute)


def record(cfg: TrainConfig, teacher: Start) -> dict[str, Any]:
    """What the run record keeps of its teacher: the name as given, its base, its adapters' hashes
    (a trained result's), how it was loaded and the loss."""
    d = cfg.distill
    base = teacher.base if not Path(teacher.base).expanduser().exists() else str(Path(teacher.base).resolve())
    return {
        "distill": {
            "teacher": d.teacher, "teacher_base": base,
            "teacher_adapters": [a.sha256 for a in teacher.adapters],
            "teacher_quantization": d.teacher_quantization, "mode": d.mode,
            **({"beta": d.beta, "lmbda": d.lmbda, "seq_kd": d.seq_kd} if d.mode == "gkd" else {}),
        }
    }  # fmt: skip
