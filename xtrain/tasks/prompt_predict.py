"""``xtrain predict`` for the tasks that answer a prompt with a decoder-only model: causal-lm
(text prompts; a chat run's turns rendered by its saved template) and vision-language (image +
text turns rendered by the processor's template). Their ``--prompt``/``--question`` inputs and the
rows of a ``--data`` file become ``Example``s, rendered as training rendered the prompts before
its answers, left-padded into one ``generate`` call per batch, greedy or beam search
(``PredictRequest.decoding``); a causal LM's sampling runs xtrain's own decode loop
(``xtrain.model.decoding``: each row drawn from its own generator, seeded by ``--seed`` and the
row, so a row's sample does not depend on the batch it is in). Library code: returns data,
prints nothing. A chat run's tool calls (parsed, shown, scored) and ``--tools`` episodes are the
task's hooks (``contract.ToolUse``), handed in as ``tools`` by the task's ``Predicts``."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from xtrain.data.rows import columns as row_columns
from xtrain.data.rows import formats as row_formats
from xtrain.data.rows.formats import text_columns
from xtrain.errors import XtrainError
from xtrain.tasks.contract import Example, Loaded, PredictRequest, ToolUse
from xtrain.tasks.predicting import (
    exact_match,
    image_limit,
    in_batches,
    last_user_text,
    left_pad,
    load_file,
    media_files,
    pad_id,
    read_input,
    references,
    split_conversation,
    to_model,
)

if TYPE_CHECKING:
    from xtrain.config.schema import TrainConfig
    from xtrain.data.rows.chat import Render

# ---------------------------------------------------------------------------------------------
# causal-lm: prompts -> continuations


def chat_render(loaded: Loaded) -> tuple[Render, int | None]:
    """(render, the end-of-turn token to stop at) of a chat run: its saved template, with the
    run's ``data.chat_template_kwargs`` (its record's data settings)."""
    from xtrain.data.rows import chat as chat_data

    template = chat_data.require_template(loaded.tokenizer, None, loaded.source)
    kwargs = (loaded.parts.get("data") or {}).get("chat_template_kwargs")
    render = chat_data.renderer(
        loaded.tokenizer, template, None, kwargs if isinstance(kwargs, dict) else None
    )
    return render, chat_data.end_of_turn(render, loaded.tokenizer)


def chat_prompt(
    loaded: Loaded, prompt: str, system: str | None = None, tools: list[dict[str, Any]] | None = None
) -> tuple[str, int | None]:
    """(the text the model sees, the end-of-turn token to stop at) for a prompt: a chat run's
    prompt as a user turn (``system`` first; ``tools``: the schemas it may call) rendered by its
    saved template with the generation prompt, as training rendered it (``chat_data``); a plain
    run's prompt as it is."""
    from xtrain.data.rows import chat as chat_data

    if not loaded.parts.get("chat"):
        refuse_system(loaded, system)
        if tools:
            raise XtrainError(
                f"{loaded.source} was not trained on chat conversations: it has no template for tools",
                "leave out --tools",
            )
        return prompt, None
    render, stop = chat_render(loaded)
    conv = chat_data.Conversation(chat_data.user_turn(prompt, system=system, text_only=True), tools=tools)
    render = chat_data.with_tools(render, conv, "--tools")
    return render(conv.messages, True), stop


def refuse_system(loaded: Loaded, system: str | None) -> None:
    if system is not None:
        raise XtrainError(
            f"{loaded.source} was not trained on chat conversations: it continues text as it is",
            "leave out --system",
        )


