"""xtrain's GGUF files in llama.cpp itself (PyPI's ``xllamacpp``: prebuilt llama.cpp, its server
in-process): every shipped and built-in chat template rendered and tokenized by llama.cpp as
training renders it, with and without tools; llama.cpp's tool-call parser over the agent
template; every GGUF type of the quickstart's trained run answering its 40 eval questions as
``xtrain predict`` does; the export's exact file check refusing a corrupted tensor, and a
template llama.cpp cannot run, while quantization's cost alone only warns. The trained agent
job's tool calls through llama.cpp's parser: behind ``soak`` (it trains for minutes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("gguf")
pytest.importorskip("xllamacpp")

pytestmark = pytest.mark.usefixtures("private_caches")

TYPES = ("f16", "bf16", "q8_0", "q6_k", "q5_k_m", "q4_k_m", "q4_0")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The built-in tiny llama with its tokenizer (bos ``<s>``, eos ``</s>``): a model to carry each
    template into a GGUF file (the templates' own markers are plain text to it, in both tokenizers)."""
    from support.jobs import session_builtin
    from transformers import AutoTokenizer, LlamaForCausalLM

    folder = session_builtin(tmp_path_factory, "builtin:tiny-llama")
    return LlamaForCausalLM.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)


def _gguf(model, tokenizer, template: str, folder: Path) -> tuple[Path, bool]:
    """``model`` with ``template`` as an f16 GGUF file, as the export writes it: (path, add_bos)."""
    from xtrain.data.rows import chat as chat_data
    from xtrain.export import gguf, parity
    from xtrain.export.vocab import read_vocab

    render = chat_data.renderer(tokenizer, template)
    bos = tokenizer.bos_token
    chat_bos = bool(bos) and render(list(parity.PROBES[0]), True).startswith(bos)
    eot = chat_data.end_of_turn(render, tokenizer)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "model-f16.gguf"
    gguf.write_gguf(model, tokenizer, path, "f16", template, eot, "t", None, chat_bos)
    return path, read_vocab(tokenizer, model.config.vocab_size, eot, chat_bos).add_bos


def _templates() -> dict[str, str]:
    from xtrain.builtin import agents, chat
    from xtrain.data import templates

    named = {name: templates.named(name) for name in templates.NAMES}
    return {**named, "builtin:tiny-llama-chat": chat.CHAT_TEMPLATE, "builtin:tiny-agent": agents.TEMPLATE}


@pytest.mark.parametrize("name", list(_templates()))
def test_each_template_renders_and_tokenizes_in_llamacpp_as_in_training(name, tiny, tmp_path):
    """The export's own llama.cpp check (``file_checks.template_in_llamacpp``) on every shipped
    template and the built-in ones: the probe conversations, and where the template renders
    tools, tools offered, a call, its result and a follow-up, equal to training's text and tokens."""
    from xtrain.data import templates
    from xtrain.data.rows import chat as chat_data
    from xtrain.export import file_checks, llamacpp

    model, tokenizer = tiny
    template = _templates()[name]
    path, add_bos = _gguf(model, tokenizer, template, tmp_path)
    render = chat_data.renderer(tokenizer, template)
    with llamacpp.Runtime(path, 1024) as llama:
        check = file_checks.template_in_llamacpp(llama, render, template, tokenizer, add_bos, path.name)
    tools = templates.renders_tools(template)
    assert ("with tools, a call and its result" in check.detail) == tools, check.detail
    assert f"xllamacpp {llamacpp.version()}" in check.detail


def _call_text(render, message: dict) -> str:
    """The assistant's call as training renders it: the text between the generation prompt and
    the end of its turn."""
    question = [{"role": "user", "content": "Weather in Paris?"}]
    before = render(question, True)
    after = render([*question, message], False)
    assert after.startswith(before)
    return after[len(before) :]


