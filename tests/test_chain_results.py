"""A chained result used everywhere a result is (docs/chains.md): ``xtrain predict``, ``chat`` and
``export`` run the whole chain's model (base + every adapter in order), its single-adapter form
(``adapter-chain/``) loads in plain peft and computes the same, and its GGUF, run by llama.cpp
itself, answers as the merged model. The chain: an SFT on prompt/response rows, then a chat SFT
(a new adapter, a chat template of its own) from it, both by xtrain's loop."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from support.chains import sft_result, train_stage
from support.gradients import jsonl

from xtrain import builtin
from xtrain.model.start import RUN_FILE, start_of

pytestmark = pytest.mark.usefixtures("private_caches")  # conftest: one offline cache for the session


@pytest.fixture(scope="module")
def chained(tmp_path_factory) -> Path:
    from xtrain.builtin.chat import CHAT_TEMPLATE

    first = sft_result(tmp_path_factory)
    template = tmp_path_factory.mktemp("template") / "chat.jinja"  # its tokens end with the eos token
    template.write_text(CHAT_TEMPLATE, encoding="utf-8")
    return train_stage(
        tmp_path_factory,
        "chat",
        [f"model.name_or_path={first}", "data.train=builtin:chat", "data.eval=builtin:chat",
         f"data.chat_template={template}", "data.max_length=96", "lora.r=8",
         "lora.target_modules=all-linear", "optim.lr=1e-2", "batch.per_device=8", "run.max_steps=60",
         "run.log_every=60"],
    )  # fmt: skip


def _hand_chain(chained: Path):
    """base + the SFT adapter + the chat adapter, by transformers and peft alone from the record."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    record = json.loads((chained / "adapter" / RUN_FILE).read_text(encoding="utf-8"))
    first = Path(record["lineage"][0]["source"]) / "adapter"
    base = AutoModelForCausalLM.from_pretrained(
        builtin.ensure_builtin_model(record["base"]), dtype=torch.float32
    )
    model = PeftModel.from_pretrained(base, str(first), adapter_name="sft")
    model.load_adapter(str(chained / "adapter"), adapter_name="chat")
    model.base_model.set_adapter(["sft", "chat"])
    return model.eval()


IDS = [5, 40, 77, 120, 9, 33, 61, 2]


def _logits(model) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([IDS])).logits[0]


def test_the_record_names_the_lineage_and_the_result_keeps_its_earlier_adapter(chained):
    """The record names the stage it came from (the SFT run, as the report reads it), its base, its
    own mode and hash; the earlier adapter is kept beside its own, each with the hash recorded."""
    record = json.loads((chained / "adapter" / RUN_FILE).read_text(encoding="utf-8"))
    (first,) = record["lineage"]  # the SFT run: a run from a base model has none before it
    assert (first["task"], first["mode"], record["mode"]) == ("causal-lm", "new", "new")
    assert Path(first["source"]).name == "out" and (Path(first["source"]) / "adapter").is_dir()
    assert record["base"] == "builtin:tiny-llama" and record["single_adapter"] == "adapter-chain"
    kept = chained / "adapter" / "lineage" / "0" / "adapter_model.safetensors"
    start = start_of(str(chained))
    assert [a.path for a in start.adapters] == [str(kept.parent), str(chained / "adapter")]
    assert [a.sha256 for a in start.adapters] == [first["adapter_sha256"], record["adapter_sha256"]]
    assert [e["source"] for e in start.lineage] == [first["source"], str(chained.absolute())]


