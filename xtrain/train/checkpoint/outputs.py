"""The final outputs: the adapter (or full model), the merged model, the best model so far
(``run.best_metric``) and ``train_result.json``, each replaced atomically."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xtrain import atomic
from xtrain.errors import XtrainError
from xtrain.model import chain, chain_adapter
from xtrain.model.lora import save_pretrained, saved_adapters
from xtrain.model.start import LINEAGE, MODE, RUN_FILE, SHA, seal, start_of
from xtrain.train.checkpoint.layout import RESULT_FILE

if TYPE_CHECKING:
    from collections.abc import Callable

    from accelerate import Accelerator
    from torch import Tensor
    from torch.nn import Module
    from transformers import PreTrainedTokenizerBase, ProcessorMixin


def _replace_dir(tmp: Path, final: Path) -> None:
    if final.exists():
        old = final.with_name(final.name + ".old")
        if old.exists():
            shutil.rmtree(old)
        atomic.replace(final, old)
        atomic.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        atomic.replace(tmp, final)


def _write_pretrained(
    model: Module,
    tokenizer: PreTrainedTokenizerBase | ProcessorMixin,
    final: Path,
    extra: dict[str, str] | None = None,
    state_dict: dict[str, Tensor] | None = None,
) -> None:
    """``save_pretrained`` of the model (and tokenizer) into ``final.tmp``, plus the ``extra`` text
    files, then ``final.tmp`` replaces ``final``. ``state_dict``: the weights gathered from a
    sharded model (``xtrain.train.distributed.sharded``; peft keeps the adapter's of them)."""
    tmp = final.with_name(final.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    if state_dict is None:
        save_pretrained(model, str(tmp))  # PiSSA/OLoRA adapters: converted to fit the original base
    else:  # gathered from a sharded model (PiSSA/OLoRA refused there: sharded.check_outputs)
        model.save_pretrained(str(tmp), state_dict=state_dict, **saved_adapters(model))
    chain.keep_earlier(chain.chain_of(model), tmp)  # a chained stage's earlier adapters, beside it
    if tokenizer is not None:
        tokenizer.save_pretrained(str(tmp))
    for name, text in (extra or {}).items():
        text = seal(text, tmp) if name == RUN_FILE else text  # the record names its adapter's hash
        (tmp / name).write_text(text, encoding="utf-8")
    _replace_dir(tmp, final)


def save_final(
    model: Module,
    tokenizer: PreTrainedTokenizerBase | ProcessorMixin,
    output_dir: str | Path,
    save_merged: bool,
    extra: dict[str, str] | None = None,
    state_dict: dict[str, Tensor] | None = None,
) -> dict[str, str]:
    """Write the trained result (main process only). ``model`` is the unwrapped model; ``extra``:
    text files saved with it (``result.run_record``); ``state_dict``: its gathered weights when
    it is sharded (then no merged model: ``sharded.check_outputs`` refused it before training).

    A chained stage (``model.chain``) also writes its adapters as one adapter on the base
    (``adapter-chain/``) where that is exact, else the merged model; its record says which.

    Returns {"adapter" | "model": path, "merged": path, "adapter-chain": path}."""
    out = Path(output_dir)
    paths: dict[str, str] = {}
    is_peft = hasattr(model, "peft_config") and hasattr(model, "merge_and_unload")
    name = "adapter" if is_peft else "model"
    kept = chain.chain_of(model)  # a chained stage: also the chain as one adapter, or merged
    kept = kept if kept is not None and kept.kept else None  # (a continued adapter alone: itself)
    why = chain_adapter.inexact([model.peft_config[n].to_dict() for n in kept.active]) if kept else None
    if kept is not None:
        says = {SINGLE: chain_adapter.FOLDER} if why is None else {SINGLE: None, SINGLE_WHY_NOT: why}
        extra = {**(extra or {}), RUN_FILE: json.dumps({**json.loads((extra or {})[RUN_FILE]), **says})}
    _write_pretrained(model, tokenizer, out / name, extra, state_dict)
    paths[name] = str(out / name)
    if kept is not None and why is None:
        paths[chain_adapter.FOLDER] = str(_write_single(out / name, tokenizer))
    if is_peft and ((save_merged and state_dict is None) or why is not None):
        _write_pretrained(merged_model(model, out / name), tokenizer, out / "merged", extra)
        paths["merged"] = str(out / "merged")
    return paths


def checkpoint_result(
    accelerator: Accelerator,
    model: Module,
    tokenizer: PreTrainedTokenizerBase | ProcessorMixin | None,
    record: dict[str, str],
    lora: bool,
) -> Callable[[Path], None] | None:
    """What a checkpoint holds beside the training state (``save.save``'s ``result``): a LoRA
    run's adapter in ``FOLDER/adapter``, written as the final one is (its tokenizer, its record
    with the lineage and the adapter's hash), so ``checkpoints/step-N`` is a start of its own
    (``model.start``; ``xtrain predict``) as HF Trainer's ``checkpoint-N`` folders are. It costs
    the adapter's size once more (the optimizer state is twice that). None: a full fine-tune (it
    would copy the whole model) or weights sharded over the ranks (gathering them is a
    collective): ``model.start.not_a_result`` says so when such a checkpoint is given as a start."""
    from xtrain.model.sharding import sharding

    if not lora or sharding(accelerator) is not None:
        return None
    unwrapped = accelerator.unwrap_model(model, keep_torch_compile=False)
    if not hasattr(unwrapped, "peft_config"):  # a custom builder's model that is not peft's
        return None
    return lambda folder: _write_pretrained(unwrapped, tokenizer, folder / "adapter", record)


# the run record's keys for a chained stage: its adapters as one adapter (the folder), or why not
# (the merged model is saved instead)
SINGLE, SINGLE_WHY_NOT = "single_adapter", "single_adapter_why_not"


def _write_single(adapter: Path, tokenizer: PreTrainedTokenizerBase | ProcessorMixin) -> Path:
    """``adapter-chain/`` beside the chained result in ``adapter``: its adapters concatenated
    (``model.chain_adapter``), its tokenizer, and its record naming the stages it ``combines``
    (the folder is one adapter on the base: a start of its own, without a lineage)."""
    final = adapter.parent / chain_adapter.FOLDER
    tmp = final.with_name(final.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    chain_adapter.write(start_of(str(adapter)), tmp)
    if tokenizer is not None:
        tokenizer.save_pretrained(str(tmp))
    record = json.loads((adapter / RUN_FILE).read_text(encoding="utf-8"))
    record["combines"] = list(start_of(str(adapter)).lineage)  # the stages, this one last
    for key in (LINEAGE, MODE, SHA, SINGLE, SINGLE_WHY_NOT):
        record.pop(key, None)
    (tmp / RUN_FILE).write_text(json.dumps(record), encoding="utf-8")
    _replace_dir(tmp, final)
    return final


def merged_model(model: Module, adapter: Path) -> Module:
    """The adapter saved at ``adapter`` merged into a freshly loaded base on the CPU, in the
    checkpoint's dtype (never the 4/8-bit weights a QLoRA run trained on): ``model/merge.py``, the
    path ``xtrain export --to merged`` takes too, so both give the same weights. ``model`` (the
    trained peft model) gives the base's class, source and config (a new head's labels).

    A model a custom builder made in the process (no checkpoint its adapter names) has no base to
    load again: an unquantized one is merged as it trained (``merge_and_unload``, in place: the
    caller does it last); a quantized one is refused."""
    from xtrain.model import merge, quantization

    base = model.get_base_model()
    source = next(iter(model.peft_config.values())).base_model_name_or_path
    if not source:
        if quantization.is_quantized(model):
            raise XtrainError(
                "run.save_merged: the 4/8-bit model was built in the process and names no base "
                "checkpoint to merge into (merging into 4-bit weights would round them)",
                "set run.save_merged=false and merge later with xtrain export --base BASE",
            )
        return model.merge_and_unload()
    return merge.merged_from_adapter(adapter, type(base), source, base.config)


# the best model by an eval metric (run.best_metric)
BEST = "best"
_LOWER_IS_BETTER = ("loss", "cer", "wer", "perplexity", "error")


def lower_is_better(metric: str) -> bool:
    """Losses and error rates fall as a model improves; accuracies and scores rise."""
    return any(part in metric.lower() for part in _LOWER_IS_BETTER)


def is_new_best(metric: str, value: float, history: list[dict[str, float]]) -> bool:
    """Whether ``value`` beats every earlier eval in ``history`` (ties keep the earlier model)."""
    earlier = [h[metric] for h in history if metric in h]
    if not earlier:
        return True
    return value < min(earlier) if lower_is_better(metric) else value > max(earlier)


def save_best(
    model: Module,
    tokenizer: PreTrainedTokenizerBase | ProcessorMixin,
    output_dir: str | Path,
    step: int,
    metric: str,
    value: float,
    extra: dict[str, str] | None = None,
    state_dict: dict[str, Tensor] | None = None,
) -> Path:
    """``output_dir/best``: the model (adapter, or full model without LoRA) of the best eval so far,
    with ``best.json`` naming the step and the value (main process only; replaced atomically)."""
    out = Path(output_dir)
    best = json.dumps({"step": step, "metric": metric, "value": value})
    _write_pretrained(model, tokenizer, out / BEST, {"best.json": best, **(extra or {})}, state_dict)
    return out / BEST


def write_result(output_dir: str | Path, result: dict[str, Any], keep: bool = False) -> Path:
    """Write train_result.json; with ``keep`` an existing one stays as it is."""
    path = Path(output_dir) / RESULT_FILE
    if keep and path.is_file():
        return path
    atomic.write_text(path, json.dumps(result, indent=1, default=str))
    return path
