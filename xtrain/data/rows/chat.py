# longer: the rendering and masking are one mechanism shared by every chat task (agent rows:
# tools.py; the shipped templates: xtrain/data/templates)
"""Conversations in the ``messages`` format, rendered by a chat template, loss on the assistant only.

Shared by ``causal-lm`` (text chat, the tokenizer's template) and ``vision-language`` (the
processor's template, image parts). A row is::

    {"messages": [
        {"role": "system", "content": "You answer in one word."},
        {"role": "user", "content": [{"type": "image", "image": "img/0.png"},
                                     {"type": "text", "text": "what colour is the square?"}]},
        {"role": "assistant", "content": "red"}]}

``content`` is a string or a list of parts (``{"type": "text", "text": ...}``,
``{"type": "image", "image": "path relative to the data file"}``; an image part without a path
takes the next image of the row's ``data.images_column``). In vision chat an ``<image>``
placeholder inside a string content is such a part (LLaMA-Factory / LLaVA rows:
``{"role": "user", "content": "<image>What is this?"}`` with ``"images": ["a.png"]``); the row's
images fill the placeholders and path-less parts in the order they appear, and a row whose image
list has more or fewer entries than that is refused.

Masking: the template renders the whole conversation once; for every assistant turn it also
renders the conversation before that turn with the generation prompt (``<|im_start|>assistant\\n``)
and the conversation through that turn. The characters between the two are the assistant's own
(its answer and end-of-turn token; trailing whitespace after the end-of-turn token is left out).
Tokens that start inside those characters keep their ids as labels, every other token gets -100.
This works with any template whose earlier turns render the same whatever follows (true of
ChatML/Qwen, Llama 3, Mistral, Gemma, Zephyr templates); one that does not is refused in one line.
A turn whose reasoning the template drops once a later user turn follows (Qwen3) trains as the
whole conversation renders it. Agent rows (tools, calls, results: ``tools.py``) render with the
row's ``tools=`` and ``data.chat_template_kwargs``; ``data.train_on`` picks the turns that train
(only those turns' renders are made). The render through the last turn is the whole conversation's:
a conversation of k trained answers costs 2k renders; ``encode_many`` renders a batch of
conversations in as few template calls as they allow (``render.render_many``) and tokenises them
in one call.

longer: the rendering and masking are one mechanism shared by every chat task; agent reading is
in ``tools.py``, the shipped templates in ``xtrain/data/templates``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from xtrain.data.collate import IGNORE_INDEX
from xtrain.data.rows.offsets import span_labels, token_starts
from xtrain.data.rows.render import (  # noqa: F401  (their old home: chat_data.renderer, ...)
    BadConversation,
    Render,
    Renderer,
    Request,
    load_template,
    render_many,
    render_one,
    renderer,
    require_template,
)
from xtrain.errors import XtrainError

if TYPE_CHECKING:
    from datasets import Dataset
    from transformers import PreTrainedTokenizerBase

ROLES = ("system", "user", "assistant")
PART_TYPES = ("text", "image")

IMAGE_PLACEHOLDER = "<image>"  # LLaMA-Factory's and LLaVA's image marker in string turns


@dataclass
class Conversation:
    """One checked row: messages ready for a template, and its image references in order."""

    messages: list[dict[str, Any]]
    images: list[Any] = field(default_factory=list)  # path strings, Image feature dicts, PIL images
    tools: list[dict[str, Any]] | None = None  # the function schemas the template is given (tools.py)


def _text_of(parts: list[dict[str, Any]]) -> str:
    return "".join(p["text"] for p in parts if p["type"] == "text")


def image_parts(text: str) -> list[dict[str, Any]]:
    """A string turn as content parts: an ``{"type": "image"}`` part for each ``<image>``
    placeholder, in place, and the text around them (empty pieces left out)."""
    parts: list[dict[str, Any]] = []
    for k, piece in enumerate(text.split(IMAGE_PLACEHOLDER)):
        if k:
            parts.append({"type": "image"})
        if piece:
            parts.append({"type": "text", "text": piece})
    return parts


def _content_parts(content: Any, where: str, k: int, allow_images: bool) -> list[dict[str, Any]]:
    """One turn's content as checked parts; an image part keeps its path (``image`` or ``path``)
    or None where the row's image list fills it."""
    if isinstance(content, str):
        if allow_images and IMAGE_PLACEHOLDER in content:
            parts = image_parts(content)
            return [p if p["type"] == "text" else {"type": "image", "ref": None} for p in parts]
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise BadConversation(f"{where}: turn {k} content must be text or a list of parts")
    parts: list[dict[str, Any]] = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in PART_TYPES:
            raise BadConversation(
                f"{where}: turn {k} has a content part of type {kind!r} (types: text, image)"
            )
        if kind == "text":
            if not isinstance(part.get("text"), str):
                raise BadConversation(f"{where}: turn {k} has a text part without text")
            parts.append({"type": "text", "text": part["text"]})
            continue
        if not allow_images:
            raise BadConversation(
                f"{where}: turn {k} holds an image, and causal-lm chat is text only",
                "use model.task=vision-language with a vision-language model",
            )
        parts.append({"type": "image", "ref": part.get("image") or part.get("path")})
    return parts


