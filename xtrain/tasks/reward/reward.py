"""``reward``: a reward model trained on preference pairs, ``reward.*`` (docs/reward-models.md).

The model is the causal LM's body under a sequence-classification head of one output
(``AutoModelForSequenceClassification``, ``num_labels=1``: transformers' own class for the model, its
weights read from the causal LM's checkpoint, the head made new), pooled as transformers pools
it: the last token that is not padding. LoRA adapts the body and the head trains whole (peft's
``SEQ_CLS``: ``modules_to_save``, saved with the adapter). A new head starts at zero: the
untrained model scores every answer 0, so its reward accuracy is chance (0.5) and its loss ln 2
at step 0, not a random preference it must first unlearn; a checkpoint that is a one-output
classifier already (a reward model of the hub) keeps its head.

Data: preference pairs in every shape preference tuning reads (``rows``), each answer rendered
after its prompt as SFT renders it; the loss is Bradley-Terry with an optional margin and TRL's
centring term (``loss``), per pair, so a step's loss is the mean over its pairs whatever the
split of the batch. Metrics: reward accuracy and the mean margin on held-out pairs. A stage:
it starts from a base model or from an SFT (causal-lm, preference, GRPO) result, whose adapters
go under its head. Its result is run by ``xtrain predict`` (``predict``) and scores GRPO's
completions (``grpo.rewards: model:RUN``, ``scoring.ModelReward``)."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from xtrain.tasks.contract import Curve, FileRows, MainProcessFirst, Predicts, Quickstart, Task
from xtrain.tasks.reward import predict as rm_predict
from xtrain.tasks.reward.scoring import NAME

if TYPE_CHECKING:
    from datasets import Dataset
    from torch.nn import Module
    from transformers import PreTrainedTokenizerBase

    from xtrain.config.schema import TrainConfig
    from xtrain.planning.run import Run
    from xtrain.tasks.contract import Workload
    from xtrain.tasks.data_check import Sample, Tokenizer
    from xtrain.tasks.data_report import DataReport

METRIC = "rewards/accuracy"  # (loss.reduce_tensors' key)
CHANCE = 0.03  # reward accuracy within this of 0.5 after training is "at chance"
CURVES = tuple(
    Curve(title, train=keys, eval=keys)
    for title, keys in (
        ("reward accuracy (0.5 is chance)", (METRIC,)),
        ("reward margin (chosen - rejected)", ("rewards/margin",)),
        ("rewards of the chosen and rejected answers", ("rewards/chosen", "rewards/rejected")),
    )
)
HEADS = ("score", "classifier")  # where transformers' sequence classifiers keep their head


def encoded_sets(
    cfg: TrainConfig,
    tokenizer: PreTrainedTokenizerBase,
    source: str,
    train: Dataset,
    eval_ds: Dataset | None,
    train_name: str,
    eval_name: str,
) -> dict[str, Dataset]:
    """{"train": rows, "eval": rows}: each split's pairs encoded once (``rows.encoding``), for the
    run and the dry run's ``encoding_note``."""
    from xtrain.data.encoded import encode
    from xtrain.data.tokenize import tokenizer_fingerprint
    from xtrain.tasks.reward import rows as rows_

    encoder, key = rows_.encoder_of(cfg, tokenizer, source), tokenizer_fingerprint(tokenizer)
    sets = {}
    for role, ds, name in (("train", train, train_name), ("eval", eval_ds, eval_name)):
        if ds is not None:
            margin = rows_.margin_of(cfg, ds, name)
            encoding = rows_.encoding(ds, name, encoder, margin, key, cfg.data.encode_processes)
            sets[role] = encode(ds, encoding, f"encoding {role}")
    return sets


def zero_new_head(model: Module) -> None:
    """A head the checkpoint did not hold (its architecture is not a sequence classifier: a causal
    LM's) starts at zero, every reward 0 at step 0; a classifier's checkpoint keeps its own."""
    import torch

    if any(str(a).endswith("ForSequenceClassification") for a in model.config.architectures or []):
        return
    for name in HEADS:
        head = getattr(model, name, None)
        if isinstance(head, torch.nn.Linear):
            with torch.no_grad():
                head.weight.zero_()
                if head.bias is not None:
                    head.bias.zero_()


