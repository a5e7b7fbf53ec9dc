"""What a run leaves behind, given back to xtrain as a new user gives it (docs/chains.md,
docs/training.md): a checkpoint folder as a stage's start (xtrain's ``checkpoints/step-N`` and a HF
Trainer / LLaMA-Factory ``checkpoint-500``), a run folder whose ``adapter/`` is missing (killed
before it finished), and the run's cached rows cut short on disk (a full disk, a copy cut off).

Each of these used to fail with a line that blamed something else ("cannot load the tokenizer",
"cannot read train.csv as csv: Expected to read 344 metadata bytes"). Now a checkpoint starts a
stage from its adapter, a folder that holds no result says what to pass instead, and a damaged
cache entry is made again with a note, the user's data file never named as the fault."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from support.chains import train_stage

from xtrain.model.start import NotAResult, start_of

pytestmark = pytest.mark.usefixtures("private_caches")  # conftest: one offline cache for the session


def _csv(path: Path, n: int) -> Path:
    from xtrain import builtin

    rows = builtin.story_examples(n, seed=5)
    path.write_text("text\n" + "".join('"' + r["text"].replace('"', '""') + '"\n' for r in rows))
    return path


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A LoRA run on a CSV file in a datasets cache of its own: 2 steps, a checkpoint each."""
    import datasets

    root = tmp_path_factory.mktemp("faults")
    data = _csv(root / "train.csv", 32)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(datasets.config, "HF_DATASETS_CACHE", str(root / "datasets"))
        out = train_stage(
            tmp_path_factory, "faulty", _job(data, "run.save_every=1", "run.keep_checkpoints=0")
        )
    return {"out": out, "data": data, "cache": root / "datasets"}


def _job(data: Path, *more: str) -> list[str]:
    return [
        "model.name_or_path=builtin:tiny-llama", f"data.train={data}", "data.eval=null",
        "data.text_column=text", "data.max_length=32", "lora.r=4", "lora.dropout=0.0",
        "optim.lr=1e-2", "batch.per_device=4", "batch.global_batch=4", "run.max_steps=2",
        "run.log_every=4", *more,
    ]  # fmt: skip


def test_a_checkpoint_holds_its_adapter_and_starts_a_stage(run, tmp_path_factory):
    """``checkpoints/step-1`` holds the adapter of step 1 as a finished run's (its weights are the
    checkpoint's own trained weights, its record names the run's base), and a stage started from it
    trains on top of exactly that adapter."""
    from safetensors.torch import load_file

    step = run["out"] / "checkpoints" / "step-1"
    start = start_of(str(step))
    assert [a.path for a in start.adapters] == [str(step / "adapter")]
    assert start.base == "builtin:tiny-llama" and start.task == "causal-lm"
    state = load_file(str(step / "model.safetensors"))  # what resume loads: the trainable weights
    adapter = load_file(str(step / "adapter" / "adapter_model.safetensors"))
    assert {k.replace(".default", ""): v for k, v in state.items()}.keys() == adapter.keys()
    assert all((state[k].float() - adapter[k.replace(".default", "")]).abs().max() == 0 for k in state)
    assert not all((v == 0).all() for k, v in adapter.items() if "lora_B" in k)  # trained: not the init
    second = train_stage(
        tmp_path_factory, "from-step", _job(run["data"], f"model.name_or_path={step}", "run.max_steps=1")
    )
    record = json.loads((second / "adapter" / "xtrain_run.json").read_text())
    assert [e["source"] for e in record["lineage"]] == [str(step.absolute())]
    assert record["lineage"][0]["adapter_sha256"] == start.adapters[0].sha256


def test_a_folder_without_a_result_says_what_to_pass(run, tmp_path):
    """A run folder without its adapter/ names its newest checkpoint; a checkpoint without an
    adapter (a full fine-tune's, an older xtrain's) says to finish the run; a HF Trainer folder
    without a final adapter names its newest checkpoint-N. Never a tokenizer that fails to load."""
    killed = tmp_path / "killed"
    shutil.copytree(run["out"], killed)
    shutil.rmtree(killed / "adapter")
    newest = killed / "checkpoints" / "step-2"
    with pytest.raises(NotAResult, match=r"stopped at step 2 of 2 before its adapter/") as e:
        start_of(str(killed))
    assert e.value.hint == (
        f"pass {newest} to start from its newest checkpoint, or run its config again to finish it, "
        "resuming from step 2"
    )
    shutil.rmtree(newest / "adapter")  # a checkpoint of a sharded run, or an older xtrain's
    with pytest.raises(
        NotAResult, match=r"run its config again to finish it, resuming from step 2; then pass"
    ):
        start_of(str(killed))
    with pytest.raises(NotAResult, match=r"checkpoint of the xtrain run .* \(step 2, a sharded run's"):
        start_of(str(newest))
    hf = tmp_path / "lf-out"
    shutil.copytree(run["out"] / "checkpoints" / "step-1" / "adapter", hf / "checkpoint-500")
    (hf / "checkpoint-500" / "xtrain_run.json").unlink()  # a trainer's: peft's files, no record
    (hf / "checkpoint-500" / "trainer_state.json").write_text('{"global_step": 500}')
    with pytest.raises(NotAResult, match=f"pass one of them, e.g. the newest: {hf / 'checkpoint-500'}"):
        start_of(str(hf))
    start = start_of(str(hf / "checkpoint-500"))  # the trainer's checkpoint: a peft adapter on its base
    assert [a.path for a in start.adapters] == [str(hf / "checkpoint-500")] and start.task is None


@pytest.mark.parametrize("cut", ["copy", "encoded"])
def test_a_damaged_cache_entry_is_made_again(run, monkeypatch, cut):
    """The Arrow files the run wrote, cut short (into a message body, and into a message's
    metadata: "Expected to read 344 metadata bytes"): the next read notes the damaged file and
    makes it again from the user's file, the rows the same as before."""
    import datasets

    from xtrain.data import encoded
    from xtrain.tasks.validation import load_config

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(run["cache"]))
    cfg = load_config(None, ["model.task=causal-lm", *_job(run["data"])])
    want = _encoded(cfg)
    name = "cache-*.arrow" if cut == "encoded" else "csv-train.arrow"
    files = sorted(run["cache"].rglob(name))
    assert files, f"the run wrote no {name}"
    for i, path in enumerate(files):
        path.write_bytes(path.read_bytes()[: (path.stat().st_size // 2 if i % 2 else 600)])
    notes: list[str] = []
    with encoded.reporting(None, notes.append):
        got = _encoded(cfg)
    assert got == want
    assert notes and all("the datasets cache held a damaged file" in n for n in notes), notes
    assert all("Expected to" in n or "metadata" in n for n in notes), notes
    assert not any("cannot read" in n for n in notes)


def _encoded(cfg) -> list[dict]:
    import contextlib

    from xtrain.tasks.common import prepare_tokenizer, raw_datasets
    from xtrain.tasks.text.rows import encoded_sets

    source, tokenizer = prepare_tokenizer(cfg, contextlib.nullcontext)
    return encoded_sets(cfg, tokenizer, source, *raw_datasets(cfg))[2].to_list()
