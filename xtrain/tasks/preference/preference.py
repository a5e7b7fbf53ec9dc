"""``preference``: preference tuning of a causal LM (DPO, IPO, ORPO, SimPO, KTO), ``preference.*``.

Data: pairs ``{prompt, chosen, rejected}`` (strings, turns, whole conversations sharing their
prefix, LLaMA-Factory's alpaca and sharegpt shapes) or KTO's ``{prompt, completion, label}``
(``xtrain.data.rows.preference``), rendered as SFT renders them (the chat template when there is
one), the prompt masked, one batch of chosen + rejected (``collate.PreferenceCollator``). The loss
is the task's ``Workload.forward`` (``reference``: the policy's log-probs, the
reference's: precomputed, a frozen copy, or the adapters off). Metrics: reward accuracy, rewards
of chosen and rejected, their margin, the policy's log-probs and the gap to the reference, in the
logging window and at eval. The result is a causal LM: ``xtrain predict`` continues prompts as
causal-lm does."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from xtrain.builtin import preference as builtin_preference
from xtrain.errors import XtrainError
from xtrain.tasks import prompt_predict
from xtrain.tasks.contract import (
    Curve,
    FileRows,
    MainProcessFirst,
    Predicts,
    Quickstart,
    Task,
    recognizes_none,
)
from xtrain.tasks.preference import predict_file
from xtrain.tasks.text.causal_lm import load_for_predict

if TYPE_CHECKING:
    from datasets import Dataset
    from torch.nn import Module
    from transformers import PreTrainedTokenizerBase

    from xtrain.config.schema import TrainConfig
    from xtrain.data.rows.preference import Encoder
    from xtrain.model.activations import Stack
    from xtrain.planning.run import Run
    from xtrain.tasks.contract import Workload
    from xtrain.tasks.data_check import Sample, Tokenizer
    from xtrain.tasks.data_report import DataReport
    from xtrain.tasks.preference.losses import LossSettings

NAME = "preference"
METRIC = "rewards/accuracy"
CHANCE = 0.03  # reward accuracy within this of 0.5 after training is "at chance"
MATCH = "greedy/match"  # evaluation.MATCH: the share of eval prompts answered with the chosen answer
# what a preference run's users watch, in training (the window's) and at evaluations (losses.reduce)
CURVES = tuple(
    Curve(title, train=keys, eval=keys)
    for title, keys in (
        ("reward accuracy (0.5 is chance)", (METRIC,)),
        ("reward margin (chosen - rejected)", ("rewards/margin",)),
        ("rewards of the chosen and rejected answers", ("rewards/chosen", "rewards/rejected")),
        ("log-probabilities of the chosen and rejected answers", ("logps/chosen", "logps/rejected")),
        ("chosen answers' NLL per token", ("nll/chosen",)),
        ("KL (KTO's reference point)", ("kl",)),
        ("greedy answers matching the chosen one (share)", (MATCH,)),
    )
)
CHOSEN_FALL = 1.0  # nats: the chosen answers' mean summed log-prob falling more is "falling" (e times)


def settings_of(cfg: TrainConfig) -> LossSettings:
    from xtrain.tasks.preference.losses import LossSettings

    p = cfg.preference
    return LossSettings(
        p.loss,
        p.beta,
        p.orpo_lambda,
        p.gamma,
        p.label_smoothing,
        p.desirable_weight,
        p.undesirable_weight,
        p.sft_weight,
    )


def encoder_of(cfg: TrainConfig, tokenizer: PreTrainedTokenizerBase, source: str) -> Encoder:
    """Answers rendered as SFT renders them: the chat template (``data.chat_template`` or the
    tokenizer's) when there is one, else prompt and answer as plain text."""
    from xtrain.data.rows import chat as chat_data
    from xtrain.data.rows.preference import Encoder
    from xtrain.tasks.text.rows import chat_render

    template = chat_data.load_template(cfg.data.chat_template) or getattr(tokenizer, "chat_template", None)
    render = chat_render(cfg, tokenizer, source, "messages") if template else None
    return Encoder(tokenizer, cfg.data.max_length, render)


def encoded(
    ds: Dataset, name: str, encoder: Encoder, loss: str, tokenizer_key: str, processes: int | None = None
) -> Dataset:
    """A data set's rows read, checked and encoded for ``loss`` (pairs become KTO rows for kto),
    once (``encoded.encode``: cached, in parallel on a first run)."""
    from xtrain.data.encoded import encode
    from xtrain.data.rows import preference as rows_
    from xtrain.tasks.preference.losses import UNPAIRED

    unpaired = rows_.read_row(dict(ds[0]), 0, name).rejected is None
    if unpaired and loss not in UNPAIRED:
        raise XtrainError(
            f"{name} holds unpaired {{prompt, completion, label}} rows; preference.loss={loss} needs pairs",
            "set preference.loss=kto, or give {prompt, chosen, rejected} rows",
        )
    encoding = rows_.encoding(ds, name, encoder, loss in UNPAIRED, tokenizer_key, processes)
    return encode(ds, encoding, f"encoding {name}")


def encoded_sets(
    cfg: TrainConfig,
    tokenizer: PreTrainedTokenizerBase,
    source: str,
    train: Dataset,
    eval_ds: Dataset | None,
    train_name: str,
    eval_name: str,
) -> dict[str, Dataset]:
    """{"train": rows, "eval": rows}: each split encoded (``encoded``), for the run and the dry
    run's ``encoding_note``."""
    from xtrain.data.tokenize import tokenizer_fingerprint

    encoder, key = encoder_of(cfg, tokenizer, source), tokenizer_fingerprint(tokenizer)
    loss, processes = cfg.preference.loss, cfg.data.encode_processes
    sets = {"train": encoded(train, train_name, encoder, loss, key, processes)}
    if eval_ds is not None:
        sets["eval"] = encoded(eval_ds, eval_name, encoder, loss, key, processes)
    return sets


def build(run: Run, main_process_first: MainProcessFirst = contextlib.nullcontext) -> Workload:
    import copy

    from xtrain.data.collate import PreferenceCollator
    from xtrain.data.encoded import WithNumbers
    from xtrain.data.rows.preference import PAIRED_PARTS, UNPAIRED_PARTS
    from xtrain.tasks import data_check
    from xtrain.tasks.common import finish_model, load_seeded, pad_multiple, prepare_tokenizer, raw_datasets
    from xtrain.tasks.contract import Workload
    from xtrain.tasks.preference import losses as pl
    from xtrain.tasks.preference import reference as ref
    from xtrain.tasks.preference.evaluation import PreferenceEval
    from xtrain.tasks.preference.precompute import Precompute

    cfg = run.cfg
    settings = settings_of(cfg)
    source, tokenizer = prepare_tokenizer(cfg, main_process_first)
    with main_process_first():
        train, eval_ds, train_name, eval_name = raw_datasets(cfg)
        first = data_check.loaded_samples(cfg, [(train, train_name, "train"), (eval_ds, eval_name, "eval")])
        report = inspect(cfg, (source, tokenizer), first, [])  # the data check: its first rows first
        sets = encoded_sets(cfg, tokenizer, source, train, eval_ds, train_name, eval_name)
        splits = {name: WithNumbers(rows) for name, rows in sets.items()}

    model = load_seeded(run, TASK, source)
    if getattr(model.config, "pad_token_id", None) is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    frozen = None
    if pl.needs_reference(settings.loss) and not cfg.lora.enabled:  # a full fine-tune: a frozen copy
        frozen = copy.deepcopy(model).requires_grad_(False).eval()
        ref.no_dropout(frozen)
    model = finish_model(model, cfg, TASK)
    ref.no_dropout(model)
    forward = ref.PreferenceForward(settings, frozen, ref.autocast_for(run))
    parts = UNPAIRED_PARTS if settings.loss in pl.UNPAIRED else PAIRED_PARTS
    collator = PreferenceCollator(tokenizer.pad_token_id, pad_multiple(run.device), parts)
    precompute = None  # the loop runs it on every process after the build (precompute)
    if cfg.preference.precompute_reference and pl.needs_reference(settings.loss):
        precompute = Precompute(run, forward, model, splits, collator)
    return Workload(
        model=model,
        train_dataset=splits["train"],
        collator=collator,
        eval_dataset=splits.get("eval"),
        eval_batch=ref.eval_stats,
        reduce_metrics=pl.reduce,
        window_metrics=pl.window_metrics,
        tokenizer=tokenizer,
        chat=encoder_of(cfg, tokenizer, source).render is not None,
        main_metric=METRIC,
        forward=forward,
        trained_tokens=pl.sft_tokens if settings.sft_weight else None,  # the SFT term's (token_sum)
        notes=notes,
        evaluate=PreferenceEval(forward, splits["eval"], tokenizer, parts[0]) if "eval" in splits else None,
        data_report=report,
        step_start=forward.step_start if settings.loss in pl.UNPAIRED else None,
        shared_pass=precompute,
        use_chunked_loss=forward.use_chunked_loss,
    )


def check_data(cfg: TrainConfig, limit: int) -> DataReport:
    """The data check (``xtrain train --dry-run``): the first rows read and encoded as ``build``
    reads them (a bad row raises its line), their longest answer's tokens before the cut, and
    the first pair's chosen answer as the model gets it (without a tokenizer: the rows only)."""
    from xtrain.tasks import data_check
    from xtrain.tasks.encoding_check import encoding_note

    found, samples, notes = data_check.text_check(cfg, limit)
    report = inspect(cfg, found, samples, notes)
    if found is not None:
        note = encoding_note(cfg, samples, lambda *sets: encoded_sets(cfg, found[1], found[0], *sets))
        report.encoding = note
    return report


def inspect(cfg: TrainConfig, found: Tokenizer, samples: list[Sample], notes: list[str]) -> DataReport:
    """``check_data``'s report of ``samples`` with ``found`` = (source, tokenizer), or None: the
    rows' shapes only. ``build`` runs it on the first rows it loaded (``Workload.data_report``)."""
    from xtrain.data.rows import preference as rows_
    from xtrain.tasks import data_check
    from xtrain.tasks.data_report import DataReport

    report = DataReport(NAME, cfg.data.max_length, notes=notes)
    for s in samples:
        rows = rows_.read_rows(s.ds, s.name)
        shape = "unpaired (KTO)" if rows_.is_unpaired(rows) else "pairs"
        check = s.check(row_format=shape)
        report.sources.append(check)
        if found is None:
            continue
        encoder = encoder_of(cfg, found[1], found[0])
        encoded(s.ds, s.name, encoder, cfg.preference.loss, "")  # the run's refusals (in memory: no cache)
        for i, row in enumerate(rows):
            answers = [a for a in (row.chosen, row.rejected) if a is not None]
            longest = max(len(encoder.encode(row.prompt, a, f"row {i} of {s.name}")[0]) for a in answers)
            check.lengths.append(longest)
            check.truncated += longest > cfg.data.max_length
        if report.example is None and s.role == "train" and rows:
            ids, labels = encoder.answer(rows[0].prompt, rows[0].chosen, f"row 0 of {s.name}")
            report.example = data_check.example_of(s, 0, found[1], ids, labels)
            report.example.note = "its chosen answer; the rejected one follows the same prompt tokens"
    return report


def notes(history: list[dict[str, float]]) -> list[str]:
    """The warnings of a broken run, read off the evaluations (``Workload.notes``): reward
    accuracy still at chance after training; both rewards fallen since the previous evaluation
    without the margin growing (the policy pushing both answers down); the reward accuracy risen
    (or held) above chance while the greedy answers that equal the chosen one became fewer or the
    chosen answers' log-probs fell (``unlearning``). Pure: the eval history in, lines out."""
    last = history[-1] if history else {}
    if not last.get("step") or METRIC not in last:
        return []
    out = []
    step, accuracy = int(last["step"]), last[METRIC]
    if abs(accuracy - 0.5) <= CHANCE:
        out.append(
            f"preference: reward accuracy {accuracy:.2f} at step {step} is chance: the policy does not "
            "yet tell chosen from rejected (check that chosen and rejected are not swapped, raise "
            "optim.lr or preference.beta; docs/preference.md#a-broken-run)"
        )
    prev = history[-2] if len(history) > 1 else None
    if prev is not None and "rewards/chosen" in prev:
        fell = (
            last["rewards/chosen"] < prev["rewards/chosen"]
            and last["rewards/rejected"] < prev["rewards/rejected"]
        )
        if fell and last["rewards/margin"] <= prev["rewards/margin"]:
            out.append(
                f"preference: both rewards fell from step {int(prev['step'])} to {step} (chosen "
                f"{last['rewards/chosen']:+.3f}, rejected {last['rewards/rejected']:+.3f}) and the margin "
                "did not grow: the policy is pushing both answers down (docs/preference.md#a-broken-run)"
            )
    if prev is not None:
        out += unlearning(prev, last)
    return out


def unlearning(prev: dict[str, float], last: dict[str, float]) -> list[str]:
    """The warning of a run that learns the preference by losing the chosen answers (DPO's known
    failure at a high lr): between two evaluations the reward accuracy rose or held above chance
    while the share of greedy answers equal to the chosen one fell or the chosen answers' log-probs
    fell by more than ``CHOSEN_FALL``."""
    if METRIC not in prev or last[METRIC] < prev[METRIC] or last[METRIC] <= 0.5 + CHANCE:
        return []
    lost = []
    if MATCH in prev and MATCH in last and last[MATCH] < prev[MATCH]:
        said = f"{prev[MATCH]:.2f} to {last[MATCH]:.2f}"
        lost.append(f"the share of greedy answers equal to the chosen one fell from {said}")
    key = "logps/chosen"
    if key in prev and key in last and last[key] < prev[key] - CHOSEN_FALL:
        lost.append(f"the chosen answers' log-prob fell from {prev[key]:.1f} to {last[key]:.1f}")
    if not lost:
        return []
    return [
        f"preference: reward accuracy {prev[METRIC]:.2f} -> {last[METRIC]:.2f} from step {int(prev['step'])} "
        f"to {int(last['step'])}, but {' and '.join(lost)}: the policy learns the preference by unlearning "
        "the answers it should keep (set preference.sft_weight, e.g. 1.0, or lower optim.lr; "
        "docs/preference.md#a-broken-run)"
    ]


def validate(cfg: TrainConfig) -> None:
    p = cfg.preference
    if p.precompute_reference and p.loss in ("orpo", "simpo"):
        raise XtrainError(
            f"preference.precompute_reference: preference.loss={p.loss} uses no reference model",
            "leave preference.precompute_reference unset for orpo and simpo",
        )
    if p.label_smoothing >= 0.5:
        raise XtrainError(
            f"preference.label_smoothing={p.label_smoothing}: from 0.5 on, rejected counts as preferred",
            "use a number below 0.5 (the share of pairs thought mislabelled, e.g. 0.1)",
        )
    if p.sft_weight and p.loss == "orpo":
        raise XtrainError(
            "preference.sft_weight: orpo's loss holds the chosen answers' NLL already "
            "(NLL + orpo_lambda x odds ratio)",
            "leave preference.sft_weight unset; lower preference.orpo_lambda to weigh the NLL more",
        )
    if p.label_smoothing and p.loss not in ("dpo", "simpo"):
        raise XtrainError(
            f"preference.label_smoothing is for the dpo and simpo losses, not {p.loss}",
            "leave preference.label_smoothing unset",
        )


def stacks(model: Module, cfg: TrainConfig) -> list[Stack]:
    """The memory estimate's stacks: a sample is a pair, two sequences of up to ``data.max_length``
    through the model's text layers (twice the positions of one: an upper bound for eager
    attention's scores, which grow with each sequence's square). The reference's forward keeps
    no activations (no gradients)."""
    from dataclasses import replace

    from xtrain.tasks.stacks import text_stacks

    return [replace(s, positions=2 * s.positions) for s in text_stacks(model, cfg)]


TASK = Task(
    name=NAME,
    about="preference pairs (or KTO's labelled completions) on a causal LM: DPO, IPO, ORPO, SimPO, KTO; "
    "metric: reward accuracy",
    build=build,
    aliases=("preference-tuning",),
    keys=frozenset(
        {
            "model.quantization",
            "model.chunked_loss",
            "data.chat_template",
            "preference.loss",
            "preference.beta",
            "preference.orpo_lambda",
            "preference.gamma",
            "preference.label_smoothing",
            "preference.desirable_weight",
            "preference.undesirable_weight",
            "preference.precompute_reference",
            "preference.sft_weight",
        }
    ),
    validate=validate,
    model_class="AutoModelForCausalLM",
    peft_task_type="CAUSAL_LM",
    token_loss="sequence",  # its forward's log-probs chunk-wise (preference_reference.PreferenceForward)
    sequence_parallel=True,  # parallel.sequence: its sequences split across processes
    curves=CURVES,
    stacks=stacks,
    resume_keys=("preference.loss",),
    recognizes=recognizes_none,
    predicts=Predicts(
        takes="--prompt TEXT",
        load=load_for_predict,
        run=prompt_predict.text_predict,
        file=FileRows(
            rows="its pairs (the prompt answered, the chosen answer the reference), or chat and prompt "
            "rows as causal-lm reads them",
            read=predict_file.read_file,
            answer=prompt_predict.text_answer,
            score=prompt_predict.text_score,
        ),
        samples=True,
        chat=prompt_predict.chat_reply,
    ),
    quickstart=Quickstart(
        job="quickstart-preference.yaml",
        about="DPO: a polite answer style preferred over a curt one",
        next_command="xtrain train examples/preference-dpo.yaml",
        headline=(
            METRIC,
            "reward accuracy",
            "share of pairs whose chosen answer the policy ranks higher; 0.5 is chance",
        ),
        predict_args=builtin_preference.quickstart_predict_args,
        samples=("chosen answer", "the model's greedy answer after training"),
        samples_metric=(MATCH, "greedy answers equal to the chosen one (share of the first 64 eval prompts)"),
    ),
    check_data=check_data,
)
