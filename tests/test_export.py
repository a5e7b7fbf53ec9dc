"""``xtrain export`` (xtrain/export): the tiny built-in llama and a Qwen2-shaped tiny model built
from a config with a tokenizer built here (byte-level BPE split by Qwen2's pattern, ChatML special
tokens, a Qwen2.5-style template with a default system prompt), offline. Adapters are built
directly (peft, random non-zero B) rather than trained: what export reads is the saved folder.

What must hold: merged equals base + adapter and loads in plain transformers; GGUF f16 and q8_0
read back (transformers' own GGUF reader) match the merged logits; the chat template round-trips
through every output; a 4-bit run's adapter merges into the 16-bit base; refusals are one line,
exit 2. Ollama is not installable here: the Modelfile's content is tested, and its template's
rendering against training's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("gguf")

CHATML = (
    "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + "
    "'<|im_end|>\\n' }}{%- else %}{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}{%- for m in messages %}{%- if m.role != 'system' %}{{- '<|im_start|>' + m.role + '\\n' "
    "+ m.content + '<|im_end|>\\n' }}{%- endif %}{%- endfor %}{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _adapter(model, folder: Path, tokenizer, record: dict) -> Path:
    """A LoRA adapter with non-zero weights on every linear layer, saved as a run saves it."""
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    config = LoraConfig(
        r=4, lora_alpha=8, target_modules=TARGETS, init_lora_weights=False, task_type="CAUSAL_LM"
    )
    peft = get_peft_model(model, config)
    peft.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / "xtrain_run.json").write_text(json.dumps({"task": "causal-lm", "data": {}, **record}))
    return folder


def _qwen2_tokenizer():
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from xtrain.builtin.text import _corpus

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    special = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    trainer = trainers.BpeTrainer(
        vocab_size=600, special_tokens=special, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )  # fmt: skip
    tok.train_from_iterator(_corpus()[:800], trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", padding_side="right"
    )
    fast.chat_template = CHATML
    return fast


@pytest.fixture(scope="module")
def llama_run(tmp_path_factory) -> Path:
    """A chat run on the built-in llama: its output_dir with adapter/ (the ChatML template)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from xtrain import builtin

    cache = tmp_path_factory.getbasetemp() / "offline-caches" / "xtrain" / "builtin"
    base = builtin.ensure_builtin_model("builtin:tiny-llama", cache)
    run = tmp_path_factory.mktemp("llama-run")
    tokenizer = AutoTokenizer.from_pretrained(base)
    tokenizer.chat_template = CHATML
    _adapter(AutoModelForCausalLM.from_pretrained(base), run / "adapter", tokenizer, {"chat": True})
    return run


@pytest.fixture(scope="module")
def qwen2_run(tmp_path_factory) -> Path:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    root = tmp_path_factory.mktemp("qwen2")
    tokenizer = _qwen2_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, initializer_range=0.1,
    )  # fmt: skip
    torch.manual_seed(1)
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():  # Qwen2's q/k/v biases are zero at init: make them count
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0, 0.1)
    model.save_pretrained(root / "base")
    tokenizer.save_pretrained(root / "base")
    model = Qwen2ForCausalLM.from_pretrained(root / "base")  # the adapter names this folder as its base
    _adapter(model, root / "run" / "adapter", tokenizer, {"chat": True})
    return root / "run"


def _export(path: Path, to: str, out: Path, **options):
    from xtrain.export.pipeline import ExportRequest, export

    return export(ExportRequest(str(path), to, out, **options))


def _logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0]


