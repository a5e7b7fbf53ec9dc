"""A model to score, as lm-evaluation-harness loads it (``Scored``: plain data, sent to every
process of ``xtrain eval``): read from a ``Start`` (``model/start.py``: a result's files, never its
weights), as ``xtrain predict`` and ``export`` read a result.

- a base model or a whole model (a full fine-tune, a merged folder): lm-eval's ``hf`` model with
  ``pretrained`` that folder (or hub id);
- a result with one adapter: the base as ``pretrained`` and the adapter as lm-eval's ``peft``;
- a chain of adapters: its one-adapter form (``adapter-chain/``, written beside a chained result
  where the adapters concatenate exactly) as ``peft``, else the merged model its run saved instead;
- a GGUF file: llama.cpp's own server (``xllamacpp``), scored through lm-eval's OpenAI-style
  ``local-completions`` / ``local-chat-completions`` models (``gguf.py``).

Each adapter is checked against the hash its record names before anything loads (a file replaced
since its run wrote it is one line). The tokenizer is the result's own (its chat template the one
it trained with); ``chat`` says whether prompts go through it (lm-eval's ``apply_chat_template``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from xtrain.errors import XtrainError
from xtrain.model import chain_adapter
from xtrain.model.load import resolve_model
from xtrain.model.start import ADAPTER_CONFIG, OUTPUT_FOLDERS, Start, check_unchanged

HF, GGUF = "hf", "gguf"  # how a model is scored: transformers in lm-eval, or llama.cpp's server
MERGED = "merged"  # the folder a chained run saves when its adapters do not concatenate exactly


@dataclass(frozen=True)
class Scored:
    """One model to score: its column's ``label``, what lm-eval loads (``pretrained``, ``peft``,
    ``tokenizer``), whether prompts go through the chat template (``chat``, with the run's
    ``chat_kwargs``), a quantized run's base loading (``quantization``), the run folder its
    scores are saved in (``saved_in``; None: a base model), and ``what`` it is in a few words."""

    label: str
    pretrained: str
    peft: str | None = None
    tokenizer: str | None = None
    chat: bool = False
    chat_kwargs: dict[str, Any] | None = None
    quantization: str | None = None
    saved_in: str | None = None
    what: str = "model"
    kind: str = HF

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Scored:
        return cls(**data)

    def model_args(self, dtype: str) -> dict[str, Any]:
        """lm-eval's ``hf`` model arguments (a quantized base's ``quantization_config`` is added
        where it loads: ``worker``)."""
        args: dict[str, Any] = {"pretrained": self.pretrained, "dtype": dtype, "trust_remote_code": False}
        if self.peft is not None:
            args["peft"] = self.peft
        if self.tokenizer is not None:
            args["tokenizer"] = self.tokenizer
        if self.chat and self.chat_kwargs:
            args["chat_template_args"] = dict(self.chat_kwargs)
        return args

    def like(self, other: Scored) -> Scored:
        """This model prompted as ``other`` is: its tokenizer and chat setting (the base of a
        result, scored as the result is, so the change between them is the training's)."""
        tokenizer = other.tokenizer if other.tokenizer is not None else self.tokenizer
        return Scored(
            self.label, self.pretrained, self.peft, tokenizer, other.chat, other.chat_kwargs,
            self.quantization, self.saved_in, self.what, self.kind,
        )  # fmt: skip


def run_folder(folder: Path) -> Path:
    """The run a result folder belongs to (its ``adapter/``, ``model/``, ``merged/``, ``best/``:
    the run; anything else: itself)."""
    return folder.parent if folder.name in OUTPUT_FOLDERS else folder


def of_start(
    start: Start,
    label: str,
    *,
    chat: bool,
    chat_kwargs: dict[str, Any] | None = None,
    saved_in: str | None = None,
) -> Scored:
    """``start`` as lm-eval loads it (the module's list); its adapters checked against their
    record first. A chain with neither its one-adapter form nor a merged folder is one line."""
    for adapter in start.adapters:
        check_unchanged(adapter)
    if not start.adapters:
        source = resolve_model(start.base)
        what = "whole model" if start.result else "model"
        return Scored(label, source, None, None, chat, chat_kwargs, None, saved_in, what)
    base, last = resolve_model(start.base), Path(start.adapters[-1].path)
    tokenizer = start.tokenizer or base
    if len(start.adapters) == 1:
        return Scored(
            label,
            base,
            str(last),
            tokenizer,
            chat,
            chat_kwargs,
            start.quantization,
            saved_in,
            "base + adapter",
        )
    n, run = len(start.adapters), run_folder(last)
    single = run / chain_adapter.FOLDER
    if (single / ADAPTER_CONFIG).is_file():
        what = f"{n} adapters as one ({chain_adapter.FOLDER}/)"
        return Scored(
            label, base, str(single), str(single), chat, chat_kwargs, start.quantization, saved_in, what
        )
    merged = run / MERGED
    if (merged / "config.json").is_file():
        what = f"{n} adapters merged ({MERGED}/)"
        return Scored(label, str(merged), None, str(merged), chat, chat_kwargs, None, saved_in, what)
    raise XtrainError(
        f"{last} is a chain of {n} adapters, and its run saved neither {chain_adapter.FOLDER}/ nor {MERGED}/",
        f"xtrain export {run} --to merged, then score the merged folder",
    )


def base_of(start: Start) -> str | None:
    """The model a result's chain began from (None: ``start`` is a base model): the base its first
    stage's record names (the base its adapters go on, or where that stage trained the whole
    model, the model it started from), else the base ``start`` loads."""
    from xtrain.model.start import BASE, RUN_FILE, model_folder, read_json_object

    if not start.result:
        return None
    source = start.lineage[0].get("source") if start.lineage else None
    if isinstance(source, str) and Path(source).is_dir():
        try:
            first = read_json_object(model_folder(source) / RUN_FILE).get(BASE)
        except XtrainError:  # the first stage's folder holds no result any more
            first = None
        if isinstance(first, str) and first:
            return first
    return start.base