def build(run: Run, main_process_first: MainProcessFirst = contextlib.nullcontext) -> Workload:
    from xtrain.data.collate import PreferenceCollator
    from xtrain.tasks import data_check
    from xtrain.tasks.common import finish_model, load_seeded, pad_multiple, prepare_tokenizer, raw_datasets
    from xtrain.tasks.contract import Workload
    from xtrain.tasks.reward import loss as rl
    from xtrain.tasks.reward.forward import RewardForward, eval_stats

    cfg = run.cfg
    source, tokenizer = prepare_tokenizer(cfg, main_process_first)
    with main_process_first():
        train, eval_ds, train_name, eval_name = raw_datasets(cfg)
        first = data_check.loaded_samples(cfg, [(train, train_name, "train"), (eval_ds, eval_name, "eval")])
        report = inspect(cfg, (source, tokenizer), first, [])  # the data check: its first rows first
        sets = encoded_sets(cfg, tokenizer, source, train, eval_ds, train_name, eval_name)
    model = load_seeded(run, TASK, source, num_labels=1)
    model.config.pad_token_id = tokenizer.pad_token_id  # the pooling reads the last token not padding
    zero_new_head(model)
    model = finish_model(model, cfg, TASK)
    return Workload(
        model=model,
        train_dataset=sets["train"],
        collator=PreferenceCollator(tokenizer.pad_token_id, pad_multiple(run.device)),
        eval_dataset=sets.get("eval"),
        eval_batch=eval_stats,
        reduce_metrics=rl.reduce,
        tokenizer=tokenizer,
        chat=_chat(cfg, tokenizer, source),
        main_metric=METRIC,
        forward=RewardForward(cfg.reward.center_rewards_coefficient),
        notes=notes,
        data_report=report,
        record={"num_labels": 1},  # its head (xtrain export --to merged loads the base with it)
    )


def _chat(cfg: TrainConfig, tokenizer: PreTrainedTokenizerBase, source: str) -> bool:
    from xtrain.tasks.reward import rows as rows_

    return rows_.encoder_of(cfg, tokenizer, source).render is not None


def check_data(cfg: TrainConfig, limit: int) -> DataReport:
    """The data check (``xtrain train --dry-run``): the first rows read and encoded as ``build``
    reads them (a bad row, unpaired rows, a margin that is not a number: their line)."""
    from xtrain.tasks import data_check
    from xtrain.tasks.encoding_check import encoding_note

    found, samples, notes = data_check.text_check(cfg, limit)
    report = inspect(cfg, found, samples, notes)
    if found is not None:
        report.encoding = encoding_note(
            cfg, samples, lambda *sets: encoded_sets(cfg, found[1], found[0], *sets)
        )
    return report


def inspect(cfg: TrainConfig, found: Tokenizer, samples: list[Sample], notes: list[str]) -> DataReport:
    """``check_data``'s report of ``samples`` with ``found`` = (source, tokenizer), or None (the
    rows' shapes only): each pair's longer answer in tokens, and the first pair's chosen answer."""
    from xtrain.data.rows import preference as pref_rows
    from xtrain.tasks import data_check
    from xtrain.tasks.data_report import DataReport
    from xtrain.tasks.reward import rows as rows_

    report = DataReport(NAME, cfg.data.max_length, notes=notes)
    for s in samples:
        rows_.check_paired(s.ds, s.name)
        margin = rows_.margin_of(cfg, s.ds, s.name)
        rows = pref_rows.read_rows(s.ds, s.name)
        check = s.check(row_format="pairs" + (f" with margins ({margin})" if margin else ""))
        report.sources.append(check)
        if found is None:
            continue
        encoder = rows_.encoder_of(cfg, found[1], found[0])
        rows_.columns(s.ds[:], list(range(len(s.ds))), encoder, s.name, rows[0], margin)  # the run's refusals
        for i, row in enumerate(rows):
            where = f"row {i} of {s.name}"
            longest = max(
                len(encoder.encode(row.prompt, a, where)[0]) for a in (row.chosen, row.rejected or "")
            )
            check.lengths.append(longest)
            check.truncated += longest > cfg.data.max_length
        if report.example is None and s.role == "train" and rows:
            ids, labels = encoder.answer(rows[0].prompt, rows[0].chosen, f"row 0 of {s.name}")
            report.example = data_check.example_of(s, 0, found[1], ids, labels)
            report.example.note = (
                "its chosen answer, scored at its last token; the rejected one after the same prompt"
            )
    return report


