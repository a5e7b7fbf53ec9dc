"""Evaluation by generation (image-to-text, speech-to-text, vision-language).

Every process generates for its share of the eval set; the generated ids and the labels are
padded to one length across processes (``pad_across_processes``) and gathered in data order
(``gather_for_metrics``, which drops the duplicated samples of the last batch), so 1 and N
processes score the same predictions. The text metrics come from ``jiwer`` (corpus-level: total
edits / total reference characters or words), not from a hand-written edit distance.

``normalize=True`` (speech-to-text) scores ``normalize_text`` of both sides: lower case,
punctuation removed, whitespace collapsed, the usual convention for ASR word error rates.
Image-to-text scores the text as written (OCR is judged on case and punctuation too).

Decoder-only models (vision-language) set ``prompt_prefix``: the batch then holds the whole
conversation (for the eval loss, labels shifted by one) and the prompt alone under
``gen_input_ids`` / ``gen_attention_mask`` / ... (left-padded, so every prompt ends in the same
column); ``generate`` gets those plus the batch's other inputs (pixel values, image grids), its
output is cut after the prompt, and the references are decoded from ``answer_key``.
``exact_match`` scores the share of answers equal to their reference after ``normalize_text``.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from xtrain.data.collate import IGNORE_INDEX
from xtrain.model.sharding import generate_kwargs
from xtrain.tasks.contract import Prediction

if TYPE_CHECKING:
    from accelerate import Accelerator
    from torch.nn import Module
    from torch.utils.data import DataLoader
    from transformers import PreTrainedTokenizerBase

    from xtrain.tasks.contract import Batch


def normalize_text(text: str) -> str:
    """Lower case, every Unicode punctuation character (categories P*) replaced by a space,
    whitespace collapsed: "Hello, World!" and "hello world" score as the same transcript."""
    text = "".join(" " if unicodedata.category(c).startswith("P") else c for c in text.lower())
    return " ".join(text.split())


def text_metrics(references: list[str], predictions: list[str]) -> dict[str, float]:
    """``cer`` (character error rate) and ``wer`` (word error rate) over the whole set: 0 is
    perfect; above 1 when the predictions hold more wrong characters than the references have."""
    import jiwer

    pairs = [(r, p) for r, p in zip(references, predictions, strict=True) if r.strip()]
    if not pairs:
        return {}
    refs, hyps = [r for r, _ in pairs], [p for _, p in pairs]
    return {"cer": float(jiwer.cer(refs, hyps)), "wer": float(jiwer.wer(refs, hyps))}


def exact_match(references: list[str], predictions: list[str]) -> float:
    """The share of predictions equal to their reference after ``normalize_text`` of both."""
    pairs = list(zip(references, predictions, strict=True))
    hits = sum(normalize_text(r) == normalize_text(p) for r, p in pairs)
    return hits / len(pairs) if pairs else 0.0


def _loss_stats(
    logits: torch.Tensor, labels: torch.Tensor, shift: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per example: summed token cross-entropy and the number of target tokens. An encoder-decoder
    model's logits at position i predict labels[i] (the decoder input is the shifted labels); a
    decoder-only model's predict labels[i + 1] (``shift``)."""
    logits = logits.detach().float()
    labels = labels.to(logits.device)
    if shift:
        logits, labels = logits[:, :-1], labels[:, 1:]
    ce = F.cross_entropy(logits.transpose(1, 2), labels, ignore_index=IGNORE_INDEX, reduction="none")
    return ce.sum(dim=1), (labels != IGNORE_INDEX).sum(dim=1).float()