def image_list(images: Any) -> list[Any]:
    """A row's image cell as a list: a list as it is, one path or image as a list of one, none
    (null, an empty string) as an empty list."""
    if isinstance(images, (list, tuple)):
        return list(images)
    return [] if images is None or images == "" else [images]


def parse_conversation(
    messages: Any,
    row: int,
    source: str,
    images: Any = None,
    allow_images: bool = True,
    images_field: str = "images",
) -> Conversation:
    """Check one ``messages`` cell and normalise it: roles known, content text or parts, an
    assistant turn that follows a user turn, and every image of the row's ``images_field``
    cell (``images``) used by exactly one ``<image>`` placeholder or path-less image part.
    Text-only chat (``allow_images=False``) gets string contents; vision chat gets lists of parts
    (what VLM templates iterate over)."""
    where = f"row {row} of {source}"
    if not isinstance(messages, list) or not messages:
        raise BadConversation(f"{where}: messages must be a non-empty list of {{role, content}} turns")
    out: list[dict[str, Any]] = []
    refs: list[Any] = []  # None where the row's image list fills the part
    seen_user = False
    for k, turn in enumerate(messages):
        if not isinstance(turn, dict) or "role" not in turn:
            raise BadConversation(f"{where}: turn {k} is not a {{role, content}} object")
        role = turn["role"]
        if role not in ROLES:
            raise BadConversation(f"{where}: turn {k} has role {role!r} (roles: {', '.join(ROLES)})")
        if role == "assistant" and not seen_user:
            raise BadConversation(f"{where}: the assistant speaks in turn {k} before any user turn")
        seen_user |= role == "user"
        parts = _content_parts(turn.get("content"), where, k, allow_images)
        if role == "assistant" and any(p["type"] == "image" for p in parts):
            raise BadConversation(f"{where}: turn {k}: images go in user or system turns")
        refs += [p["ref"] for p in parts if p["type"] == "image"]
        parts = [p if p["type"] == "text" else {"type": "image"} for p in parts]
        if role == "assistant" and not _text_of(parts).strip():
            raise BadConversation(f"{where}: turn {k} is an empty assistant answer")
        out.append({"role": role, "content": _text_of(parts) if not allow_images else parts})
    if not any(t["role"] == "assistant" for t in out):
        raise BadConversation(f"{where} has no assistant turn: nothing to learn")
    return Conversation(out, _fill(refs, image_list(images) if allow_images else [], where, images_field))


def _fill(refs: list[Any], listed: list[Any], where: str, field_name: str) -> list[Any]:
    """The row's listed images in the slots the turns left open (``None``), in order; the two
    counts must agree (an image nobody places would be silently unused)."""
    slots = sum(ref is None for ref in refs)
    if slots != len(listed):
        raise BadConversation(
            f"{where}: field '{field_name}' lists {len(listed)} image(s) but the turns place {slots} "
            f"(one {IMAGE_PLACEHOLDER} placeholder or path-less image part for each)",
            "give each image of the row its placeholder, or set data.images_column to the column "
            "that holds the row's images (docs/vision-language.md#data)",
        )
    rest = iter(listed)
    return [next(rest) if ref is None else ref for ref in refs]


def user_turn(
    question: str, images: int = 0, system: str | None = None, text_only: bool = False
) -> list[dict[str, Any]]:
    """A question (after ``images`` image placeholders) as the normalised messages that
    ``parse_conversation`` gives the template (vision chat: lists of parts; ``text_only``: causal-lm
    chat, string contents): what ``xtrain predict`` renders with the generation prompt, the same
    way training rendered the prompts before its answers."""
    if text_only:
        turns = [{"role": "system", "content": system}] if system else []
        return [*turns, {"role": "user", "content": question}]
    parts = [{"type": "image"} for _ in range(images)] + [{"type": "text", "text": question}]
    turns = [{"role": "system", "content": [{"type": "text", "text": system}]}] if system else []
    return [*turns, {"role": "user", "content": parts}]