def _base_plus_adapter(run: Path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from xtrain.model.merge import base_source

    base = AutoModelForCausalLM.from_pretrained(base_source(run / "adapter"))
    return PeftModel.from_pretrained(base, str(run / "adapter")).eval()


IDS = [5, 40, 77, 120, 9, 33, 61, 2]


def test_merged_equals_base_plus_adapter_and_loads_in_plain_transformers(llama_run, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    result = _export(llama_run, "merged", tmp_path / "merged")
    assert [c.name for c in result.checks] == ["weights", "merged", "template"]
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").eval()
    assert type(merged.model.layers[0].self_attn.q_proj) is torch.nn.Linear  # no peft left
    torch.testing.assert_close(
        _logits(merged, IDS), _logits(_base_plus_adapter(llama_run), IDS), rtol=0, atol=1e-4
    )
    saved = AutoTokenizer.from_pretrained(tmp_path / "merged")
    assert saved.chat_template == CHATML  # the template the run trained with
    assert json.loads((tmp_path / "merged" / "xtrain_run.json").read_text())["chat"] is True
    assert not (tmp_path / "merged.tmp").exists()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_weight_check_passes_peft_merge_and_catches_a_wrong_one(llama_run, dtype):
    """16-bit logits carry the forward's own rounding (2-3% of the largest logit on a bf16 300M
    Llama), so the merge is checked weight by weight: peft's merge passes in float32 and bf16; a
    delta applied twice stops the export."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from xtrain.export.parity import MergeProbe, ParityError
    from xtrain.model.merge import base_source

    def adapted():
        base = AutoModelForCausalLM.from_pretrained(base_source(llama_run / "adapter"), dtype=dtype)
        return PeftModel.from_pretrained(base, str(llama_run / "adapter")).eval()

    model = adapted()
    probe = MergeProbe(model)
    assert len(probe.rows) == 2 * len(TARGETS) and probe.skipped == 0  # the tiny llama's 2 layers
    assert "within" in probe.check(model.merge_and_unload()).detail
    model = adapted()
    probe = MergeProbe(model)
    q = model.base_model.model.model.layers[1].self_attn.q_proj
    delta = q.get_delta_weight("default")
    merged = model.merge_and_unload()
    with torch.no_grad():
        merged.model.layers[1].self_attn.q_proj.weight += delta  # the delta applied twice
    with pytest.raises(ParityError, match=r"layers\.1\.self_attn\.q_proj is not base \+ adapter"):
        probe.check(merged)


def test_save_merged_is_the_same_merge(llama_run, tmp_path):
    """``run.save_merged``'s function gives the weights ``export --to merged`` writes."""
    from transformers import AutoModelForCausalLM

    from xtrain.train.checkpoint.outputs import merged_model

    trained = _base_plus_adapter(llama_run)
    at_train_end = merged_model(trained, llama_run / "adapter")
    _export(llama_run, "merged", tmp_path / "m")
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "m")
    for (k, a), (_, b) in zip(at_train_end.state_dict().items(), exported.state_dict().items(), strict=True):
        assert torch.equal(a, b), k


@pytest.mark.parametrize("kind", ["f16", "q8_0"])
@pytest.mark.parametrize("run", ["llama_run", "qwen2_run"])
def test_gguf_reads_back_as_the_merged_model(run, kind, request, tmp_path):
    from transformers import AutoModelForCausalLM

    from xtrain.export.parity import gguf_template

    folder = request.getfixturevalue(run)
    result = _export(folder, "gguf", tmp_path / "g", gguf_type=kind)
    quantized = ["quantized"] if kind == "q8_0" else []
    assert [c.name for c in result.checks] == ["weights", "merged", "file", *quantized, "template"]
    assert [c.kind for c in result.costs] == [kind] and not result.warnings
    path = tmp_path / "g" / f"model-{kind}.gguf"
    assert list(result.files) == [path.name]
    assert gguf_template(path) == CHATML
    back = AutoModelForCausalLM.from_pretrained(tmp_path / "g", gguf_file=path.name).eval()
    expected = _logits(_base_plus_adapter(folder), IDS)
    # these random models' logits move by at most (measured: docs/export.md#types) 0.2% f16, 4% q8_0
    allowed = {"f16": 2e-2, "q8_0": 1.2e-1}[kind]
    assert (_logits(back, IDS) - expected).abs().max() <= allowed * expected.abs().max()
    assert result.costs[0].logits <= allowed


def test_gguf_tokenizer_metadata(qwen2_run, tmp_path):
    from gguf import GGUFReader
    from transformers import AutoTokenizer

    _export(qwen2_run, "gguf", tmp_path / "g", gguf_type="f16")
    fields = GGUFReader(str(tmp_path / "g" / "model-f16.gguf")).fields

    def text(key: str) -> str:
        return bytes(fields[key].parts[fields[key].data[0]]).decode()

    def number(key: str) -> int:
        return int(fields[key].parts[fields[key].data[0]][0])

    tokenizer = AutoTokenizer.from_pretrained(qwen2_run / "adapter")
    assert (text("general.architecture"), text("tokenizer.ggml.model"), text("tokenizer.ggml.pre")) == (
        "qwen2", "gpt2", "qwen2",
    )  # fmt: skip
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert number("tokenizer.ggml.eos_token_id") == im_end
    assert number("tokenizer.ggml.eot_token_id") == im_end  # the template's turn end
    assert bool(number("tokenizer.ggml.add_bos_token")) is False
    types = fields["tokenizer.ggml.token_type"]
    assert int(types.parts[types.data[im_end]][0]) == 3  # control
    back = AutoTokenizer.from_pretrained(tmp_path / "g", gguf_file="model-f16.gguf")
    sample = "<|im_start|>user\nOnce upon a time, 12 dogs ran!<|im_end|>\n"
    assert back(sample)["input_ids"] == tokenizer(sample, add_special_tokens=False)["input_ids"]


def test_ollama_modelfile_template_stops_and_create_line(qwen2_run, tmp_path):
    result = _export(
        qwen2_run, "ollama", tmp_path / "o", gguf_type="q8_0", name="my-model", system="Be brief."
    )
    names = [c.name for c in result.checks]
    assert names == ["weights", "merged", "file", "quantized", "template", "template"]
    text = (tmp_path / "o" / "Modelfile").read_text()
    assert text.splitlines()[0] == "FROM ./model-q8_0.gguf"
    assert (
        'TEMPLATE """{{ if .System }}<|im_start|>system\n{{ .System }}<|im_end|>\n'
        "{{ else }}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{{ end }}"
        "{{ range $i, $_ := .Messages }}"
    ) in text
    assert 'SYSTEM """Be brief."""' in text
    assert 'PARAMETER stop "<|im_end|>"' in text and "PARAMETER temperature 0" in text
    assert result.ollama == {
        "bash": f"cd {tmp_path / 'o'}; ollama create my-model -f Modelfile",
        "powershell": f"cd {tmp_path / 'o'}; ollama create my-model -f Modelfile",
    }


def test_several_targets_share_one_merge(llama_run, tmp_path, monkeypatch, capsys):
    """``xtrain export --to merged --to gguf,ollama``: one merge and one check of it, one GGUF
    serving gguf and ollama (the Modelfile beside it), the merged folder in ``merged/``."""
    from transformers import AutoModelForCausalLM

    from xtrain.cli import main
    from xtrain.export import pipeline

    merges = []
    real = pipeline.merged_model
    monkeypatch.setattr(pipeline, "merged_model", lambda *a: merges.append(1) or real(*a))
    out = tmp_path / "all"
    argv = ["export", str(llama_run), "--to", "merged", "--to", "gguf,ollama", "--type", "q4_0"]
    argv += ["-o", str(out)]
    capsys.readouterr()
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert len(merges) == 1
    names = [line.split(":")[0][3:] for line in printed.splitlines() if line.startswith("ok ")]
    assert names == ["weights", "merged", "template", "file", "quantized", "template", "template"]
    assert str(out / "merged" / "model.safetensors") in printed and "ollama create" in printed
    assert (out / "Modelfile").read_text().startswith("FROM ./model-q4_0.gguf")
    assert sorted(p.name for p in out.glob("*.gguf")) == ["model-q4_0.gguf"]
    assert json.loads((out / "merged" / "xtrain_run.json").read_text())["chat"] is True
    merged = AutoModelForCausalLM.from_pretrained(out / "merged").eval()
    torch.testing.assert_close(
        _logits(merged, IDS), _logits(_base_plus_adapter(llama_run), IDS), rtol=0, atol=1e-4
    )
    assert pipeline.targets("gguf,ollama") == ("ollama",) == pipeline.targets(["ollama", "gguf"])
    assert pipeline.targets(["gguf", "merged"]) == ("merged", "gguf")


def test_ollama_turns_render_as_training_for_common_templates():
    """The Go template's Python mirror against the Jinja templates of the families (with the bos a
    GGUF adds taken off where the template writes it)."""
    from xtrain.data.rows import chat as chat_data
    from xtrain.export import ollama, templates
    from xtrain.export.parity import probe_conversations

    tokenizer = _qwen2_tokenizer()
    tokenizer.bos_token = "<|endoftext|>"
    llama3 = (
        "{{ bos_token }}{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\n\n'"
        " + m['content'] + '<|eot_id|>' }}{% endfor %}{% if add_generation_prompt %}"
        "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
    )
    gemma = (
        "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('no system') }}{% endif %}"
        "{% for m in messages %}{% set role = 'model' if m['role'] == 'assistant' else m['role'] %}"
        "{{ '<start_of_turn>' + role + '\n' + m['content'] + '<end_of_turn>\n' }}{% endfor %}"
        "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
    )
    for template, add_bos in ((CHATML, False), (llama3, True), (gemma, True)):
        render = chat_data.renderer(tokenizer, template)
        turns = ollama.ollama_turns(templates.derive(render), tokenizer.bos_token, add_bos)
        for c in probe_conversations(render):
            system = c[0]["content"] if c[0]["role"] == "system" else None
            rest = [m for m in c if m["role"] != "system"]
            assert turns.bos_text + turns.render(system, rest) == render(c, True)
        assert "{{ range $i, $_ := .Messages }}" in ollama.go_template(turns)
    # the system prompt folded into the first user turn: no system turn (so --system is refused)
    mistral = (
        "{% for m in messages %}{% if m['role'] == 'user' %}{{ '[INST] ' + (messages[0]['content'] + ' ' "
        "if messages[0]['role'] == 'system' and loop.index0 == 1 else '') + m['content'] + ' [/INST]' }}"
        "{% elif m['role'] == 'assistant' %}{{ m['content'] + '</s>' }}{% endif %}{% endfor %}"
    )
    assert templates.derive(chat_data.renderer(tokenizer, mistral)).system_prefix is None
    # turns rendered differently by position have no turn format: Ollama is refused
    by_position = (
        "{% for m in messages %}{{ ('Q: ' if loop.first else 'Then: ') + m['content'] + '\\n' }}{% endfor %}"
    )
    assert templates.derive(chat_data.renderer(tokenizer, by_position)) is None


@pytest.mark.slow
def test_a_4bit_runs_adapter_merges_into_the_16bit_base(tmp_path):
    """An adapter trained on a 4-bit base exports from the 16-bit base: the merged weights are the
    base's float32 weights + B A, not the 4-bit ones."""
    pytest.importorskip("bitsandbytes")
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig

    from xtrain import builtin
    from xtrain.model.quantization import bnb_settings

    base = builtin.ensure_builtin_model(
        "builtin:tiny-llama", tmp_path.parent / "offline-caches" / "xtrain" / "builtin"
    )
    four = AutoModelForCausalLM.from_pretrained(
        base,
        quantization_config=BitsAndBytesConfig(**bnb_settings("4bit", None, "cpu")),
        device_map={"": "cpu"},
    )
    peft = get_peft_model(four, LoraConfig(r=4, target_modules=TARGETS, init_lora_weights=False))
    run = tmp_path / "qrun"
    peft.save_pretrained(run / "adapter")
    AutoTokenizer.from_pretrained(base).save_pretrained(run / "adapter")
    record = {"task": "causal-lm", "chat": False, "quantization": "4bit", "data": {}}
    (run / "adapter" / "xtrain_run.json").write_text(json.dumps(record))
    result = _export(run, "merged", tmp_path / "m")
    assert any("4bit base" in n for n in result.notes)
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "m")
    plain = AutoModelForCausalLM.from_pretrained(base)
    delta = merged.model.layers[0].mlp.down_proj.weight - plain.model.layers[0].mlp.down_proj.weight
    lora = peft.base_model.model.model.layers[0].mlp.down_proj
    expected = (lora.lora_B["default"].weight @ lora.lora_A["default"].weight) * lora.scaling["default"]
    torch.testing.assert_close(delta, expected, rtol=0, atol=1e-5)