def notes(history: list[dict[str, float]]) -> list[str]:
    """``Workload.notes``: reward accuracy still at chance after training has run."""
    last = history[-1] if history else {}
    if not last.get("step") or METRIC not in last or abs(last[METRIC] - 0.5) > CHANCE:
        return []
    return [
        f"reward: reward accuracy {last[METRIC]:.2f} at step {int(last['step'])} is chance: the model does "
        "not yet tell chosen from rejected (check that chosen and rejected are not swapped, train longer "
        "or raise optim.lr; docs/reward-models.md#a-broken-run)"
    ]


def stacks(model: Any, cfg: TrainConfig) -> list:
    """The memory estimate's stacks: a pair is two sequences of up to ``data.max_length`` through the
    model's text layers (twice the positions of one, as preference tuning counts a pair)."""
    from dataclasses import replace

    from xtrain.tasks.stacks import text_stacks

    return [replace(s, positions=2 * s.positions) for s in text_stacks(model, cfg)]


def one_output(config: dict[str, Any]) -> bool:
    """``Task.recognizes``: a sequence classifier of one output (a reward model of the hub, saved
    without xtrain's record); a classifier of several labels is seq-cls's."""
    heads = [str(a) for a in config.get("architectures") or []]
    labels = config.get("num_labels", len(config.get("id2label") or {}) or None)
    return any(a.endswith("ForSequenceClassification") for a in heads) and labels == 1


def quickstart_predict_args() -> list[str]:
    """``xtrain predict RUN ...`` after the quickstart: one eval prompt, its two answers scored."""
    from xtrain.builtin import preference as builtin_preference

    row = builtin_preference.preference_examples(1, seed=7)[0]
    return ["--prompt", row["prompt"], "--answer", row["chosen"], "--answer", row["rejected"]]


TASK = Task(
    name=NAME,
    about="preference pairs -> a reward model (a one-output head on a causal LM, Bradley-Terry); "
    "metric: reward accuracy",
    build=build,
    aliases=("reward-model", "rm"),
    keys=frozenset(
        {
            "model.quantization",
            "data.chat_template",
            "reward.margin_column",
            "reward.center_rewards_coefficient",
        }
    ),
    model_class="AutoModelForSequenceClassification",
    starts_from=("AutoModelForCausalLM",),  # an SFT result's adapters go under the head
    peft_task_type="SEQ_CLS",
    curves=CURVES,
    stacks=stacks,
    resume_keys=("reward.margin_column", "reward.center_rewards_coefficient"),
    recognizes=one_output,
    predicts=Predicts(
        takes="--prompt TEXT --answer TEXT",
        load=rm_predict.load,
        run=rm_predict.run,
        file=FileRows(
            rows="preference pairs, or a prompt and an answer a row",
            read=rm_predict.read_file,
            answer=rm_predict.answer_rows,
            score=rm_predict.accuracy,
            averaged=("score", "margin"),  # the mean reward (of each answer of a pair) and margin
        ),
        answers=True,
    ),
    quickstart=Quickstart(
        job="quickstart-reward.yaml",
        about="a reward model: a polite answer style preferred over a curt one",
        next_command="xtrain train examples/reward-model.yaml",
        headline=(
            METRIC,
            "reward accuracy",
            "share of eval pairs whose chosen answer scores higher; 0.5 is chance",
        ),
        predict_args=quickstart_predict_args,
    ),
    check_data=check_data,
)
