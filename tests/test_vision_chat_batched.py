"""The vision-language collator calls the processor once per batch (issue 24) and gives exactly
the tensors of one processor call per conversation (the collator before it): input_ids,
attention_mask, labels, pixel_values, image_grid_thw and every other key, for training batches
and eval batches (the left-padded ``gen_*`` prompts and ``answer_labels``), on the built-in
``builtin:tiny-qwen2-vl`` / ``builtin:shapes-vqa`` and on rows with two images, images of
other sizes, no image, a system prompt, and cuts at data.max_length."""

from __future__ import annotations

import contextlib
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from support.workloads import build_workload

from xtrain.builtin import vision_language as builtin_vl
from xtrain.data.collate import IGNORE_INDEX
from xtrain.data.rows.vision_chat import (
    ANSWER_KEY,
    GEN_PREFIX,
    VisionChatCollator,
    _pad,
    carry_labels,
    process_text,
)
from xtrain.tasks.validation import load_config

pytestmark = pytest.mark.usefixtures("private_caches")  # conftest: one offline cache for the session


def per_conversation(collator: VisionChatCollator, features: list[dict[str, Any]]) -> dict[str, Any]:
    """The collator before issue 24: the processor on each conversation (and each prompt) alone,
    labels carried over, rows cut at max_length, padded and concatenated."""
    processor, image = collator.processor, collator._image_token()
    pad = collator.tokenizer.pad_token_id if collator.tokenizer.pad_token_id is not None else 0
    outs = []
    for f in features:
        out = process_text(processor, f["text"], f["images"])
        ids = out["input_ids"][0].tolist()
        labels = carry_labels(f["input_ids"], f["labels"], ids, image)
        if len(ids) > collator.max_length:
            labels = labels[: collator.max_length]
            for key, value in out.items():
                if torch.is_tensor(value) and tuple(value.shape) == (1, len(ids)):
                    out[key] = value[:, : collator.max_length]
        out["labels"] = labels
        outs.append(out)
    batch = _pad(outs, collator._length(max(len(o["labels"]) for o in outs)), pad, left=False)
    batch["labels"] = torch.full_like(batch["input_ids"], IGNORE_INDEX)
    for i, o in enumerate(outs):
        batch["labels"][i, : len(o["labels"])] = torch.as_tensor(o["labels"], dtype=torch.long)
    if all("prompt" in f for f in features):
        prompts = [process_text(processor, f["prompt"], f["images"]) for f in features]
        gen = _pad(prompts, collator._length(max(p["input_ids"].shape[1] for p in prompts)), pad, left=True)
        for key in list(gen):
            if key in batch and batch[key].shape == batch["input_ids"].shape:
                batch[GEN_PREFIX + key] = gen[key]
        answers = [o["labels"][p["input_ids"].shape[1] :] for o, p in zip(outs, prompts, strict=True)]
        batch[ANSWER_KEY] = torch.full((len(answers), max(1, *map(len, answers))), IGNORE_INDEX)
        for i, a in enumerate(answers):
            batch[ANSWER_KEY][i, : len(a)] = torch.as_tensor(a, dtype=torch.long)
    return batch


