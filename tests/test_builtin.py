"""Built-in tiny models, tokenizers and data: offline, deterministic, loaded like real checkpoints."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from xtrain import builtin
from xtrain.errors import XtrainError


def _weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("xtrain-builtin")


@pytest.mark.parametrize("name", ["builtin:tiny-llama", "builtin:tiny-bert"])
def test_model_is_identical_across_builds_and_loads_with_from_pretrained(name, cache, tmp_path):
    import torch
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    first = builtin.ensure_builtin_model(name, cache)
    second = builtin.ensure_builtin_model(name, tmp_path)
    assert first == cache / name.split(":")[1]
    a, b = _weights(first), _weights(second)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert (first / "tokenizer.json").read_text() == (second / "tokenizer.json").read_text()

    config = AutoConfig.from_pretrained(first)
    tokenizer = AutoTokenizer.from_pretrained(first)
    assert config.vocab_size == len(tokenizer)
    assert (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id) == (0, 1, 2)
    assert config.num_hidden_layers == 2 and config.hidden_size == 64
    model = AutoModel.from_pretrained(first)
    ids = tokenizer(["the movie was great.", "once upon a time"], padding=True, return_tensors="pt")
    out = model(**{k: v for k, v in ids.items() if k != "token_type_ids" or "bert" in name})
    assert out.last_hidden_state.shape[:2] == ids["input_ids"].shape


def test_second_call_reuses_the_folder(cache):
    folder = builtin.ensure_builtin_model("tiny-bert", cache)
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    assert builtin.ensure_builtin_model("builtin:tiny-bert", cache) == folder
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp
    assert not [p for p in cache.iterdir() if p.name.startswith(".tmp-")]


def test_stale_version_is_rebuilt(tmp_path):
    folder = tmp_path / "tiny-bert"
    folder.mkdir()
    (folder / builtin.MARKER).write_text(json.dumps({"version": -1}))
    (folder / "junk.txt").write_text("old")
    assert builtin.ensure_builtin_model("tiny-bert", tmp_path) == folder
    assert not (folder / "junk.txt").exists() and (folder / "config.json").exists()


def test_tokenizer_encodes_any_text():
    tok = builtin.build_tokenizer("llama")
    text = "Ünïcode, digits 12345 and CAPITALS!"
    ids = tok(text)["input_ids"]
    assert ids[0] == tok.bos_token_id and tok.unk_token_id not in ids
    assert tok.decode(ids, skip_special_tokens=True) == text
    pair = builtin.build_tokenizer("bert")("a b", "c d")
    assert pair["token_type_ids"][-1] == 1 and pair["input_ids"][-1] == tok.eos_token_id


def test_unknown_names_suggest_the_closest(tmp_path):
    with pytest.raises(XtrainError) as e:
        builtin.ensure_builtin_model("builtin:tiny-lama", tmp_path)
    assert "unknown built-in model 'builtin:tiny-lama'" in str(e.value)
    assert e.value.hint == "did you mean 'builtin:tiny-llama'?"
    with pytest.raises(XtrainError, match="did you mean 'builtin:sentiment'"):
        builtin.ensure_builtin_data("builtin:sentimnt", tmp_path)


def test_builtin_data_is_deterministic_and_split(tmp_path):
    folder = builtin.ensure_builtin_data("builtin:sentiment", tmp_path / "a")
    again = builtin.ensure_builtin_data("sentiment", tmp_path / "b")
    assert (folder / "train.jsonl").read_bytes() == (again / "train.jsonl").read_bytes()
    train = [json.loads(line) for line in (folder / "train.jsonl").read_text().splitlines()]
    evals = [json.loads(line) for line in (folder / "eval.jsonl").read_text().splitlines()]
    assert len(train) == 4000 and len(evals) == 500
    share = sum(r["label"] == "positive" for r in train) / len(train)
    assert 0.45 < share < 0.55
    assert {r["label"] for r in evals} == {"positive", "negative"}
    stories = builtin.builtin_data_file("builtin:tiny-stories", "eval", tmp_path / "a")
    assert stories.read_text().startswith('{"text": "once upon a time')
    with pytest.raises(XtrainError, match="unknown split"):
        builtin.builtin_data_file("sentiment", "test", tmp_path / "a")


def test_generators_are_reproducible():
    assert builtin.sentiment_examples(5, 3) == builtin.sentiment_examples(5, 3)
    assert builtin.story_examples(5, 3) != builtin.story_examples(5, 4)


def test_default_cache_location(monkeypatch, tmp_path):
    monkeypatch.setenv("XTRAIN_CACHE", str(tmp_path))
    assert builtin.cache_root() == tmp_path / "builtin"
    monkeypatch.delenv("XTRAIN_CACHE")
    assert builtin.cache_root() == Path.home() / ".cache" / "xtrain" / "builtin"


@pytest.mark.slow
def test_processes_racing_to_build_get_one_folder(tmp_path):
    code = (
        "import sys; from xtrain.builtin import ensure_builtin_model, ensure_builtin_data; "
        "print(ensure_builtin_model('tiny-llama', sys.argv[1])); "
        "print(ensure_builtin_data('sentiment', sys.argv[1]))"
    )
    env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(tmp_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for _ in range(3)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outs]
    # the folders each process got (its last two lines: a library imported while building, such
    # as DeepSpeed on a machine without a GPU, may print its own lines before them)
    assert len({tuple(out.splitlines()[-2:]) for out, _ in outs}) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "tiny-llama"]
    assert builtin._is_complete(tmp_path / "tiny-llama") and builtin._is_complete(
        tmp_path / "data" / "sentiment"
    )