# -- refusals: one line, exit 2, nothing written -------------------------------------------------


def _cli(argv: list[str], capsys) -> tuple[int, str]:
    from xtrain.cli import main

    capsys.readouterr()  # what the test's own setup printed
    code = main(argv)
    return code, capsys.readouterr().err


def test_refusals_are_one_line_with_exit_2(llama_run, tmp_path, capsys, monkeypatch):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    cases = [
        (["export", str(llama_run), "--to", "onnx", "-o", str(tmp_path / "a")], "not an export target"),
        (
            ["export", str(llama_run), "--to", "merged", "--to", "gguf,onnx", "-o", str(tmp_path / "a")],
            "--to onnx: not an export target",
        ),
        (
            ["export", str(llama_run), "--to", "gguf", "--type", "q4_k", "-o", str(tmp_path / "a")],
            "not a GGUF",
        ),
        (["export", str(llama_run), "--to", "gguf", "-o", str(out)], "already exists"),
        (
            ["export", str(llama_run), "--to", "ollama", "--type", "q8_0,q4_0", "-o", str(tmp_path / "a")],
            "pass one --type for ollama",
        ),
        (["export", str(tmp_path / "nothing"), "--to", "gguf", "-o", str(tmp_path / "a")], "is not a folder"),
    ]
    for argv, words in cases:
        code, err = _cli(argv, capsys)
        assert code == 2 and words in err and len(err.strip().splitlines()) == 1, (argv, err)
    assert (out / "keep.txt").read_text() == "mine" and not (tmp_path / "a").exists()
    import builtins

    real_import = builtins.__import__

    def no_gguf(name, *args, **kwargs):
        if name == "gguf":
            raise ImportError("no gguf")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_gguf)
    code, err = _cli(["export", str(llama_run), "--to", "gguf", "-o", str(tmp_path / "b")], capsys)
    assert code == 2 and 'pip install "gguf>=0.10"' in err and "xtrain[" not in err


