"""Sequence parallelism for vision-language rows (issue 58), exact: one process on the whole row
against two with ``parallel.sequence: 2`` (gloo, real processes) give the same step loss and the
same LoRA and projector gradients within float32 rounding, on the built-in tiny Qwen2-VL, with
rows whose image tokens straddle the cut between the two processes' halves.

Each process runs the vision tower and the merge of the image features into the embeddings on
the whole row, and the model's own 3-D M-RoPE positions are computed there; the rows are cut at
the language model's entry (xtrain/model/sequence_entry.py). The one-process side is xtrain's loop
at its first optimizer step, itself checked against the plain reference in
tests/test_gradients.py (test_vision_language_adapters_and_projector). The default run's
two-process case is the kind "vision-language" of tests/test_sequence_parallel.py (its one
torchrun holds every kind: one start of two processes for all), on the rows ``vl_overrides``
writes; ring mode and gradient checkpointing are soak cases here.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from support.gradients import assert_same_gradients, jsonl
from test_sequence_parallel import _cache, _common, _torchrun, one_process

from xtrain.builtin import vision_language as builtin_vl

pytestmark = pytest.mark.usefixtures("private_caches")  # conftest: one offline cache for the session

WORDS = ("one", "two", "three", "four", "five", "six")
SIZES = ((112, 56), (84, 84), (56, 112))  # 8, 9 and 8 image tokens (14-pixel patches, merged 2 x 2)


def vl_overrides(data: Path) -> list[str]:
    """The vision-language job's overrides (without ``parallel.sequence``), its rows written to
    ``data``: 8 conversations, each a few words, an image and a question, a two-word answer; rows
    of 50 to 75 tokens whose image tokens sit anywhere from the first third to the last (some
    across the middle). tests/test_sequence_parallel.py's torchrun runs it too ("vision-language")."""
    rng, rows = random.Random(3), []
    data.mkdir(parents=True, exist_ok=True)
    for i in range(8):
        shape, colour = rng.choice(builtin_vl.SHAPES), rng.choice(list(builtin_vl.COLOURS))
        builtin_vl.draw_shape(shape, colour, rng).resize(SIZES[i % 3]).save(data / f"image-{i}.png")
        words = " ".join(WORDS[k % 6] for k in range(rng.randint(0, 12)))
        question = [{"type": "text", "text": words}, {"type": "image", "image": f"image-{i}.png"},
                    {"type": "text", "text": f"what colour is the {shape}?"}]  # fmt: skip
        rows.append({"messages": [{"role": "user", "content": question},
                                  {"role": "assistant", "content": f"{colour} {shape}"}]})  # fmt: skip
    train = jsonl(data / "train.jsonl", rows)
    return _common("model.name_or_path=builtin:tiny-qwen2-vl", "model.task=vision-language",
                   f"data.train={train}", "data.max_length=96", "lora.projector=true")  # fmt: skip


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return vl_overrides(tmp_path_factory.mktemp("seqpar-vl-data"))


# Ulysses over the whole rows (the default run's case) is tests/test_sequence_parallel.py's kind
# "vision-language", in its one torchrun; these add a torchrun of their own (soak)
SOAK = {
    # ring attention; the model's own loss (shift_labels)
    "ring": ["parallel.sequence_mode=ring", "model.chunked_loss=off"],
    # gradient checkpointing (the vision tower's blocks and the decoder's layers recomputed), eager
    "checkpointing-eager": ["model.gradient_checkpointing=true", "model.attn_implementation=eager"],
}


@pytest.mark.soak  # one torchrun of two configs and two one-process runs: about 40 s
def test_ring_and_checkpointing_train_as_one(job, tmp_path, tmp_path_factory):
    """Two processes holding half of each vision-language row, in ring mode and under gradient
    checkpointing with eager attention: the step's loss (every rank's shares summed) and each
    rank's gradients (LoRA's, the projector's trained whole) equal one process's on whole rows."""
    configs = {
        k: [*job, *extra, "parallel.sequence=2", f"run.output_dir={tmp_path / k}"]
        for k, extra in SOAK.items()
    }
    two = _torchrun(configs, tmp_path, _cache(tmp_path_factory))
    for kind, extra in SOAK.items():
        one, loss = one_process([*job, *extra], tmp_path / f"one-{kind}")
        assert any("merger" in n for n in one.grads), "the projector trains whole"
        assert sum(r["loss"] for r in two[kind]) == pytest.approx(loss, rel=1e-5)
        for rank in two[kind]:
            assert_same_gradients(rank["grads"], one.grads)