def test_predict_chat_and_the_single_adapter_are_the_chains_model(chained):
    """``xtrain predict``'s model and plain peft's load of ``adapter-chain/`` compute what
    transformers + peft compute with both adapters (and not what the last adapter alone does);
    predict and chat answer the same from the chained result and from its single adapter."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from xtrain import predict as lib
    from xtrain.tasks.contract import PredictRequest

    want = _logits(_hand_chain(chained))
    _, loaded = lib.load_predictor(chained)
    torch.testing.assert_close(_logits(loaded.model), want, rtol=1e-5, atol=1e-5)
    base = AutoModelForCausalLM.from_pretrained(builtin.ensure_builtin_model("builtin:tiny-llama"))
    single = PeftModel.from_pretrained(base, str(chained / "adapter-chain")).eval()
    torch.testing.assert_close(_logits(single), want, rtol=1e-5, atol=1e-5)
    alone = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(base.name_or_path), str(chained / "adapter")
    )
    assert float((_logits(alone.eval()) - want).abs().max()) > 1e-2, "the SFT adapter counts"
    request = PredictRequest([], ["what color is the kite?"], max_new_tokens=12)
    said = [lib.predict(path, request)[0]["output"] for path in (chained, chained / "adapter-chain")]
    assert said[0] == said[1]
    turns = [{"role": "user", "content": "where is the frog?"}]
    replies = [lib.load_chat(path, PredictRequest([], [], max_new_tokens=12)).reply(turns)
               for path in (chained, chained / "adapter-chain")]  # fmt: skip
    assert replies[0] == replies[1]


def test_the_gguf_runs_in_llamacpp_and_answers_as_the_merged_chain(chained, tmp_path):
    """``xtrain export --to gguf`` of the chained result: merged from base + both adapters (every
    adapted weight checked against both deltas summed), and llama.cpp itself answers the run's
    eval prompts as the merged model and ``xtrain predict --data`` do."""
    from xtrain import predict as lib
    from xtrain.export import answers
    from xtrain.export.pipeline import ExportRequest, export
    from xtrain.tasks.contract import PredictRequest

    pytest.importorskip("xllamacpp")
    result = export(ExportRequest(str(chained), "gguf", tmp_path / "gguf", gguf_type="f16", eval_prompts=8))
    prompts = result.prompts
    assert prompts is not None and len(prompts.examples) == 8
    assert prompts.files["f16"] == prompts.merged
    assert all(c.runtime.startswith("llama.cpp") for c in result.costs)
    request = PredictRequest([], [], max_new_tokens=answers.ANSWER_TOKENS, batch_size=8)
    predicted = lib.predict_file(chained, builtin.builtin_data_file("builtin:chat", "eval"), request)
    assert prompts.merged == [r["output"] for r in predicted.rows[:8]]
    print("llama.cpp's answers:", prompts.files["f16"][:3])
    weights = next(c.detail for c in result.checks if c.name == "weights")
    assert weights.startswith("14 adapted weights: sampled rows equal base + B @ A") and "DoRA" not in weights


def test_a_dora_stage_is_not_one_adapter_and_saves_the_merged_chain_instead(chained, tmp_path_factory):
    """DoRA's magnitudes do not concatenate: the record says so, no adapter-chain/ is written and
    merged/ holds the whole chain (it computes what predict's base + adapters compute)."""
    from transformers import AutoModelForCausalLM

    from xtrain import predict as lib

    dora = train_stage(
        tmp_path_factory,
        "dora",
        [f"model.name_or_path={chained}", "data.train=builtin:chat", "data.eval=null", "data.max_samples=32",
         "data.max_length=96", "lora.r=4", "lora.use_dora=true", "optim.lr=1e-2", "batch.per_device=8",
         "run.max_steps=2", "run.log_every=2"],
    )  # fmt: skip
    record = json.loads((dora / "adapter" / RUN_FILE).read_text(encoding="utf-8"))
    assert record["single_adapter"] is None and "DoRA" in record["single_adapter_why_not"]
    assert len(record["lineage"]) == 2 and not (dora / "adapter-chain").exists()
    _, loaded = lib.load_predictor(dora)
    merged = AutoModelForCausalLM.from_pretrained(dora / "merged", dtype=torch.float32).eval()
    torch.testing.assert_close(_logits(merged), _logits(loaded.model), rtol=1e-4, atol=1e-4)


def test_the_docs_chain_commands_run(chained, tmp_path, capsys, monkeypatch):
    """docs/chains.md's commands as a new user types them, in their own folder: the dry run of a
    DPO stage from the chained result says what it starts from (from its files alone), predict
    answers from it; a folder that holds no result is one line."""
    from xtrain.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "dpo").symlink_to(chained)
    jsonl(tmp_path / "pairs.jsonl", builtin.preference_examples(16, 5))
    (tmp_path / "dpo.yaml").write_text(
        "model:\n  name_or_path: runs/dpo\n  task: preference\ndata:\n  train: pairs.jsonl\n"
        "run:\n  output_dir: runs/dpo2\n",
        encoding="utf-8",
    )
    assert main(["train", "dpo.yaml", "--dry-run"]) == 0
    out = capsys.readouterr().out
    start = f"Start: {chained} (causal-lm -> causal-lm: 2 adapters on builtin:tiny-llama)"  # (the link's)
    assert f"{start}; a new adapter on top" in out, out
    assert main(["predict", "runs/dpo", "--prompt", "where is the frog?"]) == 0
    assert "where is the frog?" in capsys.readouterr().out
    (tmp_path / "empty").mkdir()
    assert main(["predict", "empty", "--prompt", "hi"]) == 2
    assert "holds no adapter or model" in capsys.readouterr().err
