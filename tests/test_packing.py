"""data.packing for causal-lm: whole examples packed into padding-free rows whose position_ids
restart per example, so no example attends to another (the same per-example loss as unpacked, with
eager and sdpa), the first token of each example not predicted from the previous one, loss still
only on responses and assistant turns, deterministic rows, tokens counted without a mask, exact
resume; the old concatenation only as data.packing=concatenate."""

from __future__ import annotations

import json
import os
import pickle
import signal
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from support.workloads import build_workload

from xtrain import builtin
from xtrain.data.collate import IGNORE_INDEX, PackedCollator, PadCollator, batch_tokens
from xtrain.data.packing import pack_rows
from xtrain.errors import XtrainError
from xtrain.tasks.validation import load_config

pytestmark = pytest.mark.usefixtures("private_caches")  # conftest: one offline cache for the session

STORIES = [r["text"] for r in builtin.story_examples(24, seed=5)]


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _cfg(train: Path, *extra: str):
    base = ["model.name_or_path=builtin:tiny-llama", "model.task=causal-lm", f"data.train={train}"]
    return load_config(None, [*base, "data.eval=null", "data.max_length=128", *extra])


def _examples(lengths: list[int], seed: int = 0, prompt: int = 0) -> list[dict[str, list[int]]]:
    g = torch.Generator().manual_seed(seed)
    rows = []
    for n in lengths:
        ids = torch.randint(3, 200, (n,), generator=g).tolist()
        rows.append(
            {"input_ids": ids, "labels": [IGNORE_INDEX] * min(prompt, n - 1) + ids[min(prompt, n - 1) :]}
        )
    return rows


# -- the packed rows -------------------------------------------------------------------------------


def test_pack_rows_fits_whole_examples_and_restarts_positions() -> None:
    rows = _examples([30, 5, 17, 12, 40, 3, 25, 9])
    packed = pack_rows(rows, 48)
    assert all(len(r["input_ids"]) <= 48 for r in packed)
    assert sum(len(r["input_ids"]) for r in packed) == sum(len(r["input_ids"]) for r in rows)
    assert len(packed) == 3  # first-fit decreasing: 141 tokens in 3 rows of 48 (40+5+3, 30+17, 25+12+9)
    seen = []
    for r in packed:
        assert len(r["input_ids"]) == len(r["labels"]) == len(r["position_ids"])
        starts = [i for i, p in enumerate(r["position_ids"]) if p == 0]
        bounds = [*starts, len(r["input_ids"])]
        for a, b in zip(bounds, bounds[1:], strict=False):
            assert r["position_ids"][a:b] == list(range(b - a))
            assert r["labels"][a] == IGNORE_INDEX  # not predicted from the previous example
            seen.append(r["input_ids"][a:b])
    assert sorted(map(tuple, seen)) == sorted(tuple(r["input_ids"]) for r in rows)  # each once, whole
    assert pack_rows(rows, 48) == packed  # a pure function: every process, every resume


def test_packed_collator_makes_one_padding_free_row() -> None:
    packed = pack_rows(_examples([10, 6, 7]), 16)
    batch = PackedCollator(0)(packed)
    n = sum(len(r["input_ids"]) for r in packed)
    assert batch["input_ids"].shape == batch["labels"].shape == batch["position_ids"].shape == (1, n)
    assert "attention_mask" not in batch and batch["use_cache"] is False
    assert pickle.loads(pickle.dumps(PackedCollator(0))).pad.pad_token_id == 0  # spawned DataLoader workers
    assert int(batch_tokens(batch, "attention_mask")) == n  # tokens/s counts every id: no padding
    unpacked = [{**r, "attention_mask": [1] * len(r["input_ids"])} for r in _examples([4, 2])]
    padded = PackedCollator(0)(unpacked)  # the eval rows: padded as PadCollator does
    assert torch.equal(padded["input_ids"], PadCollator(0)(unpacked)["input_ids"])
    assert int(batch_tokens(padded, "attention_mask").sum()) == 6


