"""GRPO's agents (issue 49): tools as the user's functions (found, their schemas derived or given,
each failure one line), run with a time limit (an exception, a hang, a flood or prints become the
call's result and one line; a tool that keeps hanging stops the run in one line, resumable), the
template's tool turns after the model's own tokens in every shipped template, the episode's turns
and limits, the ``tool_call`` reward, and the gradients of an episode's loss (the tool turns
masked) against the loss written by hand over a plain peft model.

The episodes here are scripted (``Scripted``: a decoder that writes given turns) where a test needs
calls from a random model; the real decode loop's episodes are tested at 1 and 2 processes in
tests/test_grpo_tools_processes.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from xtrain.errors import XtrainError
from xtrain.tasks.grpo import episodes as ep
from xtrain.tasks.grpo import rewards as rw
from xtrain.tasks.grpo import tools as tl

pytestmark = pytest.mark.usefixtures("private_caches")

TOOLS = '''\
import time


def square(n: int) -> int:
    """The square of a number.

    Args:
        n: the number
    """
    return n * n


def bare(x):
    return x


def raises(n: int) -> int:
    """Always fails.

    Args:
        n: a number
    """
    raise ValueError("no such number")


def hangs(n: int) -> int:
    """Never returns.

    Args:
        n: a number
    """
    time.sleep(60)


def floods(n: int) -> str:
    """A result too long to read.

    Args:
        n: a number
    """
    return "x" * 1_000_000


async def later(n: int) -> int:
    """A square, awaited.

    Args:
        n: a number
    """
    return n * n


def prints(n: int) -> str:
    """Talks on stdout.

    Args:
        n: a number
    """
    print("y" * 999)
    return "ok"
'''


@pytest.fixture(scope="module")
def tools_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tools") / "tools.py"
    path.write_text(TOOLS)
    return path


# -- found and described ----------------------------------------------------------------------------
def test_schemas_come_from_signatures_and_docstrings_or_the_data_tools_file(tools_file, tmp_path):
    (square,) = tl.resolve([f"{tools_file}:square"], None)
    assert square.schema == {
        "type": "function",
        "function": {
            "name": "square",
            "description": "The square of a number.",
            "parameters": {
                "type": "object",
                "properties": {"n": {"type": "integer", "description": "the number"}},
                "required": ["n"],
            },
        },
    }
    given = tmp_path / "schemas.json"
    given.write_text(json.dumps([{"name": "bare", "parameters": {"type": "object"}}]))
    _, bare = tl.resolve([f"{tools_file}:square", f"{tools_file}:bare"], str(given))
    assert bare.schema == {"type": "function", "function": {"name": "bare", "parameters": {"type": "object"}}}


@pytest.mark.parametrize(
    ("specs", "says"),
    [
        (["{f}:bare"], "grpo.tools: {f}:bare has no JSON schema from its signature and docstring: "),
        (["{f}:nothing"], "grpo.tools: {f} has no function 'nothing'"),
        (["{f}:square", "{f}:square"], "grpo.tools: two tools are named 'square'"),
        (["missing.py:square"], "grpo.tools: tool file missing.py not found"),
        (["no_such_module_x:f"], "grpo.tools: module no_such_module_x cannot be imported"),
    ],
)
def test_a_tool_that_cannot_be_used_is_one_line(tools_file, specs, says):
    with pytest.raises(XtrainError) as e:
        tl.resolve([s.format(f=tools_file) for s in specs], None)
    assert str(e.value).startswith(says.format(f=tools_file)) and "\n" not in str(e.value)


def test_a_data_tools_schema_without_its_function_is_one_line(tools_file, tmp_path):
    given = tmp_path / "schemas.json"
    given.write_text(json.dumps([{"name": "search", "parameters": {"type": "object"}}]))
    with pytest.raises(XtrainError, match="data.tools declares search, which grpo.tools does not name"):
        tl.resolve([f"{tools_file}:square"], str(given))


def test_tool_files_are_found_next_to_the_config(tools_file, tmp_path, monkeypatch):
    from xtrain.config.loading import read_config

    job = tools_file.parent / "job.yaml"
    job.write_text("model: {task: grpo}\ngrpo: {tools: [tools.py:square, xtrain.builtin.agent_grpo:cube]}\n")
    monkeypatch.chdir(tmp_path)  # elsewhere
    cfg = read_config(job)
    assert cfg.grpo.tools == [f"{tools_file.resolve()}:square", "xtrain.builtin.agent_grpo:cube"]


# -- run -----------------------------------------------------------------------------------------
def test_a_raising_hanging_flooding_or_printing_tool_is_a_result_and_one_line(tools_file, capsys):
    names = ("square", "raises", "hangs", "floods", "prints", "later")
    runner = tl.Runner(tl.resolve([f"{tools_file}:{n}" for n in names], None), timeout=0.05)
    runner.where = " (step 3)"
    with runner.session():
        assert runner.call("square", {"n": 7}) == tl.Result("49", True)
        assert runner.call("square", {"m": 7}).text.startswith("error: TypeError: ")
        assert runner.call("raises", {"n": 1}) == tl.Result("error: ValueError: no such number", False)
        assert (
            runner.call("nope", {}).text
            == f"error: there is no tool named 'nope' (tools: {', '.join(names)})"
        )
        assert runner.call("hangs", {"n": 1}) == tl.Result("error: hangs did not return within 0.05 s", False)
        flood = runner.call("floods", {"n": 1})
        assert flood.text.endswith(f"[cut: {1_000_000 - tl.RESULT_CHARS} more characters]")
        assert len(flood.text) < tl.RESULT_CHARS + 50
        assert runner.call("prints", {"n": 1}) == tl.Result("ok", True)
        assert runner.call("later", {"n": 3}) == tl.Result("9", True)  # an async tool, awaited
    assert capsys.readouterr().out == ""  # what a tool prints is kept out of the console
    notes = runner.notes()
    assert notes == [
        "grpo.tools: floods: of 1 calls, 1 results over 20000 characters were cut: the model read each as "
        "the call's result",
        "grpo.tools: hangs: of 1 calls, 1 did not return within grpo.tool_timeout=0.05 s: the model read "
        "each as the call's result",
        "grpo.tools: raises: of 1 calls, 1 raised (first: ValueError: no such number): the model read each "
        "as the call's result",
        "grpo.tools: square: of 2 calls, 1 raised (first: TypeError: square() got an unexpected keyword "
        "argument 'm'): the model read each as the call's result",
        "grpo.tools: prints printed 1000 characters, not shown (what a tool returns is its result)",
    ]
    assert runner.notes() == []  # counted since the last notes
    for _ in range(tl.HUNG_LIMIT - 2):
        runner.call("hangs", {"n": 1})
    with pytest.raises(tl.ToolHung) as e:
        runner.call("hangs", {"n": 1})
    line = str(e.value)
    assert line.startswith(
        f"tool {tools_file}:hangs hangs: {tl.HUNG_LIMIT} of its calls are still running past "
        "grpo.tool_timeout=0.05 s (step 3)"
    )
    assert "\n" not in line and "resumes from its last checkpoint" in line


def test_the_tool_call_reward_wants_declared_functions_and_their_arguments(tools_file):
    (tool,) = tl.resolve([f"{tools_file}:square"], None)
    reward = rw.resolve(_grpo(["tool_call"]), [tool.schema])[0].fn
    calls = [
        [{"name": "square", "arguments": {"n": 3}, "result": "9"}],
        [{"name": "square", "arguments": {"n": 3}, "result": None}],  # a last turn's: not run, valid
        [{"name": "cube", "arguments": {"n": 3}, "result": "error: ..."}],
        [{"name": "square", "arguments": {}, "result": "error: ..."}],
        [{"name": "square", "arguments": {"n": 3, "m": 1}, "result": "error: ..."}],
        [],
    ]
    assert reward(prompts=[""] * 6, completions=[[]] * 6, tool_calls=calls) == [1, 1, 0, 0, 0, 0]
    with pytest.raises(XtrainError, match="tool_call scores the calls of episodes: it needs grpo.tools"):
        rw.resolve(_grpo(["tool_call"]))


def _grpo(rewards: list[str]):
    from xtrain.config.schema import GrpoConfig

    return GrpoConfig(rewards=rewards)


# -- the template's tool turns -------------------------------------------------------------------
@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    from xtrain import builtin

    cache = tmp_path_factory.getbasetemp() / "offline-caches" / "xtrain" / "builtin"
    return AutoTokenizer.from_pretrained(builtin.ensure_builtin_model("builtin:tiny-agent", cache))


MARKERS = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>",
           "<|python_tag|>", "<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]",
           "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"]  # fmt: skip


@pytest.fixture(scope="module")
def family_tokenizer(tokenizer):
    """The tiny tokenizer with the special tokens of the families' templates (one token each, as
    in their own tokenizers)."""
    import copy

    out = copy.deepcopy(tokenizer)
    out.add_special_tokens({"additional_special_tokens": MARKERS})
    return out


@pytest.mark.parametrize("name", ["tiny-agent", "qwen2.5", "qwen3", "llama3.1", "llama3.2", "mistral"])
def test_the_tool_turns_follow_the_model_s_turn_as_the_template_renders_them(family_tokenizer, name):
    """The model's calling turn (up to its end token) and ``ToolTurns`` after it are the tokens the
    template gives the whole conversation with the assistant's next turn opened."""
    from xtrain.data import templates
    from xtrain.data.rows import chat

    tokenizer = family_tokenizer
    template = tokenizer.chat_template if name == "tiny-agent" else templates.named(name)
    render = chat.renderer(tokenizer, template, None, {"enable_thinking": False} if name == "qwen3" else None)
    eos = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|eot_id|>", "</s>"])
    call = {"id": "call00001", "type": "function", "function": {"name": "square", "arguments": {"n": 7}}}
    result = {"role": "tool", "content": "49", "tool_call_id": "call00001", "name": "square"}
    before = [
        {"role": "user", "content": "what is 7 squared?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
    ]
    ids = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    turn = ids(render(before, False))
    ends = [i for i, t in enumerate(turn) if t in eos]
    turn = turn[: ends[-1] + 1] if ends else turn  # the model stops at its end token
    between = ep.ToolTurns(tokenizer, render, eos).ids([result])
    if name == "qwen3":  # a last turn renders an empty thinking block that a result drops: the episode
        # keeps what the model saw (its prompt opened the turn with it), the tool turns follow
        assert tokenizer.decode(between) == (
            "\n<|im_start|>user\n<tool_response>\n49\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
            "<think>\n\n</think>\n\n"
        )
        return
    assert turn + between == ids(render([*before, result], True))
    assert "49" in tokenizer.decode(between)


# -- the episode -----------------------------------------------------------------------------------------
class Scripted:
    """A ``Decoder`` stand-in that writes given turns: ``turns[row][t]`` is row's turn t (text; the
    end token added), whatever the model would have drawn; the episode logic runs as it is."""

    def __init__(self, tokenizer, turns: list[list[str]], stop: int) -> None:
        self.tokenizer, self.turns, self.stop = tokenizer, turns, stop
        self.rows: list[int] = []
        self.turn = 0
        self.extended: list[torch.Tensor] = []

    def prefill(self, ids, mask, group=1):
        self.rows = list(range(ids.size(0) * group))

    def decode(self, max_new_tokens, sampling=None, seeds=None):
        from xtrain.model.decoding import Completions

        out = []
        for r in self.rows:
            tokens = self.tokenizer(self.turns[r][self.turn], add_special_tokens=False)["input_ids"] + [
                self.stop
            ]
            out.append(tokens[:max_new_tokens])
        self.turn += 1
        width = max(map(len, out))
        ids = torch.tensor([t + [0] * (width - len(t)) for t in out])
        mask = torch.tensor([[1] * len(t) + [0] * (width - len(t)) for t in out])
        truncated = torch.tensor([t[-1] != self.stop for t in out])
        return Completions(ids, mask, truncated)

    def keep(self, rows):
        self.rows = [self.rows[k] for k in rows.tolist()]

    def extend(self, ids, mask):
        self.extended.append(ids[mask.bool()])


def _call(name: str, **args) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>"


def _agent(tokenizer, tools_file, **limits) -> ep.Agent:
    from xtrain.data.rows import chat

    eos = [tokenizer.eos_token_id]
    render = chat.renderer(tokenizer, tokenizer.chat_template)
    found = tl.resolve([f"{tools_file}:square", f"{tools_file}:raises"], None)
    settings = {"max_turns": 3, "max_completion_length": 60, "max_episode_length": 200, "max_tool_calls": 2}
    return ep.Agent(
        tokenizer,
        ep.ToolTurns(tokenizer, render, eos),
        tl.Runner(found, 1.0),
        ep.Limits(**{**settings, **limits}),
    )


def test_an_episode_runs_its_calls_and_trains_only_the_model_s_turns(tokenizer, tools_file):
    agent = _agent(tokenizer, tools_file)
    turns = [
        [_call("square", n=7), "49"],  # call, answer
        ["i think it is 50."],  # an answer at once
        [
            _call("raises", n=1),
            _call("square", n=2) + _call("square", n=3),
            "4",
        ],  # the 3rd call over the limit
        [_call("square", n=2), _call("square", n=3), _call("square", n=4)],  # the last turn's call: not run
    ]
    stop = tokenizer.eos_token_id
    decoder = Scripted(tokenizer, turns, stop)
    prompt = torch.tensor([[5, 6, 7]])
    done = agent.run(decoder, prompt, torch.ones_like(prompt), 4, None, None)
    first, second, third, fourth = done
    assert [m["role"] for m in first.messages] == ["assistant", "tool", "assistant"]
    assert first.calls == [{"name": "square", "arguments": {"n": 7}, "result": "49"}]
    assert first.answer == "49" and (first.turns, first.failures, first.truncated) == (2, 0, False)
    assert second.answer == "i think it is 50." and second.calls == [] and second.turns == 1
    assert [c["result"] for c in third.calls] == [
        "error: ValueError: no such number",
        "4",
        "error: no tool calls left (grpo.max_tool_calls=2)",
    ]
    assert third.failures == 2 and third.answer == "4"
    assert [c["result"] for c in fourth.calls] == ["4", "9", None] and fourth.turns == 3
    assert fourth.messages[-1]["tool_calls"][0]["function"] == {"name": "square", "arguments": {"n": 4}}
    # the model's own tokens train; the tool turns (what the decoder was extended by) do not
    model_tokens = [tokenizer(t, add_special_tokens=False)["input_ids"] + [stop] for t in turns[0]]
    between = [t for t, trained in zip(first.ids, first.trained, strict=True) if not trained]
    assert [t for t, trained in zip(first.ids, first.trained, strict=True) if trained] == sum(
        model_tokens, []
    )
    assert between == decoder.extended[0][: len(between)].tolist()
    assert "<|im_start|>tool\n49" in tokenizer.decode(between)
    batch = ep.as_batch(done, 0, torch.device("cpu"))
    assert batch["trained"].sum().item() == sum(sum(e.trained) for e in done)
    assert batch["mask"].sum(1).tolist() == [len(e.ids) for e in done]
    assert ep.shown(first) == 'square {"n": 7} -> 49 | 49'


def test_an_episode_stops_at_its_token_limit(tokenizer, tools_file):
    turns = [[_call("square", n=7), "49"], ["a long answer " * 10]]
    done = _agent(tokenizer, tools_file, max_episode_length=24, max_completion_length=40).run(
        Scripted(tokenizer, turns, tokenizer.eos_token_id),
        torch.tensor([[5]]),
        torch.ones(1, 1),
        2,
        None,
        None,
    )
    calling, long = done
    assert calling.truncated and calling.calls[0]["result"] == "49" and len(calling.messages) == 1
    assert calling.ids == calling.ids[: len(calling.trained)] and all(
        calling.trained
    )  # no room for the result
    assert long.truncated and len(long.ids) == 24


# -- a real step: the gradients of an episode's loss -----------------------------------------------
# each group's four episodes: a call and the right answer, a call and a wrong one, a guess, a call
# whose arguments do not fit (an error as its result) and then the right answer
SCRIPT = [
    [_call("square", n=7), "49"],
    [_call("square", n=7), "48"],
    ["i think it is 50."],
    [_call("square", m=7), "49"],
]


def _job(tmp_path: Path, tools_file: Path, *extra: str):
    from support.gradients import jsonl

    from xtrain.tasks.validation import load_config

    rows = [{"prompt": [{"role": "user", "content": "what is 7 squared?"}], "answer": "49"}] * 8
    train = jsonl(tmp_path / "data" / "train.jsonl", rows)
    return load_config(
        None,
        [f"run.output_dir={tmp_path / 'out'}", "run.report_to=none", "run.max_steps=1",
         "run.eval_at_start=false", "run.eval_every=null", "optim.max_grad_norm=null", "optim.warmup_steps=0",
         "model.name_or_path=builtin:tiny-agent", "model.task=grpo", f"data.train={train}", "data.eval=null",
         "data.max_length=64", "lora.dropout=0.0", "grpo.num_generations=4", "grpo.max_completion_length=40",
         "grpo.max_episode_length=120", f"grpo.tools=[{tools_file}:square]",
         "grpo.rewards=[exact_match, tool_call]", "grpo.reward_weights=[1.0, 0.5]", "batch.per_device=8",
         "batch.global_batch=16", *extra],
    )  # fmt: skip


def scripted(step, script: list[list[str]] = SCRIPT) -> None:
    """The run's episodes written by ``Scripted`` (sample k of a group plays ``script[k]``)."""
    tok = step.encoder.tokenizer

    def decoder(model, sharded):
        return Scripted(tok, [script[k % len(script)] for k in range(64)], tok.eos_token_id)

    step.decoder = decoder


def test_the_gradients_equal_the_episode_loss_by_hand_over_a_plain_peft_model(
    tmp_path, tools_file, tokenizer
):
    """A step of dapo with the KL to the reference over two micro-batches of scripted episodes (the
    tool really runs): each sequence is the template's own rendering of the conversation so far and
    the last turn; the loss by hand trains the model's turns only (the tool turns and the template's
    text between them masked), with the advantages of rewards recomputed by hand."""
    from support.gradients import (
        assert_same_gradients,
        grpo_token_loss,
        record_forward,
        reference_model,
        xtrain_gradients,
    )

    beta, temperature, batches = 0.2, 0.8, []
    cfg = _job(tmp_path, tools_file, f"grpo.beta={beta}", f"grpo.temperature={temperature}")

    def record(workload):
        scripted(workload.forward)
        record_forward(workload, batches)

    capture = xtrain_gradients(cfg, on_workload=record)
    assert len(batches) == 2
    ref, (schema,) = (
        reference_model(capture).train(),
        [t.schema for t in tl.resolve([f"{tools_file}:square"], None)],
    )
    ids = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    end = [tokenizer.eos_token_id]
    user = [{"role": "user", "content": "what is 7 squared?"}]
    sums, tokens = [], 0.0
    for batch in batches:
        rewards, expected, trained = [], [], []
        for k in range(8):
            turns = SCRIPT[k % 4]
            conversation = [*user]
            if len(turns) == 2:  # a call, its result (the tool run by hand), then the answer
                args = json.loads(turns[0][len("<tool_call>") : -len("</tool_call>")])["arguments"]
                result = (
                    str(args["n"] ** 2)
                    if "n" in args
                    else "error: TypeError: square() got an unexpected keyword argument 'm'"
                )
                call = {
                    "id": "call00001",
                    "type": "function",
                    "function": {"name": "square", "arguments": args},
                }
                answer = {"role": "tool", "content": result, "tool_call_id": "call00001", "name": "square"}
                conversation += [{"role": "assistant", "content": "", "tool_calls": [call]}, answer]
            prompt = ids(
                tokenizer.apply_chat_template(
                    user, tools=[schema], tokenize=False, add_generation_prompt=True
                )
            )
            context = ids(
                tokenizer.apply_chat_template(
                    conversation, tools=[schema], tokenize=False, add_generation_prompt=True
                )
            )
            first = ids(turns[0]) + end
            if len(turns) == 2:  # the call's turn is the model's own tokens: the context renders the same
                assert context[len(prompt) : len(prompt) + len(first)] == first
            last = ids(turns[-1]) + end
            sequence = context + last
            mask = (
                [0] * len(prompt)
                + [1] * len(first)
                + [0] * (len(context) - len(prompt) - len(first))
                + [1] * len(last)
            )
            if len(turns) == 1:
                sequence, mask = prompt + last, [0] * len(prompt) + [1] * len(last)
            expected.append(sequence)
            trained.append(mask)
            exact = float(turns[-1] == "49")
            valid = float(len(turns) == 2 and "n" in args)
            rewards.append(exact + 0.5 * valid)
        got = [
            row[m.bool()].tolist() for row, m in zip(batch["input_ids"], batch["attention_mask"], strict=True)
        ]
        assert got == expected  # the template's own text around the tool's result
        width = batch["completion_mask"].size(1)
        mask = torch.zeros(8, width)
        for k, (row, m) in enumerate(zip(expected, trained, strict=True)):
            after = m[len(m) - (len(row) - int(batch["attention_mask"][k, :-width].sum())) :]
            mask[k, : len(after)] = torch.tensor(after, dtype=torch.float)
        assert torch.equal(batch["completion_mask"].float(), mask)  # the model's turns only
        r = torch.tensor(rewards).view(-1, 4)
        adv = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)).reshape(-1)
        torch.testing.assert_close(batch["advantages"], adv)
        per_token = grpo_token_loss(ref, batch, adv, temperature, beta)
        sums.append((per_token * mask).sum())
        tokens += float(mask.sum())
    (sum(sums) / tokens).backward()  # dapo: every trained token of the global batch
    want = {n: p.grad.detach().float().cpu() for n, p in ref.named_parameters() if p.grad is not None}
    assert_same_gradients(capture.grads, want)


