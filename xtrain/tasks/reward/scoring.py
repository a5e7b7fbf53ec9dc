"""A trained reward model as a scorer: prompt + answer -> one number, the text rendered as the
model was trained (its own tokenizer and chat template, the run's ``data.max_length``), batched,
frozen, without gradients. ``xtrain predict RM_RUN`` (``predict.py``) and GRPO's ``model:PATH``
rewards (``grpo.rewards.ModelReward``) score through the same ``Scorer``, so a GRPO run's rewards are the
numbers ``xtrain predict`` gives for the same texts.

A reward run's folder is recognised from its files alone (``reward_start``: its record's task),
before anything loads: a folder of another task's result is one line."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xtrain.errors import XtrainError
from xtrain.model.start import RUN_FILE, NotAResult, Start, model_folder, read_json_object, start_of

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from xtrain.data.rows.preference import Encoder, Turns

NAME = "reward"
BATCH = 16  # sequences a forward scores


def encoder_for(data: dict[str, Any], tokenizer: PreTrainedTokenizerBase, folder: str) -> Encoder:
    """The run's ``Encoder`` from its record's data settings (``data``) and the tokenizer saved
    with it (which carries the chat template it trained with)."""
    import dataclasses

    from xtrain.config.schema import DataConfig
    from xtrain.tasks.reward.rows import encoder_of
    from xtrain.tasks.validation import reader_config

    known = {f.name for f in dataclasses.fields(DataConfig)}  # a record of another xtrain version
    settings = {k: v for k, v in data.items() if k in known}
    settings.update(train=None, eval=None, chat_template=None, packing="off", mix="concat", mix_probs=None)
    cfg = reader_config({"model": {"task": NAME}, "data": settings})
    return encoder_of(cfg, tokenizer, folder)


@dataclass
class Scorer:
    """A reward model (eval mode, frozen) and how its texts become token ids."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    encoder: Encoder
    batch_size: int = BATCH

    def scores(self, items: list[tuple[str | Turns, str]], where: str = "prompt") -> list[float]:
        """One reward per (prompt, answer): the prompt as text (a user turn when the model trained
        on chat) or turns, the answer the assistant's; ``where`` names the items in refusals."""
        import torch

        from xtrain.data.collate import PadCollator
        from xtrain.tasks.reward.forward import rewards

        pad = PadCollator(self.tokenizer.pad_token_id)
        device = next(self.model.parameters()).device
        out: list[float] = []
        for start in range(0, len(items), self.batch_size):
            chunk = items[start : start + self.batch_size]
            ids = [self.encoder.answer(p, a, f"{where} {start + i}")[0] for i, (p, a) in enumerate(chunk)]
            batch = pad([{"input_ids": x, "attention_mask": [1] * len(x)} for x in ids])
            with torch.no_grad():
                out += rewards(self.model, {k: v.to(device) for k, v in batch.items()}).tolist()
        return out


def load_model(
    folder: Path, base: str, record: dict[str, Any]
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The base as a one-logit sequence classifier (its head is the adapter's: ``modules_to_save``)
    and the tokenizer saved with the result; the pad id set (the pooling reads it)."""
    from transformers import AutoModelForSequenceClassification

    from xtrain.model import load as models
    from xtrain.tasks.contract import BASE_LOAD

    tokenizer = models.load_tokenizer(str(folder), False)
    load = {"num_labels": 1, **record.get(BASE_LOAD, {})}  # a quantized run's base: in 4/8 bits
    model = AutoModelForSequenceClassification.from_pretrained(base, trust_remote_code=False, **load)
    model.config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def reward_start(path: str, key: str) -> tuple[Path, Start, dict[str, Any]]:
    """(the result folder, its ``Start``, its record) of a reward run given as ``path``; one line
    naming ``key`` for a folder that is not one (another task's result, no result at all)."""
    hint = "give the folder of a run trained with model.task: reward (docs/reward-models.md)"
    try:
        folder = model_folder(path)
    except NotAResult:
        raise
    except XtrainError as e:
        raise XtrainError(f"{key}: {e.message}", hint) from None
    record = read_json_object(folder / RUN_FILE)
    task = record.get("task")
    if task != NAME:
        what = f"a {task} result" if isinstance(task, str) else "not a result xtrain trained"
        raise XtrainError(f"{key} is {what}, not a reward model", hint)
    return folder, start_of(str(folder)), record


def load(path: str | Path, device: torch.device | str, key: str = "model") -> Scorer:
    """The reward run at ``path`` loaded as ``xtrain predict`` loads it (its base, every adapter of
    its chain, a quantized run's base in 4/8 bits), on ``device``, frozen."""
    import torch

    from xtrain.model import chain, quantization
    from xtrain.model import load as models
    from xtrain.tasks.contract import BASE_LOAD

    folder, start, record = reward_start(str(path), key)
    device = torch.device(device)
    found = record.get("quantization") if record.get("quantization") in ("4bit", "8bit") else None
    whole = read_json_object(folder / "adapter_config.json").get("modules_to_save") or []
    base_load = quantization.predict_kwargs(found, device, (), whole) if start.adapters else {}
    base = models.resolve_model(start.base) if start.adapters else str(folder)
    model, tokenizer = load_model(folder, base, {**record, BASE_LOAD: base_load})
    if start.adapters:
        model = chain.load(model, start)
    if not base_load:
        model.to(device)
    model.eval().requires_grad_(False)
    data = record.get("data") if isinstance(record.get("data"), dict) else {}
    return Scorer(model, tokenizer, encoder_for(data, tokenizer, str(folder)))
