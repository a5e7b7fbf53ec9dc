"""``vision-preference``: DPO (and IPO, ORPO, SimPO) on a vision-language model (Qwen2-VL-style
``AutoModelForImageTextToText``), on preference pairs whose prompts hold images
(``xtrain.data.rows.vision_preference``). The model, its processor, LoRA on the language model
and the freezing are vision-language's (``tasks/vision/vision_language.py``); the loss, the reference
(the adapters off, or a frozen copy), the metrics and the warnings are the preference task's
(``tasks/preference/preference.py``, ``reference.py``). Evaluation is forward-only (the reward
metrics); the result is a vision-language model that ``xtrain predict`` runs as vision-language's."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from xtrain.errors import XtrainError
from xtrain.tasks.contract import MainProcessFirst, Quickstart, Task, recognizes_none
from xtrain.tasks.preference import preference
from xtrain.tasks.vision import vision_language

if TYPE_CHECKING:
    import torch

    from xtrain.config.schema import TrainConfig
    from xtrain.data.rows.vision_preference import VisionPreferenceCollator, VisionPreferenceRows
    from xtrain.model.activations import Stack
    from xtrain.planning.run import Run
    from xtrain.tasks.contract import Workload
    from xtrain.tasks.preference.precompute import Precompute
    from xtrain.tasks.preference.reference import PreferenceForward

NAME = "vision-preference"


def build(run: Run, main_process_first: MainProcessFirst = contextlib.nullcontext) -> Workload:
    import copy

    from xtrain.data.rows.vision_preference import VisionPreferenceCollator, vision_pairs
    from xtrain.tasks import common
    from xtrain.tasks.contract import Workload
    from xtrain.tasks.preference import losses as pl
    from xtrain.tasks.preference import reference as ref

    cfg = run.cfg
    d = cfg.data
    settings = preference.settings_of(cfg)
    source, processor, render = vision_language.processor_and_render(cfg, main_process_first)
    with main_process_first():
        train, eval_ds, train_name, eval_name = common.raw_datasets(cfg)
        train_dir, eval_dir = common.media_dirs(cfg, "image")
    tokenizer = processor.tokenizer

    def pairs(ds: object, name: str, folder: object) -> object:
        return vision_pairs(ds, d.images_column, name, folder, render, tokenizer, d.max_image_pixels)

    train_rows = pairs(train, train_name, train_dir)
    eval_rows = pairs(eval_ds, eval_name, eval_dir) if eval_ds is not None else None
    model = common.load_media_model(run, TASK, source)
    vision_language.fix_generation(model, tokenizer)
    frozen = None
    if pl.needs_reference(settings.loss) and not cfg.lora.enabled:  # a full fine-tune: a frozen copy
        frozen = copy.deepcopy(model).requires_grad_(False).eval()
        ref.no_dropout(frozen)
    model = common.finish_model(model, cfg, TASK, vision_language.apply_lora)
    ref.no_dropout(model)
    forward = ref.PreferenceForward(settings, frozen, ref.autocast_for(run))
    collator = VisionPreferenceCollator(processor, d.max_length, common.pad_multiple(run.device))
    return Workload(
        model=model,
        train_dataset=train_rows,
        collator=collator,
        eval_dataset=eval_rows,
        eval_batch=ref.eval_stats,
        reduce_metrics=pl.reduce,
        window_metrics=pl.window_metrics,
        tokenizer=processor,
        main_metric=preference.METRIC,
        forward=forward,
        trained_tokens=pl.sft_tokens if settings.sft_weight else None,  # the SFT term's (token_sum)
        notes=preference.notes,
        shared_pass=_precompute(run, forward, model, train_rows, eval_rows, collator),
    )


def _precompute(
    run: Run,
    forward: PreferenceForward,
    model: torch.nn.Module,
    train: VisionPreferenceRows,
    eval_rows: VisionPreferenceRows | None,
    collator: VisionPreferenceCollator,
) -> Precompute | None:
    """``preference.precompute_reference``: the text task's pass over the rows' keys (their ids,
    labels and image pixel digests: the fingerprint), each pair read and collated as trained;
    the numbers land in the rows' keys, which the rows then carry."""
    from xtrain.data.rows.vision_preference import KeyedCollator
    from xtrain.tasks.preference import losses as pl
    from xtrain.tasks.preference.precompute import Precompute

    if not (run.cfg.preference.precompute_reference and pl.needs_reference(forward.settings.loss)):
        return None
    rows = {"train": train} if eval_rows is None else {"train": train, "eval": eval_rows}
    splits = {name: r.keys(name) for name, r in rows.items()}
    return Precompute(run, forward, model, splits, KeyedCollator(rows, collator))


def stacks(model: torch.nn.Module, cfg: TrainConfig) -> list[Stack]:
    """vision-language's stacks for a pair: both conversations, each with its images, run through
    the vision tower and the language model (twice the positions of one conversation)."""
    from dataclasses import replace

    assert VL.stacks is not None
    return [replace(s, positions=2 * s.positions) for s in VL.stacks(model, cfg)]


def validate(cfg: TrainConfig) -> None:
    preference.validate(cfg)
    vision_language.validate(cfg)
    p = cfg.preference
    if p.loss == "kto":
        raise XtrainError(
            "preference.loss=kto is not available for vision-preference (pairs with images)",
            "use preference.loss dpo, ipo, orpo or simpo",
        )


def _quickstart_inputs() -> list[str]:
    """An eval image of the built-in pairs and its question (``xtrain predict``'s arguments)."""
    return vision_language.quickstart_inputs("builtin:shapes-preference", "prompt")


VL = vision_language.TASK
TASK = Task(
    name=NAME,
    decodes_media=True,
    about="preference pairs with images on a vision-language model (Qwen2-VL): DPO, IPO, ORPO, SimPO; "
    "metric: reward accuracy",
    build=build,
    # vision-language's data and model keys (its generation keys aside: it does not generate)
    keys=frozenset(k for k in VL.keys if not k.startswith("generation."))
    | (preference.TASK.keys - {"data.chat_template"}),
    validate=validate,
    model_class=VL.model_class,
    lora_plan=VL.lora_plan,
    full_fine_tune=VL.full_fine_tune,
    unquantized=VL.unquantized,
    image_tokens=True,
    stacks=stacks,
    curves=preference.CURVES,
    resume_keys=(*VL.resume_keys, "preference.loss"),
    recognizes=recognizes_none,
    predicts=VL.predicts,
    quickstart=Quickstart(
        job="quickstart-vision-preference.yaml",
        about="DPO with images: a whole, right answer preferred over a curt, wrong one",
        next_command="xtrain train examples/vision-preference-dpo.yaml",
        headline=(
            preference.METRIC,
            "reward accuracy",
            "share of pairs whose chosen answer the policy ranks higher; 0.5 is chance",
        ),
        predict_args=_quickstart_inputs,
    ),
)