def assert_same(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert sorted(got) == sorted(want)
    for key, value in want.items():
        assert got[key].dtype == value.dtype, key
        assert torch.equal(got[key], value), key


@contextlib.contextmanager
def processor_calls(collator: VisionChatCollator) -> Iterator[list[int]]:
    """The number of texts of each processor call the collator makes inside the block."""
    calls: list[int] = []
    processor = collator.processor

    class Counting:
        def __getattr__(self, name: str) -> Any:
            return getattr(processor, name)

        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            calls.append(len(kwargs["text"]))
            return processor(*args, **kwargs)

    collator.processor = Counting()
    try:
        yield calls
    finally:
        collator.processor = processor


def _quickstart(*overrides: str):
    jobs = Path(__file__).resolve().parents[1] / "xtrain" / "builtin" / "jobs"
    job = jobs / "quickstart-vision-language.yaml"
    return build_workload(load_config(job, list(overrides)))


def test_builtin_batches_are_the_per_conversation_tensors_from_one_processor_call():
    workload = _quickstart()
    collator = workload.collator
    assert sorted(collator.processor.image_processor.model_input_names) == ["image_grid_thw", "pixel_values"]
    rng = random.Random(0)
    batches = [list(range(8)), rng.sample(range(len(workload.train_dataset)), 8), [5]]
    for rows in batches:
        features = [workload.train_dataset[i] for i in rows]
        want = per_conversation(collator, features)
        assert {"input_ids", "attention_mask", "labels", "pixel_values", "image_grid_thw"} <= set(want)
        with processor_calls(collator) as calls:
            got = collator(features)
        assert calls == [len(rows)]  # one call for the batch
        assert_same(got, want)
    # eval rows: the prompts (left-padded, for generation) and the answers, padded to a multiple of 8
    padded = VisionChatCollator(workload.collator.processor, collator.max_length, pad_to_multiple_of=8)
    for rows in ([0, 1, 2, 3], rng.sample(range(len(workload.eval_dataset)), 6)):
        features = [workload.eval_dataset[i] for i in rows]
        assert_same(padded(features), per_conversation(padded, features))


def _mixed_rows(root: Path) -> Path:
    """Rows the built-in data lacks: a system prompt, two images of different sizes in one turn,
    no image, two assistant turns (the longest: cut at max_length=61 after its first answer)."""
    (root / "img").mkdir(parents=True)
    rng = random.Random(0)
    builtin_vl.draw_shape("square", "red", rng).save(root / "img" / "0.png")
    builtin_vl.draw_shape("circle", "blue", rng).save(root / "img" / "1.png")
    builtin_vl.draw_shape("triangle", "green", rng).resize((112, 84)).save(root / "img" / "big.png")

    def user(*parts: str) -> dict[str, Any]:
        content = [
            {"type": "image", "image": f"img/{p}"} if p.endswith(".png") else {"type": "text", "text": p}
            for p in parts
        ]
        return {"role": "user", "content": content}

    def answer(text: str) -> dict[str, Any]:
        return {"role": "assistant", "content": text}

    rows = [
        [{"role": "system", "content": "Answer in one word."}, user("0.png", "colour?"), answer("red")],
        [user("big.png", "and", "1.png", "which shapes?"), answer("a triangle and a circle")],
        [user("say hi"), answer("hi")],
        [user("0.png", "colour?"), answer("red"), user("and the shape of the thing in the picture?"),
         answer("square")],
    ]  # fmt: skip
    data = root / "mixed.jsonl"
    data.write_text("".join(json.dumps({"messages": m}) + "\n" for m in rows), encoding="utf-8")
    return data


def test_mixed_rows_and_cuts_give_the_per_conversation_tensors(tmp_path):
    from xtrain import builtin

    data = _mixed_rows(tmp_path)
    model = builtin.ensure_builtin_model("builtin:tiny-qwen2-vl")
    for max_length in (64, 61):
        overrides = [f"model.name_or_path={model}", "model.task=vision-language", f"data.train={data}",
                     f"data.eval={data}", f"data.max_length={max_length}", "batch.per_device=4"]  # fmt: skip
        cfg = load_config(None, overrides)
        workload = build_workload(cfg)
        collator = workload.collator
        features = [workload.eval_dataset[i] for i in range(4)]
        want = per_conversation(collator, features)
        assert want["image_grid_thw"].tolist() == [[1, 4, 4], [1, 6, 8], [1, 4, 4], [1, 4, 4]]
        assert want["input_ids"].shape[1] == max(63 if max_length == 64 else 61, 52)
        with processor_calls(collator) as calls:
            got = collator(features)
        assert calls == [4, 4]  # the conversations, then the prompts
        assert_same(got, want)
        for order in ([2, 1], [3, 0, 2], [1, 3]):  # a row without an image first or between
            rows = [features[i] for i in order]
            assert_same(collator(rows), per_conversation(collator, rows))
            train = [workload.train_dataset[i] for i in order]
            assert_same(collator(train), per_conversation(collator, train))


def test_a_processor_without_attention_mask_is_called_per_conversation(private_caches):
    workload = _quickstart()
    collator = workload.collator
    processor = collator.processor

    class NoMask:
        def __getattr__(self, name: str) -> Any:
            return getattr(processor, name)

        def __call__(self, *args: Any, **kwargs: Any) -> Any:
            out = dict(processor(*args, **kwargs))
            out.pop("attention_mask")
            return out

    collator.processor = NoMask()
    features = [workload.train_dataset[i] for i in range(3)]
    with processor_calls(collator) as calls:
        got = collator(features)
    assert calls == [3, 1, 1, 1] and "attention_mask" not in got  # no mask to cut the batch's result by
    assert_same(got, per_conversation(collator, features))