# -- the cut (one process) ------------------------------------------------------------------------


class Seen(Exception):
    """Raised by the spy on the language model's inputs: the forward ends there."""


def _decoder_inputs(model: torch.nn.Module, decoder: torch.nn.Module, batch: dict) -> dict:
    """The keyword arguments ``decoder`` gets when ``model`` runs ``batch`` (after every hook
    registered on it before)."""
    seen: dict = {}

    def spy(module, args, kwargs):
        seen.update(kwargs)
        raise Seen

    handle = decoder.register_forward_pre_hook(spy, with_kwargs=True)
    try:
        with pytest.raises(Seen):
            model(**batch)
    finally:
        handle.remove()
    return seen


def test_the_cut_at_the_language_model_is_a_slice_of_the_whole_rows_inputs(job, tmp_path):
    """What the language model gets on each of 2 shards is its half of what it gets on the whole
    rows: the embeddings with the image features merged, the 3-D M-RoPE positions (global), and
    the labels shifted over the whole row then cut; an image's tokens straddle the cut."""
    from support.workloads import build_workload

    from xtrain.data.entry_shards import entry_batch
    from xtrain.model.sequence_entry import EntryCut
    from xtrain.tasks.validation import load_config
    from xtrain.tasks.vision.vision_language import parts

    workload = build_workload(load_config(None, [*job, f"run.output_dir={tmp_path}"]))
    model, collator = workload.model, workload.collator
    batch = collator([workload.train_dataset[i] for i in range(4)])
    base = model.get_base_model()
    decoder = base.get_submodule(parts(base)[0])
    shards = [entry_batch(batch, 2, i) for i in (0, 1)]
    length = shards[0]["sequence_shards"].length  # the rows padded to a multiple of 2
    half = length // 2
    image = shards[0]["input_ids"] == collator._image_token()
    assert bool((image[:, half - 1] & image[:, half]).any()), "an image straddles the cut"
    whole_rows = {
        k: v for k, v in shards[0].items() if k not in ("sequence_shards", "labels", "shift_labels")
    }
    model.eval()
    with torch.no_grad():
        whole = _decoder_inputs(model, decoder, whole_rows)
        cut = EntryCut(model, decoder).attach()
        try:
            got = [_decoder_inputs(model, decoder, s) for s in shards]
        finally:
            cut.detach()
    assert whole["position_ids"].shape == (3, 4, length) and whole["inputs_embeds"].shape[1] == length
    assert not torch.equal(whole["position_ids"][0], whole["position_ids"][1])  # M-RoPE: images' own
    shifted = torch.full((4, length), -100)
    shifted[:, : batch["labels"].shape[1] - 1] = batch["labels"][:, 1:]
    for i, (shard, inputs) in enumerate(zip(shards, got, strict=True)):
        part = slice(i * half, (i + 1) * half)
        assert torch.equal(inputs["inputs_embeds"], whole["inputs_embeds"][:, part])
        assert torch.equal(inputs["position_ids"], whole["position_ids"][..., part])
        assert inputs["attention_mask"].shape == (4, half) and inputs["sequence_shards"].index == i
        assert torch.equal(shard["shift_labels"], shifted[:, part]) and torch.equal(
            shard["labels"], shifted[:, part]
        )
        assert torch.equal(shard["input_ids"], shards[0]["input_ids"])  # every process: whole rows
    assert "sequence_shards" not in whole
    # a batch without images: the model leaves the positions to the decoder; counted over the row
    from xtrain.data.sequence_shards import Shards
    from xtrain.model.sequence_entry import cut_inputs

    plain = cut_inputs(
        {"inputs_embeds": torch.zeros(2, 6, 3), "attention_mask": torch.ones(2, 6)}, Shards(2, 1, 6)
    )
    assert plain["position_ids"].tolist() == [[3, 4, 5]] * 2 and plain["inputs_embeds"].shape == (2, 3, 3)