@dataclass
class GenerationEval:
    """The ``Workload.evaluate`` hook of generative tasks: eval loss, then ``generate`` on the
    model's inputs, decoded and scored against the labels."""

    tokenizer: PreTrainedTokenizerBase
    input_key: str = "pixel_values"  # the batch key ``generate`` takes
    max_new_tokens: int = 128
    num_beams: int = 1
    sample_predictions: int = 4
    generate_kwargs: dict[str, Any] = field(default_factory=dict)  # e.g. Whisper's language/task
    normalize: bool = False  # score normalize_text of both sides (speech-to-text)
    prompt_prefix: str | None = None  # decoder-only: the prompt's inputs are under this prefix
    answer_key: str = "labels"  # the batch key the references are decoded from
    error_rates: bool = True  # cer/wer
    exact_match: bool = False  # normalised exact match (short answers)

    def _inputs(self, batch: Batch) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """(the model's inputs for the loss, the inputs of ``generate``)."""
        if self.prompt_prefix is None:
            return dict(batch), {self.input_key: batch[self.input_key]}
        p = self.prompt_prefix
        prompt = {k[len(p) :]: v for k, v in batch.items() if k.startswith(p)}
        whole = {k: v for k, v in batch.items() if not k.startswith(p) and k != self.answer_key}
        shared = {k: v for k, v in whole.items() if k not in prompt and k != "labels"}
        return whole, {**prompt, **shared}

    def __call__(
        self, accelerator: Accelerator, model: Module, loader: DataLoader
    ) -> tuple[dict[str, float], list[Prediction]]:
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        generator = accelerator.unwrap_model(model, keep_torch_compile=False)
        references: list[str] = []
        predictions: list[str] = []
        loss_sum, count = 0.0, 0.0
        was_training = model.training
        model.eval()
        with torch.no_grad():
            for batch in loader:
                whole, gen_inputs = self._inputs(batch)
                decoder_only = self.prompt_prefix is not None
                if decoder_only:  # batched prompts are padded: generate needs to know with what
                    gen_inputs["pad_token_id"] = pad
                losses, counts = _loss_stats(model(**whole).logits, batch["labels"], shift=decoder_only)
                labels = batch[self.answer_key]
                with accelerator.autocast():
                    generated = generator.generate(
                        **gen_inputs,
                        max_new_tokens=self.max_new_tokens,
                        num_beams=self.num_beams,
                        do_sample=False,
                        **generate_kwargs(accelerator),  # sharded: all ranks step until all are done
                        **self.generate_kwargs,
                    )
                if decoder_only:  # the output repeats the (left-padded) prompt: keep what follows
                    generated = generated[:, gen_inputs["input_ids"].shape[1] :]
                # ranks generate different lengths: pad to one shape before gathering
                generated = accelerator.pad_across_processes(generated.contiguous(), dim=1, pad_index=pad)
                labels = accelerator.pad_across_processes(labels.contiguous(), dim=1, pad_index=IGNORE_INDEX)
                generated, labels, losses, counts = accelerator.gather_for_metrics(
                    (generated, labels, losses, counts)
                )
                loss_sum += float(losses.sum())
                count += float(counts.sum())
                labels = labels.masked_fill(labels == IGNORE_INDEX, pad)
                references += [
                    t.strip() for t in self.tokenizer.batch_decode(labels, skip_special_tokens=True)
                ]
                predictions += [
                    t.strip() for t in self.tokenizer.batch_decode(generated, skip_special_tokens=True)
                ]
        if was_training:
            model.train()
        if not references:
            return {}, []
        scored = (references, predictions)
        if self.normalize:
            scored = ([normalize_text(t) for t in references], [normalize_text(t) for t in predictions])
        metrics = {"eval_loss": loss_sum / max(count, 1.0)}
        if self.error_rates:
            metrics.update(text_metrics(*scored))
        if self.exact_match:
            metrics["exact_match"] = exact_match(references, predictions)
        samples = [
            Prediction(reference=r, prediction=p)
            for r, p in list(zip(references, predictions, strict=True))[: self.sample_predictions]
        ]
        return metrics, samples


def predictions_markdown(samples: list[Prediction]) -> str:
    """A Markdown table of sample predictions (TensorBoard renders text summaries as Markdown)."""

    def cell(text: str) -> str:
        return text.replace("|", "\\|").replace("\n", " ") or " "

    first, second = samples[0].labels if samples else ("reference", "prediction")
    rows = [f"| {first} | {second} |", "|---|---|"]
    rows += [f"| {cell(s.reference)} | {cell(s.prediction)} |" for s in samples]
    return "\n".join(rows)