def end_of_turn(render: Render, tokenizer: PreTrainedTokenizerBase) -> int | None:
    """The token that ends an assistant turn in this template (``<|im_end|>``, the eos token, ...):
    the first token the template puts after an answer (None when it puts nothing there)."""
    answer = "ok"
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": answer}]
    before = render(messages[:1], True)
    after = render(messages, False)[len(before) :].rstrip()
    if not after.startswith(answer) or len(after) == len(answer):
        return None
    ids = tokenizer(after[len(answer) :], add_special_tokens=False)["input_ids"]
    return int(ids[0]) if ids else None


# ---------------------------------------------------------------------------------------------
# Rendering and masking


@dataclass
class Encoded:
    """A rendered conversation: its text, token ids, labels (-100 outside assistant answers),
    and the prompt of its last assistant turn (for generation) with that turn's answer."""

    text: str
    input_ids: list[int]
    labels: list[int]
    prompt: str
    answer: str


# (how many leading messages, with the generation prompt): one render of a conversation
Prefix = tuple[int, bool]


def prefixes(messages: list[dict[str, Any]], turns: list[int]) -> list[Prefix]:
    """The renders that find the spans of assistant turns ``turns``: the whole conversation, and
    for each turn the conversation before it with the generation prompt and through it (the whole
    conversation again when the turn ends it: rendered once)."""
    keys = [(len(messages), False)]
    for i in turns:
        keys += [(i, True), (i + 1, False)]
    return list(dict.fromkeys(keys))


def assistant_turns(messages: list[dict[str, Any]], last_only: bool = False) -> list[int]:
    """The indices of the assistant turns whose tokens train (``last_only``: the last one)."""
    turns = [i for i, t in enumerate(messages) if t["role"] == "assistant"]
    return turns[-1:] if last_only else turns


def assistant_spans(
    render: Render, messages: list[dict[str, Any]], where: str
) -> tuple[str, list[tuple[int, int]]]:
    """(full text, [(start, end) character span of each assistant turn])."""
    turns = assistant_turns(messages)
    texts = {key: render_one(render, messages[: key[0]], key[1], where) for key in prefixes(messages, turns)}
    return spans_of(render, messages, turns, texts, where)


def spans_of(
    render: Render, messages: list[dict[str, Any]], turns: list[int], texts: dict[Prefix, str], where: str
) -> tuple[str, list[tuple[int, int]]]:
    """(full text, the span of each of ``turns``) from the renders ``prefixes`` names."""
    full = texts[(len(messages), False)]
    spans = []
    for i in turns:
        before = texts[(i, True)]
        through = texts[(i + 1, False)].rstrip()
        if through.startswith(before) and full.startswith(through):
            spans.append((len(before), len(through)))
            continue
        # a turn rendered otherwise while it is the last one (Qwen3: its reasoning, or an empty
        # <think></think>, dropped once more follows): it trains as the whole conversation renders it
        found = _as_rendered(render_one(render, messages[:i], False, where), before, through, full)
        if found is None or not through.startswith(before):
            raise XtrainError(
                f"{where}: the chat template renders earlier turns differently as the conversation "
                "grows, so the assistant's tokens cannot be told apart",
                "set data.chat_template to a template whose turns render the same whatever follows",
            )
        spans.append(found)
    return full, spans


def _as_rendered(prior: str, before: str, through: str, full: str) -> tuple[int, int] | None:
    """The span of a turn in ``full`` when, as the last turn (``through``), it renders otherwise:
    (a) text inserted after the generation prompt (``before``) that ``full`` leaves out (the least
    cut of it whose rest ``full`` carries there), or (b) the generation prompt's own tail, which
    ``full`` does not render before the turn (the turn's text found in ``full`` after the earlier
    turns, ``prior``, and the part of the generation prompt ``full`` shares). None: neither."""
    content = through[len(before) :]
    if full.startswith(before):
        for k in range(1, len(content)):
            if full.startswith(content[k:], len(before)):
                return len(before), len(before) + len(content) - k
    for start in range(len(prior), len(before)):
        if full.startswith(before[:start]) and content.strip() and full.startswith(content, start):
            return start, start + len(content)
    return None