def test_a_family_the_cut_is_not_known_for_is_one_line_at_the_dry_run(job, tmp_path, capsys, monkeypatch):
    """A vision-language model of another family (LLaVA) with parallel.sequence: 2: one line at
    the dry run naming the families that split, no traceback."""
    import shutil

    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig

    from xtrain import builtin
    from xtrain.cli import main

    for key in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    llava = tmp_path / "llava"
    text = LlamaConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                       intermediate_size=64, vocab_size=1000)  # fmt: skip
    vision = CLIPVisionConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                              intermediate_size=64, image_size=28, patch_size=14)  # fmt: skip
    LlavaConfig(text_config=text, vision_config=vision).save_pretrained(llava)
    for f in builtin.ensure_builtin_model("builtin:tiny-qwen2-vl").iterdir():
        if "token" in f.name or "processor" in f.name or f.name == "chat_template.jinja":
            shutil.copy(f, llava / f.name)  # its processor: the data check reads the rows with it
    config = tmp_path / "job.yaml"
    config.write_text(f"model:\n  name_or_path: {llava}\n  task: vision-language\n")
    overrides = [o for o in job if not o.startswith("model.")]
    code = main(["train", str(config), "--dry-run", "--processes", "2", "parallel.sequence=2",
                 f"run.output_dir={tmp_path / 'out'}", *overrides])  # fmt: skip
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error:" in line]
    assert code == 2 and "Traceback" not in err, err[-2000:]
    assert len(errors) == 1 and "qwen2_vl, qwen2_5_vl" in errors[0] and "this model is llava" in errors[0], (
        err
    )


def test_qwen2_5_vl_the_first_shard_is_the_first_half_of_the_whole_row():
    """Qwen2.5-VL (the other family that splits; a tiny one built from its config, no processor):
    with the cut at its language model, the first shard's logits are the whole rows' first half
    (causal: they see nothing after it), an image across the cut, its M-RoPE positions its own.
    Attention runs plain here (one process: the shards' exchange is the two-process tests')."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    from xtrain.data.entry_shards import entry_batch
    from xtrain.data.sequence_shards import KEY
    from xtrain.model.sequence_entry import EntryCut

    image, start, end = 90, 91, 92
    text = {
        "vocab_size": 100,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "pad_token_id": 0,
        "bos_token_id": None,
        "eos_token_id": 1,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [4, 2, 2]},
    }
    vision = {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 64,
              "window_size": 56, "fullatt_block_indexes": [1]}  # fmt: skip
    config = Qwen2_5_VLConfig(text_config=text, vision_config=vision, image_token_id=image, video_token_id=93,
                              vision_start_token_id=start, vision_end_token_id=end)  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Qwen2_5_VLForConditionalGeneration(config).eval()
        pixels = torch.randn(48, 3 * 2 * 14 * 14)
    grid = torch.tensor([[1, 4, 6], [1, 6, 4]])  # 24 patches, 6 image tokens each
    ids = torch.tensor(
        [[5 + i % 50 for i in range(n)] + [start] + [image] * 6 + [end] + [7] * (30 - n) for n in (16, 3)]
    )
    batch = {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "labels": ids.clone(),
        "mm_token_type_ids": (ids == image).int(),
        "pixel_values": pixels,
        "image_grid_thw": grid,
    }
    first = entry_batch(batch, 2, 0)
    half = first[KEY].local
    assert bool(ids[0, half - 1] == image) and bool(ids[0, half] == image)  # an image across the cut
    inputs = {k: v for k, v in first.items() if k not in ("labels", "shift_labels")}
    decoder = model.model.language_model
    with torch.no_grad():
        whole = model(**{k: v for k, v in inputs.items() if k != KEY}).logits
        cut = EntryCut(model, decoder).attach()
        plain = decoder.register_forward_pre_hook(  # (the shards' attention needs the group)
            lambda module, args, kwargs: (args, {k: v for k, v in kwargs.items() if k != KEY}),
            with_kwargs=True,
        )
        try:
            got = model(**inputs).logits
        finally:
            plain.remove()
            cut.detach()
    assert got.shape[1] == half
    torch.testing.assert_close(got, whole[:, :half], rtol=1e-5, atol=1e-5)