def text_answer(
    loaded: Loaded, examples: list[Example], request: PredictRequest, tools: ToolUse | None = None
) -> list[dict[str, str]]:
    """Continuations of a batch of prompts (``Example.feed``: the text the model sees, or a chat
    run's turns, rendered here by its saved template with the generation prompt as training
    rendered the prompts before its answers), left-padded into one ``generate`` call that stops
    each row at the template's end-of-turn token or eos; a chat answer's call shown parsed
    (``tools``: the task's hooks)."""
    import torch

    from xtrain.data.rows import chat as chat_data

    tokenizer, chat = loaded.tokenizer, bool(loaded.parts.get("chat"))
    render, stop = chat_render(loaded) if chat else (None, None)
    rows = []
    for e in examples:
        if render is not None and isinstance(e.feed, chat_data.Conversation):  # an agent row: its tools
            text = chat_data.with_tools(render, e.feed, f"row {e.row}")(e.feed.messages, True)
        else:
            text = render(e.feed, True) if render is not None and isinstance(e.feed, list) else e.feed
        # a rendered chat prompt holds its own special tokens, as in training (chat_data.encode)
        enc = tokenizer(text, return_tensors="pt", add_special_tokens=not chat)
        rows.append({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]})
    pad = pad_id(tokenizer)
    batch = to_model(left_pad(rows, pad), loaded.model)
    eos = [t for t in (stop, tokenizer.eos_token_id) if t is not None]
    if request.sampling and request.num_beams == 1:
        ids = sampled(loaded.model, batch, request, [e.row for e in examples], pad, eos)
    else:
        with torch.no_grad():
            ids = loaded.model.generate(
                **batch,
                max_new_tokens=request.max_new_tokens,
                pad_token_id=pad,
                eos_token_id=eos or None,
                **request.decoding(),
            )[:, batch["input_ids"].shape[1] :]  # the output repeats the (left-padded) prompt
    out = [{"output": tokenizer.decode(r, skip_special_tokens=True).strip()} for r in ids]
    for o in out:  # a call in the template's format, shown parsed (unparsed text as it is)
        calls = tools.parse(o["output"]) if chat and tools is not None else None
        if calls and tools is not None:
            o["call"] = tools.shown(calls)
    return out


def sampled(
    model: Any, batch: dict[str, Any], request: PredictRequest, rows: list[int], pad: int, stop: list[int]
) -> Any:
    """[N, L] sampled continuations of a left-padded ``batch`` (xtrain's decode loop): row ``i``
    drawn from a generator seeded by (``request.seed``, ``rows[i]``), or from fresh seeds without
    a ``--seed``."""
    import torch

    from xtrain.data.sampler import mix_seed
    from xtrain.model.decoding import Sampling, generate

    if request.seed is not None:
        seeds = [mix_seed(request.seed, row) for row in rows]
    else:
        seeds = torch.randint(0, 2**62, (len(rows),)).tolist()
    how = Sampling(request.temperature or 1.0, request.top_p if request.top_p is not None else 1.0)
    done = generate(
        model, batch["input_ids"], batch["attention_mask"], max_new_tokens=request.max_new_tokens,
        pad_id=pad, stop=stop, sampling=how, seeds=seeds,
    )  # fmt: skip
    return done.ids


def text_score(refs: list[str], outputs: list[str], tools: ToolUse | None = None) -> dict[str, float]:
    """``--data`` scores: exact match of the text, and for rows whose reference is a tool call
    (agent rows ending on a call) the call exact match (the name and arguments parsed from the
    output by the task's ``tools``)."""
    scores = exact_match(refs, outputs)
    calls = tools.exact_match(refs, outputs) if tools is not None else None
    if calls is not None:
        scores["call_exact_match"] = calls
    return scores