def encode(
    render: Render,
    tokenizer: PreTrainedTokenizerBase,
    conv: Conversation,
    where: str,
    last_only: bool = False,
    train_on: str = "all_assistant",
) -> Encoded:
    """Render ``conv`` and label the tokens of its assistant turns (the rest -100); ``last_only``:
    of its last assistant turn only (a preference answer after a conversation that is its prompt);
    ``train_on`` (``data.train_on``): ``last_assistant`` the same, ``all`` every token."""
    return encode_many(render, tokenizer, [conv], [where], last_only, train_on)[0]


def encode_many(
    render: Render,
    tokenizer: PreTrainedTokenizerBase,
    convs: list[Conversation],
    wheres: list[str],
    last_only: bool = False,
    train_on: str = "all_assistant",
) -> list[Encoded]:
    """``encode`` of each conversation, the renders of all of them in as few template calls as
    they allow (``render_many``) and their texts tokenised in one call. Each conversation is
    rendered whole, and before and through each assistant turn that trains (through the last
    turn is the whole conversation: one render), so a conversation of k answers costs 2k renders."""
    last = last_only or train_on != "all_assistant"  # all: the last turn only for the prompt
    renders = [with_tools(render, conv, where) for conv, where in zip(convs, wheres, strict=True)]
    plans = []
    requests: list[Request] = []
    for r, conv, where in zip(renders, convs, wheres, strict=True):
        turns = assistant_turns(conv.messages, last)
        keys = prefixes(conv.messages, turns)
        plans.append((turns, keys, len(requests)))
        requests += [(r, conv.messages[:n], generation, where) for n, generation in keys]
    rendered = render_many(requests)
    found = []
    for r, conv, where, (turns, keys, at) in zip(renders, convs, wheres, plans, strict=True):
        texts = dict(zip(keys, rendered[at : at + len(keys)], strict=True))
        text, spans = spans_of(r, conv.messages, turns, texts, where)
        found.append((text, [(0, len(text))] if train_on == "all" else spans, texts[(turns[-1], True)]))
    out = []
    for conv, where, (text, spans, prompt), (ids, starts) in zip(
        convs, wheres, found, token_starts(tokenizer, [f[0] for f in found]), strict=True
    ):
        labels = span_labels(ids, starts, spans)
        if all(x == IGNORE_INDEX for x in labels):
            raise BadConversation(f"{where}: no token of the assistant's answer survives tokenising")
        out.append(Encoded(text, ids, labels, prompt, _answer(conv)))
    return out


def _answer(conv: Conversation) -> str:
    """The last assistant turn's answer (a call's JSON for a turn that calls tools)."""
    turn = conv.messages[max(i for i, t in enumerate(conv.messages) if t["role"] == "assistant")]
    content = turn["content"]
    answer = content if isinstance(content, str) else _text_of(content)
    if turn.get("tool_calls"):  # a call: its JSON is the answer
        answer = json.dumps([c["function"] for c in turn["tool_calls"]], ensure_ascii=False)
    return answer.strip()


# ---------------------------------------------------------------------------------------------
# Templates: ``render.py`` (load_template, require_template, renderer: imported above)


def with_tools(render: Render, conv: Conversation, where: str) -> Render:
    """``render`` given ``conv``'s tools; a template that would drop them (or its calls) is
    refused in one line naming it and the row."""
    from xtrain.data import templates

    calls = any(t.get("tool_calls") for t in conv.messages)
    if not (conv.tools or calls) or not isinstance(render, Renderer):
        return render
    missing = (conv.tools and not templates.renders_tools(render.template)) or (
        calls and not templates.renders_calls(render.template)
    )
    if missing:
        what = "tool schemas" if conv.tools else "tool calls"
        raise XtrainError(
            f"{where} has {what}, and {render.origin} cannot render them (no "
            f"'{'tools' if conv.tools else 'tool_calls'}' in its source): they would be silently dropped",
            "set data.chat_template to a tools-aware template: qwen2.5, qwen3, llama3.1, llama3.2, "
            "mistral, or a file (docs/agents.md)",
        )
    return render.with_tools(conv.tools)


def messages_column_of(ds: Dataset, column: str, source: str) -> list[Any]:
    if column not in ds.column_names:
        raise XtrainError(
            f"column '{column}' not in {source} (columns: {', '.join(ds.column_names)})",
            "set data.messages_column to the column of conversations",
        )
    return list(ds[column])