# -- the same loss as unpacked ----------------------------------------------------------------------


def _tiny_llama(attn: str) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=200, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, attn_implementation=attn,
    )  # fmt: skip
    return LlamaForCausalLM(config).train()  # training mode (no dropout in llama's config)


def _token_losses(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-position next-token loss (0 where the label is ignored), as the model's loss shifts."""
    return F.cross_entropy(logits[0, :-1].float(), labels[0, 1:], ignore_index=IGNORE_INDEX, reduction="none")


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_a_packed_batch_gives_each_example_its_unpacked_loss(attn: str) -> None:
    model = _tiny_llama(attn)
    examples = _examples([23, 9, 31, 4, 17, 12], seed=1, prompt=3)  # prompts masked, as prompt/response
    packed = pack_rows(examples, 64)
    assert any(len(r["position_ids"]) > r["position_ids"][-1] + 1 for r in packed)  # rows do hold several
    batch = PackedCollator(0)(packed)
    out = model(**batch)
    losses = _token_losses(out.logits, batch["labels"])
    starts = (batch["position_ids"][0] == 0).nonzero().flatten().tolist() + [batch["input_ids"].shape[1]]
    packed_sums = {}
    for a, b in zip(starts, starts[1:], strict=False):
        ids = tuple(batch["input_ids"][0, a:b].tolist())
        packed_sums[ids] = losses[a : b - 1].sum()  # position b-1 predicts the next example: ignored
        if b - 1 < len(losses):
            assert float(losses[b - 1]) == 0.0
    for ex in examples:
        one = torch.tensor([ex["input_ids"]])
        alone = _token_losses(model(input_ids=one).logits, torch.tensor([ex["labels"]])).sum()
        torch.testing.assert_close(packed_sums[tuple(ex["input_ids"])], alone, rtol=1e-5, atol=1e-5)
    # the model's own mean loss is the mean over the examples' target tokens, as unpacked
    targets = sum(sum(t != IGNORE_INDEX for t in ex["labels"][1:]) for ex in examples)
    assert float(out.loss) == pytest.approx(float(sum(packed_sums.values())) / targets, rel=1e-5)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_without_use_cache_false_transformers_lets_examples_see_each_other(attn: str) -> None:
    """Why the packed batch carries use_cache=False: transformers 5.24 builds the packed mask only
    without a cache, and a training forward makes one whenever config.use_cache is true."""
    model = _tiny_llama(attn)
    examples = _examples([12, 8], seed=2)
    batch = PackedCollator(0)(pack_rows(examples, 32))
    second = slice(12, 19)  # the second example's targets (a row keeps its examples in input order)
    apart = _token_losses(model(**batch).logits, batch["labels"])[second]
    leaky = _token_losses(model(**{**batch, "use_cache": True}).logits, batch["labels"])[second]
    assert not torch.allclose(apart, leaky)


# -- the causal-lm workload ---------------------------------------------------------------------------


def test_packing_true_packs_whole_stories_and_keeps_eval_rows_whole(tmp_path: Path) -> None:
    train = _jsonl(tmp_path / "s.jsonl", [{"text": t} for t in STORIES])
    plain = build_workload(_cfg(train))
    cfg = _cfg(train, "data.packing=true", f"data.eval={train}")
    assert cfg.data.packing == "on"
    packed = build_workload(cfg)
    rows = packed.train_dataset
    assert len(rows) < len(plain.train_dataset) and all(len(r["input_ids"]) <= 128 for r in rows)
    stories = {tuple(r["input_ids"]) for r in plain.train_dataset}
    for r in rows:
        starts = [i for i, p in enumerate(r["position_ids"]) if p == 0] + [len(r["input_ids"])]
        assert {tuple(r["input_ids"][a:b]) for a, b in zip(starts, starts[1:], strict=False)} <= stories
    assert sum(len(r["input_ids"]) for r in rows) == sum(len(r["input_ids"]) for r in plain.train_dataset)
    assert len(packed.eval_dataset) == len(STORIES) and "position_ids" not in packed.eval_dataset[0]
    batch = packed.collator([rows[0], rows[1]])
    assert batch["input_ids"].shape[0] == 1 and torch.isfinite(packed.model(**batch).loss)
    # end to end: the summed loss over the training set is the unpacked one (same seeded model)
    assert _summed_loss(packed, 3) == pytest.approx(_summed_loss(plain, 1), rel=1e-4)


def _summed_loss(workload, per_batch: int) -> float:
    """Sum of every target token's loss over the training set, ``per_batch`` rows a batch."""
    workload.model.eval()  # LoRA dropout off: the same function for both workloads
    ds, total = workload.train_dataset, 0.0
    with torch.no_grad():
        for i in range(0, len(ds), per_batch):
            batch = workload.collator([ds[j] for j in range(i, min(i + per_batch, len(ds)))])
            logits = workload.model(**batch).logits[:, :-1].float()
            total += float(F.cross_entropy(logits.transpose(1, 2), batch["labels"][:, 1:], reduction="sum"))
    return total


def test_prompt_response_packed_learns_the_responses_only(tmp_path: Path) -> None:
    pairs = [{"q": f"question {i}: " + "word " * (i % 5), "a": f" answer {i}"} for i in range(12)]
    extra = ("data.prompt_column=q", "data.response_column=a")
    train = _jsonl(tmp_path / "qa.jsonl", pairs)
    plain = build_workload(_cfg(train, *extra))
    packed = build_workload(_cfg(train, *extra, "data.packing=true"))
    tok = packed.tokenizer

    def learned(rows) -> list[str]:
        return sorted(tok.decode([t for t in r["labels"][i:j] if t != IGNORE_INDEX])
                      for r in rows for i, j in _spans(r))  # fmt: skip

    assert learned(packed.train_dataset) == learned(
        {"labels": r["labels"], "input_ids": r["input_ids"], "position_ids": list(range(len(r["input_ids"])))}
        for r in plain.train_dataset
    )
    assert all(a["a"].strip() in " ".join(learned(packed.train_dataset)) for a in pairs)


def _spans(row: dict) -> list[tuple[int, int]]:
    starts = [i for i, p in enumerate(row["position_ids"]) if p == 0] + [len(row["input_ids"])]
    return list(zip(starts, starts[1:], strict=False))


TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}{{ eos_token }}{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def test_chat_packs_and_learns_the_assistant_turns_only(tmp_path: Path) -> None:
    convs = [
        [{"role": "user", "content": f"hi {i}"}, {"role": "assistant", "content": f"hello {i}"}]
        + (
            [{"role": "user", "content": "more"}, {"role": "assistant", "content": f"sure {i}"}]
            if i % 2
            else []
        )
        for i in range(10)
    ]
    train = tmp_path / "c.jsonl"
    train.write_text("".join(json.dumps({"messages": m}) + "\n" for m in convs), encoding="utf-8")
    cfg = _cfg(train, f"data.chat_template={TEMPLATE}", "data.packing=true", "data.max_length=64")
    workload = build_workload(cfg)
    tok = workload.tokenizer
    assert workload.chat and len(workload.train_dataset) < len(convs)
    got = sorted(
        tok.decode([t for t in r["labels"][i:j] if t != IGNORE_INDEX])
        for r in workload.train_dataset
        for i, j in _spans(r)
    )
    unpacked = build_workload(_cfg(train, f"data.chat_template={TEMPLATE}", "data.max_length=64"))
    want = sorted(tok.decode([t for t in r["labels"] if t != IGNORE_INDEX]) for r in unpacked.train_dataset)
    assert len(want) == len(convs) and all(w.endswith(f"{i % 10}{tok.eos_token}") for i, w in enumerate(want))
    assert got == want
    batch = workload.collator([workload.train_dataset[i] for i in range(2)])
    assert torch.isfinite(workload.model(**batch).loss)
    with pytest.raises(XtrainError, match="data.packing=concatenate would cut conversations mid-turn"):
        build_workload(_cfg(train, f"data.chat_template={TEMPLATE}", "data.packing=concatenate"))


def test_concatenate_is_the_old_blocks(tmp_path: Path) -> None:
    train = _jsonl(tmp_path / "s.jsonl", [{"text": t} for t in STORIES])
    plain = build_workload(_cfg(train, "data.max_length=512"))
    blocks = build_workload(_cfg(train, "data.packing=concatenate", "data.max_length=32"))
    lengths = [len(r["input_ids"]) for r in blocks.train_dataset]
    assert all(n == 32 for n in lengths[:-1])
    flat = [t for r in plain.train_dataset for t in r["input_ids"]]
    assert [t for r in blocks.train_dataset for t in r["input_ids"]] == flat
    assert isinstance(blocks.collator, PadCollator) and "position_ids" not in blocks.train_dataset[0]


def test_a_model_that_cannot_keep_examples_apart_is_refused() -> None:
    from xtrain.tasks.text.causal_lm import check_packs_apart

    class Recurrent(torch.nn.Module):  # a module without transformers' position_ids masks
        config = None

    with pytest.raises(XtrainError, match="data.packing=on cannot keep packed examples apart"):
        check_packs_apart(Recurrent())
    check_packs_apart(_tiny_llama("sdpa"))


@pytest.mark.parametrize(
    ("value", "message"),
    [("sometimes", "data.packing must be one of off, on, concatenate"), ("concat", None)],
)
def test_packing_values(value: str, message: str | None) -> None:
    if message is None:
        assert (
            load_config(None, ["model.task=causal-lm", f"data.packing={value}"]).data.packing == "concatenate"
        )
        return
    with pytest.raises(XtrainError, match=message):
        load_config(None, ["model.task=causal-lm", f"data.packing={value}"])


# -- the loop: tokens counted, exact resume ------------------------------------------------------


def _loop_cfg(train: Path, out: Path, *extra: str):
    return _cfg(
        train, "data.packing=true", "data.max_length=64", "batch.per_device=2", "batch.global_batch=4",
        "run.max_steps=6", "run.save_every=2", "run.log_every=1", "run.tensorboard=false",
        "lora.dropout=0.1", f"run.output_dir={out}", *extra,
    )  # fmt: skip


@pytest.mark.slow  # three short trainings (~40 s on a loaded 2-core machine)
def test_packed_training_resumes_on_the_same_batches(tmp_path: Path) -> None:
    from xtrain.machine import probe
    from xtrain.planning import rules
    from xtrain.planning.plan import Overrides
    from xtrain.train.loop import TrainingStopped, train
    from xtrain.train.report import NullReporter

    train_file = _jsonl(tmp_path / "s.jsonl", [{"text": t} for t in STORIES])
    plan = rules.make_plan(probe.collect(quick=True), Overrides(num_processes=1))

    class InterruptAt(NullReporter):
        def progress(self, step, total, metrics=None):
            if step == 3:
                os.kill(os.getpid(), signal.SIGINT)  # as Ctrl+C would, during step 4

    straight = train(_loop_cfg(train_file, tmp_path / "a"), plan)
    assert straight.tokens_per_s > 0  # counted without an attention mask
    out = tmp_path / "b"
    with pytest.raises(TrainingStopped):
        train(_loop_cfg(train_file, out), plan, InterruptAt())
    resumed = train(_loop_cfg(train_file, out), plan)
    assert resumed.resumed_from and resumed.resumed_from.endswith("step-4")
    assert resumed.losses == straight.losses
    from safetensors.torch import load_file

    a = load_file(str(tmp_path / "a" / "adapter" / "adapter_model.safetensors"))
    b = load_file(str(out / "adapter" / "adapter_model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # bitwise