def text_predict(
    loaded: Loaded, request: PredictRequest, tools: ToolUse | None = None
) -> list[dict[str, str]]:
    """Continuations of ``--prompt`` texts, each the text ``chat_prompt`` makes of it; with
    ``--tools`` naming functions each prompt an episode (the task's ``tools.episodes``)."""
    if request.inputs:
        raise XtrainError(
            f"{loaded.source} is a causal-lm model: it continues text, it reads no images or audio",
            "give it text prompts with --prompt TEXT instead of files",
        )
    if request.functions:  # each prompt an episode: the calls run, the answer after them
        if tools is None:
            raise XtrainError(f"{loaded.source} runs no tools", "leave out --tools")
        if not loaded.parts.get("chat"):
            raise XtrainError(
                f"{loaded.source} was not trained on chat conversations: it has no template for tools",
                "leave out --tools",
            )
        texts = [chat_prompt(loaded, p, request.system, request.tools)[0] for p in request.prompts]
        return tools.episodes(loaded, texts, *chat_render(loaded), request)
    examples = []
    for i, prompt in enumerate(request.prompts):
        text = chat_prompt(loaded, prompt, request.system, request.tools)[0]
        examples.append(Example(i, {"input": prompt}, text))
    outputs = in_batches(functools.partial(text_answer, tools=tools), loaded, examples, request)
    rows = []
    for e, o in zip(examples, outputs, strict=True):
        call = {"call": o["call"]} if "call" in o else {}
        rows.append({"input": e.shown["input"], "output": o["output"], **call})
    return rows


def chat_reply(
    loaded: Loaded, messages: list[dict[str, str]], request: PredictRequest, tools: ToolUse | None = None
) -> str:
    """``xtrain chat``'s next assistant turn: the conversation so far (``system``/``user``/
    ``assistant`` turns, ending in a user turn) rendered through the result's chat template with
    the generation prompt and answered as ``text_answer`` answers a data file's conversation.
    The oldest turns after a system turn are left out while the rendered conversation and
    ``request.max_new_tokens`` would not fit the model's positions."""
    if not loaded.parts.get("chat"):
        raise XtrainError(
            f"{loaded.source} was not trained on chat conversations and has no chat template",
            f"xtrain predict {loaded.source} --prompt TEXT continues a text",
        )
    render, _ = chat_render(loaded)
    limit = getattr(loaded.model.config, "max_position_embeddings", None)
    turns = list(messages)
    first = 1 if turns and turns[0]["role"] == "system" else 0
    while limit is not None and len(turns) > first + 1:
        length = len(loaded.tokenizer(render(turns, True), add_special_tokens=False)["input_ids"])
        if length + request.max_new_tokens <= limit:
            break
        del turns[first : first + 2]  # the oldest user turn and its answer
    # the turn's number as its row: a seeded chat draws each turn from its own generator
    return text_answer(loaded, [Example(len(messages), {}, turns)], request, tools)[0]["output"]


def read_text_file(cfg: TrainConfig, record: dict[str, Any], tools: ToolUse | None = None) -> list[Example]:
    """A ``--data`` file's rows as prompts, in the run's row format (``record["row_format"]``,
    what training detected; older runs: detected from the file): a chat run's conversations
    (messages, sharegpt, alpaca with its template) up to their last answer, which is the
    reference; a plain run's text, prompt (its response the reference) or alpaca prompt (its
    output the reference). Rows without the answer are prompts without a reference."""
    from xtrain.data.tokenize import require_columns

    d = cfg.data
    ds, source, _ = load_file(cfg)
    fmt = d.row_format if d.row_format != "auto" else record.get("row_format")
    if fmt is None:  # an older run: what the file holds
        fmt = row_columns.row_format(cfg, ds, source)
    row_columns.require(cfg, fmt, ds, source, "the run")
    answered = fmt != "alpaca" or "output" in ds.column_names
    if not answered:  # alpaca prompts alone: the readers want an output, here a stand-in dropped below
        ds = ds.add_column("output", ["-"] * len(ds))
    if record.get("chat"):
        from xtrain.data.rows import tools as agent_rows

        cells = row_formats.conversations(ds, d, fmt, source)
        schemas, calls = agent_rows.row_tools(ds, d, source), tools
        out = []
        for i, cell in enumerate(cells):
            if schemas[i] or agent_rows.is_agent(cell):  # its tools rendered; a call as its reference
                out.append(agent_example(cell, i, source, schemas[i], answered, calls))
                continue
            prompt, reference = split_conversation(cell, i, source)
            shown = {"input": last_user_text(prompt.messages)}
            out.append(Example(i, shown, prompt.messages, reference if answered else None))
        return out
    if fmt in ("messages", "sharegpt"):  # turns, and no template to render them
        raise XtrainError(
            f"{source} holds conversations ({fmt}), and the run did not train on chat conversations",
            "give it text, prompt/response or alpaca rows, as the run trained on",
        )
    prompt_column, response_column, columns = text_columns(cfg, fmt)
    if fmt == "alpaca":
        ds = row_formats.alpaca_as_prompt_response(ds, source)
    prompt_column = prompt_column or d.text_column
    key = next(iter(columns), "data.text_column")
    require_columns(ds, {key: prompt_column}, source)
    refs = references(ds, response_column, source, "data.response_column") if answered else [None] * len(ds)
    out = []
    for i, (text, reference) in enumerate(zip(ds[prompt_column], refs, strict=True)):
        if text is None or not text.strip():
            raise row_formats.BadRow(f"row {i} of {source}: field '{prompt_column}' is missing or empty")
        out.append(Example(i, {"input": text.rstrip()}, text, reference))
    return out