def test_a_hanging_tool_stops_the_run_in_one_line_and_the_run_resumes(tmp_path, tools_file, monkeypatch):
    """A tool that stops returning at its 33rd call (the third step: 16 episodes a step, one call
    each): its calls time out (their results errors) until ``HUNG_LIMIT`` of them still run, then
    one line names it; the step-2 checkpoint is whole, and the same command resumes from it once
    the tool returns again: the same adapter, to the bit, as a run whose tool never hung."""
    from support.jobs import adapter_weights

    from xtrain.machine.facts import Facts
    from xtrain.planning.rules import make_plan
    from xtrain.tasks import build_workload
    from xtrain.train.loop import train

    sometimes = tmp_path / "sometimes.py"
    sometimes.write_text(
        "import os, time\n"
        "calls = []\n"
        "def square(n: int) -> int:\n"
        '    """A square that hangs from its 33rd call.\n\n    Args:\n        n: the number\n    """\n'
        "    calls.append(n)\n"
        "    if len(calls) > 32 and not os.environ.get('TOOL_FIXED'):\n"
        "        time.sleep(60)\n"
        "    return n * n\n"
    )

    def build(run, main_process_first):
        workload = build_workload(run, main_process_first)
        scripted(workload.forward, [SCRIPT[0]])
        return workload

    cfg = _job(tmp_path, sometimes, "run.max_steps=4", "run.save_every=2", "grpo.tool_timeout=0.2")
    plan = make_plan(Facts(torch_version="2.13.0", gloo_available=True))
    with pytest.raises(tl.ToolHung) as e:
        train(cfg, plan, build=build)
    line = str(e.value)
    assert line.startswith(
        f"tool {sometimes}:square hangs: {tl.HUNG_LIMIT} of its calls are still running past "
        "grpo.tool_timeout=0.2 s (step 2, rows ["
    )
    assert "\n" not in line
    step = tmp_path / "out" / "checkpoints" / "step-2"
    assert json.loads((step / "xtrain_state.json").read_text())["step"] == 2
    monkeypatch.setenv("TOOL_FIXED", "1")
    cfg = _job(
        tmp_path, sometimes, "run.max_steps=4", "run.save_every=2", "grpo.tool_timeout=0.2", "run.resume=auto"
    )
    train(cfg, plan, build=build)
    result = json.loads((tmp_path / "out" / "train_result.json").read_text())
    assert result["final_step"] == 4 and result["resumed_from"].endswith("step-2")
    straight = tmp_path / "straight"
    cfg = _job(tmp_path, sometimes, "run.max_steps=4", "run.save_every=2", f"run.output_dir={straight}")
    train(cfg, plan, build=build)
    resumed, whole = adapter_weights(tmp_path / "out"), adapter_weights(straight)
    assert resumed.keys() == whole.keys() and all(torch.equal(resumed[k], whole[k]) for k in whole)


def test_the_dry_run_shows_the_tools_and_refuses_a_template_without_them(tmp_path, tools_file, capsys):
    from support.gradients import jsonl

    from xtrain.cli import main

    rows = [{"prompt": [{"role": "user", "content": "what is 7 squared?"}], "answer": "49"}] * 4
    train = jsonl(tmp_path / "train.jsonl", rows)
    job = tmp_path / "job.yaml"
    job.write_text(
        "model: {name_or_path: builtin:tiny-agent, task: grpo}\n"
        f"grpo: {{tools: [{tools_file}:square], num_generations: 4, rewards: [exact_match, tool_call]}}\n"
        f"data: {{train: {train}, max_length: 64}}\nbatch: {{per_device: 8, global_batch: 8}}\n"
    )
    assert main(["train", str(job), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert (
        "episodes of up to 4 turns and 512 tokens, 8 tool calls of up to 10 s each; tools: square(n)" in out
    )
    assert "tools: square(n)<|im_end|>" in out  # the prompt rendered with its tools
    assert main(["train", str(job), "--dry-run", "data.chat_template=chatml"]) == 2
    err = capsys.readouterr().err
    assert "grpo.tools: the chat template cannot render tools (no 'tools' in its source)" in err
    assert "Traceback" not in err