def test_unsupported_family_is_refused_naming_the_supported_ones(tmp_path, capsys):
    from transformers import GPTNeoXConfig, GPTNeoXForCausalLM

    from xtrain.builtin.text import build_tokenizer

    tokenizer = build_tokenizer("llama")
    config = GPTNeoXConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
        vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    GPTNeoXForCausalLM(config).save_pretrained(tmp_path / "neox")
    tokenizer.save_pretrained(tmp_path / "neox")
    code, err = _cli(["export", str(tmp_path / "neox"), "--to", "gguf", "-o", str(tmp_path / "o")], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "Llama, Mistral, Qwen2/2.5, Gemma 2, Phi-3" in err and "gpt_neox" in err


def test_the_cli_exports_and_prints_the_checks_files_and_next_command(llama_run, tmp_path, capsys):
    """What docs/export.md's ``xtrain export`` lines run (its commands are covered here)."""
    from xtrain.cli import main

    capsys.readouterr()
    code = main(["export", str(llama_run), "--to", "ollama", "--output", str(tmp_path / "o")])
    printed = capsys.readouterr().out
    assert code == 0
    assert "ok merged:" in printed and "ok file:" in printed and "ok template:" in printed
    assert "cost q8_0: logits within" in printed
    assert "model-q8_0.gguf" in printed and "Modelfile" in printed
    assert f"ollama create {llama_run.name} -f Modelfile" in printed


@pytest.mark.parametrize("to", ["merged", "gguf"])
def test_too_little_ram_is_refused_before_anything_loads(llama_run, tmp_path, capsys, monkeypatch, to):
    from xtrain.export import memory, pipeline

    def no_weights(*args, **kwargs):
        raise AssertionError("a weight loaded before the RAM check")

    monkeypatch.setattr(memory, "available_bytes", lambda: 2**20)
    monkeypatch.setattr(pipeline, "merged_model", no_weights)
    code, err = _cli(["export", str(llama_run), "--to", to, "-o", str(tmp_path / "o")], capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "GiB of RAM" in err and "0.0 GiB available" in err
    assert not (tmp_path / "o").exists() and not (tmp_path / "o.tmp").exists()


def test_the_ram_estimate_is_the_weights_plus_one_tensor_in_float32():
    from transformers import LlamaConfig, LlamaForCausalLM

    from xtrain.errors import XtrainError
    from xtrain.export import memory

    config = LlamaConfig(
        hidden_size=4096, num_hidden_layers=32, intermediate_size=11008, num_attention_heads=32,
        num_key_value_heads=32, vocab_size=32000, dtype="bfloat16",
    )  # fmt: skip
    sizes = memory.model_sizes(LlamaForCausalLM, config)  # a Llama-2-7B shape, on the meta device
    assert sizes.parameters == 6_738_415_616 and sizes.weight_bytes == 2 * sizes.parameters
    assert sizes.largest == 32000 * 4096
    need = memory.need_bytes(sizes)
    assert sizes.weight_bytes < need < sizes.weight_bytes + 2 * 2**30  # 12.6 GiB of weights + ~2 GiB
    memory.check_memory(sizes, None)  # unknown: no refusal
    memory.check_memory(sizes, need)
    with pytest.raises(XtrainError, match="needs about 14.5 GiB of RAM"):
        memory.check_memory(sizes, need - 1)


def test_float32_logits_of_a_16bit_model_without_a_float32_copy(llama_run):
    from xtrain.export import parity

    model = _base_plus_adapter(llama_run).merge_and_unload().to(torch.bfloat16).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    got = parity.logits_float32(model, [IDS])
    for k, v in model.state_dict().items():  # the 16-bit weights are back as they were
        assert v.dtype == torch.bfloat16 and torch.equal(v, before[k]), k
    assert torch.equal(got[0], parity.logits(model.float(), [IDS])[0])