@pytest.mark.parametrize("name", ["builtin:tiny-agent", "qwen2.5"])
def test_llamacpps_parser_returns_the_call_the_template_renders(name, tiny, tmp_path):
    """llama.cpp's tool-call parser, generated from the file's template, reads back the call as
    training renders it (an assistant turn prefilled with it); with only the agent template's
    opening tag prefilled, its grammar makes even the untrained model call a declared function."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    from xtrain import builtin
    from xtrain.data.rows import chat as chat_data
    from xtrain.export import file_checks, llamacpp

    folder = builtin.ensure_builtin_model("builtin:tiny-agent")  # 1024 positions, ChatML's tokens
    model, tokenizer = LlamaForCausalLM.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)
    template = _templates()[name]
    path, _ = _gguf(model, tokenizer, template, tmp_path)
    render = chat_data.renderer(tokenizer, template).with_tools(file_checks.PROBE_TOOLS)
    message = {"role": "assistant", "content": "", "tool_calls": [file_checks.PROBE_CALL]}
    text = _call_text(render, message)
    call = text[: text.index("</tool_call>") + len("</tool_call>")]
    question = [{"role": "user", "content": "Weather in Paris?"}]
    tools = file_checks.PROBE_TOOLS
    with llamacpp.Runtime(path, 1024, prefill=True) as llama:
        reply = llama.chat([*question, {"role": "assistant", "content": call}], tools, 1, "required")
        assert reply.calls[0] == {"name": "get_weather", "arguments": {"city": "paris"}}
        opened = [*question, {"role": "assistant", "content": "<tool_call>"}]
        forced = llama.chat(opened, tools, 40, "required")
    if name == "builtin:tiny-agent":  # its grammar opens on the tag alone (Qwen's on the tag and a newline)
        assert forced.calls and forced.calls[0]["name"] == "get_weather"


def test_a_template_llamacpp_cannot_run_is_refused_naming_the_construct(tmp_path, capsys):
    """The built-in agent template as it was (``properties | list``: no ``list`` filter on a mapping
    in llama.cpp's Jinja) exports to nothing, in one line naming the construct and the fix."""
    from transformers import AutoTokenizer

    from xtrain import builtin
    from xtrain.builtin import agents
    from xtrain.cli import main

    folder = tmp_path / "agent"
    source = builtin.ensure_builtin_model("builtin:tiny-agent")
    (folder).mkdir()
    for f in source.iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    tokenizer = AutoTokenizer.from_pretrained(folder)
    old = "(tool.function.parameters.properties | list | join(', '))"
    tokenizer.chat_template = agents.TEMPLATE.replace(
        "(tool.function.parameters.properties.keys() | join(', '))", old
    )
    tokenizer.save_pretrained(folder)
    (folder / "xtrain_run.json").write_text(json.dumps({"task": "causal-lm", "chat": True, "data": {}}))
    capsys.readouterr()
    code = main(["export", str(folder), "--to", "gguf", "--type", "f16", "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == 1 and len(err.strip().splitlines()) == 1, err
    assert "llama.cpp cannot run the chat template in model-f16.gguf" in err
    assert "Unknown (built-in) filter 'list' for type Object at `" in err and "| list |" in err
    assert "docs/export.md#llamacpp" in err and not (tmp_path / "out").exists()


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory) -> Path:
    """The built-in chat model (untrained) as a run's model folder: a cheap export."""
    from support.jobs import session_builtin

    folder = tmp_path_factory.mktemp("chat-model")
    for f in session_builtin(tmp_path_factory, "builtin:tiny-llama-chat").iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    record = {"task": "causal-lm", "chat": True, "data": {"eval": "builtin:chat"}}
    (folder / "xtrain_run.json").write_text(json.dumps(record))
    return folder


def test_a_corrupted_tensor_is_refused_naming_it(chat_model, tmp_path, monkeypatch):
    """A byte of one tensor flipped on its way into the file (after xtrain computed it): the read
    back finds it, names it, and nothing is handed over."""
    from gguf import GGUFWriter

    from xtrain.export.parity import ParityError
    from xtrain.export.pipeline import ExportRequest, export

    real = GGUFWriter.write_tensor_data
    count = []

    def flip(self, tensor, *args, **kwargs):
        count.append(1)
        if len(count) == 3:  # the third tensor: blk.0.attn_norm.weight
            tensor = tensor.copy()
            tensor.reshape(-1).view("uint8")[7] ^= 0x10
        return real(self, tensor, *args, **kwargs)

    monkeypatch.setattr(GGUFWriter, "write_tensor_data", flip)
    with pytest.raises(ParityError, match=r"the tensor \S+ reads back as other bytes") as found:
        export(ExportRequest(str(chat_model), "gguf", tmp_path / "out", gguf_type="q8_0", eval_prompts=0))
    assert "model-q8_0.gguf" in found.value.message and not (tmp_path / "out").exists()


def test_quantizations_cost_alone_warns_and_several_types_share_one_merge(
    chat_model, tmp_path, monkeypatch, capsys
):
    """``--type q4_0 --type q8_0``: one merge, a file of each, each checked; a cost past the
    warning level (set to nothing here) is a warning, never a refusal; the closing table shows the
    eval prompts answered by xtrain and by llama.cpp for each file."""
    from xtrain.cli import main
    from xtrain.export import parity, pipeline

    merges = []
    real = pipeline.merged_model
    monkeypatch.setattr(pipeline, "merged_model", lambda *a: merges.append(1) or real(*a))
    monkeypatch.setattr(parity, "COST_WARN", dict.fromkeys(parity.COST_WARN, 0.0))
    out = tmp_path / "out"
    argv = ["export", str(chat_model), "--to", "gguf", "--type", "q4_0", "--type", "q8_0", "-o", str(out)]
    capsys.readouterr()
    assert main([*argv, "--eval-prompts", "4"]) == 0
    printed = capsys.readouterr().out
    assert len(merges) == 1 and sorted(p.name for p in out.iterdir()) == [
        "model-q4_0.gguf",
        "model-q8_0.gguf",
    ]
    for kind in ("q4_0", "q8_0"):
        assert f"ok file: model-{kind}.gguf" in printed and f"ok template: model-{kind}.gguf" in printed
        assert f"cost {kind}: logits within" in printed and f"warning {kind} moves this model" in printed
        assert f"llama.cpp {kind}" in printed  # a column of the answers table
    assert "of 4 eval prompts answered as the merged model (llama.cpp" in printed


def test_without_llamacpp_the_template_is_checked_with_jinja2_and_says_so(chat_model, tmp_path, monkeypatch):
    """Where xllamacpp is not installed (macOS): the same checks, the template rendered by Jinja2
    (the line says so and how to install llama.cpp), the eval prompts answered by transformers'
    reading of the file."""
    from xtrain.export import llamacpp
    from xtrain.export.pipeline import ExportRequest, export

    monkeypatch.setattr(llamacpp, "installed", lambda: False)
    result = export(ExportRequest(str(chat_model), "gguf", tmp_path / "out", eval_prompts=2))
    template = next(c.detail for c in result.checks if c.name == "template")
    assert "(Jinja2; llama.cpp itself checks it once xllamacpp is installed: pip install" in template
    (cost,) = result.costs
    assert cost.runtime == "transformers' GGUF reader" and cost.answered == 2
    assert result.prompts is not None and len(result.prompts.files["q8_0"]) == 2


@pytest.fixture(scope="module")
def quickstart_export(tmp_path_factory):
    """The README's first run (shared with test_quickstart.py), exported once in every type with
    its 40 eval questions answered by llama.cpp, and ``xtrain predict``'s answers to them."""
    from support.jobs import session_quickstart

    from xtrain import builtin
    from xtrain import predict as lib
    from xtrain.export import answers
    from xtrain.export.pipeline import ExportRequest, export
    from xtrain.tasks.contract import PredictRequest

    run = session_quickstart(tmp_path_factory)[1]
    out = tmp_path_factory.mktemp("quickstart-export") / "gguf"
    with (
        pytest.MonkeyPatch.context() as patch
    ):  # the session's built-ins (a module fixture: before private_caches)
        patch.setenv("XTRAIN_CACHE", str(tmp_path_factory.getbasetemp() / "offline-caches" / "xtrain"))
        result = export(ExportRequest(str(run), "gguf", out, gguf_type=list(TYPES), eval_prompts=40))
        request = PredictRequest([], [], max_new_tokens=answers.ANSWER_TOKENS, batch_size=20)
        predicted = lib.predict_file(run, builtin.builtin_data_file("builtin:chat", "eval"), request)
    return result, [r["output"] for r in predicted.rows]


def test_every_type_of_the_quickstart_run_answers_in_llamacpp_as_xtrain_predict(quickstart_export):
    """The quickstart run in llama.cpp: f16, bf16 and q8_0 (the default) answer the 40 eval
    questions exactly as ``xtrain predict``; the 4-6 bit types most of them (docs/export.md#types
    has the figures); every file read back exactly and its template checked in llama.cpp, none
    refused for what quantization moved."""
    result, predicted = quickstart_export
    prompts = result.prompts
    assert prompts is not None and len(prompts.examples) == 40 and prompts.merged == predicted
    same = {
        kind: sum(a == b for a, b in zip(found, predicted, strict=True))
        for kind, found in prompts.files.items()
    }
    print("answers as xtrain predict, of 40:", same, {c.kind: round(c.logits, 3) for c in result.costs})
    assert list(same) == list(TYPES)
    assert same["f16"] == same["bf16"] == same["q8_0"] == 40
    assert all(same[k] >= 34 for k in ("q6_k", "q5_k_m", "q4_k_m", "q4_0")), same
    names = [c.name for c in result.checks]
    assert names.count("file") == names.count("template") == len(TYPES)
    assert all(c.runtime.startswith("llama.cpp") for c in result.costs)


@pytest.mark.soak
def test_the_trained_agent_jobs_export_calls_tools_in_llamacpp(tmp_path):
    """examples/agent-tools.yaml trained (minutes), exported with the default type, asked each of
    its 100 eval rows with the row's tools in llama.cpp: the calls its parser returns are the
    reference calls for at least 90% of them (measured 94, as ``xtrain predict``: docs/export.md)."""
    import subprocess
    import sys
    import time

    from xtrain import builtin
    from xtrain.export import llamacpp
    from xtrain.export.pipeline import ExportRequest, export
    from xtrain.predict import read_examples

    repo = Path(__file__).resolve().parent.parent
    run = tmp_path / "agent"
    started = time.perf_counter()
    cmd = [sys.executable, "-m", "xtrain", "train", str(repo / "examples" / "agent-tools.yaml")]
    proc = subprocess.run([*cmd, f"run.output_dir={run}"], capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    trained = time.perf_counter() - started
    result = export(ExportRequest(str(run), "gguf", tmp_path / "gguf", eval_prompts=0))
    calls = builtin.ensure_builtin_data("builtin:tool-calls") / "eval-calls.jsonl"
    _, examples = read_examples(run, calls)
    exact = 0
    with llamacpp.Runtime(tmp_path / "gguf" / "model-q8_0.gguf", 1024) as llama:
        for e in examples:
            reply = llama.chat(e.feed.messages, e.feed.tools, 64)
            exact += reply.calls == json.loads(e.reference)
    share = exact / len(examples)
    print(f"agent job: trained in {trained:.0f} s; llama.cpp calls exact {exact}/{len(examples)}")
    assert share >= 0.9, (exact, result.costs)