def agent_example(
    cell: Any,
    row: int,
    source: str,
    tools: list[dict[str, Any]] | None,
    answered: bool,
    calls: ToolUse | None = None,
) -> Example:
    """An agent row as a prompt: its turns before the last assistant turn (with its tools), and
    that turn as the reference: the calls it makes (the task's ``calls.reference``), else its
    answer. A row that ends on a user turn or a tool result is a prompt without a reference."""
    import json

    from xtrain.data.rows import chat as chat_data
    from xtrain.data.rows import tools as agent_rows

    ends = isinstance(cell, list) and bool(cell) and isinstance(cell[-1], dict)
    ends = ends and cell[-1].get("role") in ("assistant", agent_rows.FUNCTION_CALL)
    probe = cell if ends or not isinstance(cell, list) else [*cell, {"role": "assistant", "content": "-"}]
    conv = agent_rows.parse_agent(probe, row, source, tools, complete=False)
    last = conv.messages[-1]
    said = calls.reference if calls is not None else json.dumps
    reference = said(last["tool_calls"]) if last.get("tool_calls") else last["content"].strip()
    prompt = chat_data.Conversation(conv.messages[:-1], tools=conv.tools)
    shown = {"input": last_user_text(prompt.messages)}
    return Example(row, shown, prompt, reference if ends and answered else None)


# ---------------------------------------------------------------------------------------------
# vision-language: images and a question -> the answer


def vision_answer(loaded: Loaded, examples: list[Example], request: PredictRequest) -> list[dict[str, str]]:
    """Answers for a batch of prompts (``Example.feed``: (the turns before the answer, their
    image cells, the folder relative paths are in)): each rendered by the chat template saved
    with the adapter with the generation prompt (as training rendered the prompts before its
    answers), expanded by the processor with its images (``vision_chat.process_texts``: one call
    for the batch), left-padded into one ``generate`` call; an answer ends at its end-of-turn
    token."""
    import torch

    from xtrain.data.rows import chat as chat_data
    from xtrain.data.rows.images import open_image
    from xtrain.data.rows.vision_chat import process_texts

    processor, tokenizer, limit = loaded.parts["processor"], loaded.tokenizer, image_limit(loaded)
    render = chat_data.renderer(processor, chat_data.require_template(processor, None, loaded.source))
    prompts, images = [], []
    for e in examples:
        messages, cells, folder, source = e.feed
        prompts.append(render(messages, True))
        images.append([open_image(cell, folder, e.row, source, limit) for cell in cells])
    rows, shared = process_texts(processor, prompts, images)
    pad = pad_id(tokenizer)
    batch = {**left_pad(rows, pad), **shared}  # + pixel values and image grids, in row order
    with torch.no_grad():
        ids = loaded.model.generate(
            **to_model(batch, loaded.model),
            max_new_tokens=request.max_new_tokens,
            pad_token_id=pad,
            **request.decoding(),
        )
    width = batch["input_ids"].shape[1]  # the output repeats the (left-padded) prompt
    return [{"output": tokenizer.decode(r[width:], skip_special_tokens=True).strip()} for r in ids]


def vision_predict(loaded: Loaded, request: PredictRequest) -> list[dict[str, str]]:
    """(image, question, answer) rows for every question about every image: the user turn (the
    image, then the question; ``system`` first when given) answered as ``vision_answer`` answers a
    data file's rows, ``request.batch_size`` at a time."""
    from xtrain.data.rows import chat as chat_data
    from xtrain.data.rows.images import open_image

    if not request.inputs:
        raise XtrainError(
            f"{loaded.source} is a vision-language model: it answers a question about an image",
            "pass image files or folders with --question TEXT",
        )
    if not request.prompts or not all(q.strip() for q in request.prompts):
        raise XtrainError(
            "a vision-language model answers a question about each image", "add --question TEXT"
        )
    examples, limit = [], image_limit(loaded)
    for f in media_files(request.inputs):
        image = read_input(f, "image", lambda f=f: open_image(str(f), None, 0, "", limit))
        for question in request.prompts:
            turns = chat_data.user_turn(question, images=1, system=request.system)
            shown = {"input": str(f), "prompt": question}
            examples.append(Example(len(examples), shown, (turns, [image], None, "")))
    outputs = in_batches(vision_answer, loaded, examples, request)
    return [{**e.shown, "output": o["output"]} for e, o in zip(examples, outputs, strict=True)]


def read_vision_file(cfg: TrainConfig, record: dict[str, Any]) -> list[Example]:
    """A ``--data`` file's rows read by the run's own vision reader (``vision_rows``: messages,
    sharegpt, ``<image>`` placeholders, flat image/question/answer rows; paths relative to the
    file or ``data.image_root``): each row's turns up to its last answer, which is the reference
    (a conversation ending in a user turn, or flat rows without an answer column, have none);
    every image file found before any model loads."""
    from xtrain.data.rows import chat as chat_data
    from xtrain.data.rows import vision_rows
    from xtrain.data.rows.images import describe, resolve_path, undecoded

    d = cfg.data
    ds, source, folder = load_file(cfg, "image")
    columns = list(ds.column_names)
    _, question, answer = vision_rows.flat_columns(d, columns)
    chat = d.messages_column in columns or row_formats.SHAREGPT_COLUMN in columns
    answered = chat or answer in columns
    if not answered and question in columns:  # flat questions alone: a stand-in answer, dropped below
        ds = ds.add_column(answer or vision_rows.ANSWER_COLUMNS[0], ["-"] * len(ds))
        columns = list(ds.column_names)
    fmt = vision_rows.vision_format(d, columns, source)
    names = vision_rows.vision_columns(d, fmt, columns, source)
    ds = undecoded(ds, vision_rows.images_field(d, fmt, columns))
    cells = {c: ds[c] for c in names}
    out = []
    for row in range(len(ds)):
        cell = {c: cells[c][row] for c in names}
        turns, images, field = vision_rows.vision_turns(d, fmt, cell, row, source)
        prompt, reference = split_conversation(turns, row, source, images, True, field)
        for ref in prompt.images:
            if isinstance(ref, str) and not resolve_path(ref, folder).is_file():
                where = f"row {row} of {source}"
                raise chat_data.BadConversation(f"image {resolve_path(ref, folder)} ({where}) not found")
        shown = [describe(ref, folder) for ref in prompt.images]
        item = {"input": shown[0] if len(shown) == 1 else shown, "prompt": last_user_text(prompt.messages)}
        feed = (prompt.messages, prompt.images, folder, source)
        out.append(Example(row, item, feed, reference if answered else None))
    return out
