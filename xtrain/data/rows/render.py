"""The chat template as a renderer: which template (``data.chat_template``, a shipped one, the
tokenizer's or the processor's), and conversations rendered through ``apply_chat_template`` one
at a time (``render_one``) or a batch at a time (``render_many``: one template call renders every
conversation of a batch that shares its tools and generation flag, the same text as one call each).

A template that refuses a row (its own ``raise_exception``, a missing field) is that row's one
line (``BadConversation``); one that the sandbox refuses is the template's (``XtrainError``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from xtrain.encoding import read_text
from xtrain.errors import RowError, XtrainError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase, ProcessorMixin

    # what ``apply_chat_template`` is called on: a tokenizer or a multimodal processor
    TemplateOwner = PreTrainedTokenizerBase | ProcessorMixin

# render(messages, add_generation_prompt) -> text: the tokenizer's or the processor's template
Render = Callable[[list[dict[str, Any]], bool], str]
# what to render: (the renderer, the messages, the generation prompt, the row it is for)
Request = tuple[Render, list[dict[str, Any]], bool, str]


class BadConversation(RowError):
    """A malformed row: one line with the row and the file, also when raised in a DataLoader worker
    (which re-raises as ``type(e)(traceback text)``: only the original message is kept)."""

    HINT = "fix or remove that row (docs/vision-language.md#data describes the messages format)"


def render_one(render: Render, messages: list[dict[str, Any]], generation: bool, where: str) -> str:
    """``render(messages, generation)``; the template's refusal as ``where``'s one line."""
    try:
        return render(messages, generation)
    except Exception as e:  # the template's own raise_exception, or a missing field
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        if type(e).__name__ == "SecurityError":  # jinja2's sandbox: the template, not the row, is at fault
            origin = getattr(render, "origin", "the chat template")
            raise XtrainError(
                f"{origin} is unsafe: the sandbox refused it ({reason})",
                "use a template that only formats the messages, without Python attributes such as __class__",
            ) from None
        raise BadConversation(f"{where}: the chat template refused it: {reason}") from None


def render_many(requests: Sequence[Request]) -> list[str]:
    """Each request rendered, in order: the requests of one template, tools and generation flag
    in one ``apply_chat_template`` call of a batch of conversations (transformers renders each
    as it renders one alone); a batch the template refuses is rendered one by one, so the row it
    refuses is named (``render_one``)."""
    out: list[str | None] = [None] * len(requests)
    groups: dict[tuple[int, str, bool], list[int]] = {}
    for k, (render, _, generation, _) in enumerate(requests):
        if isinstance(render, Renderer) and render.batches:
            groups.setdefault((id(render.owner), render.group, generation), []).append(k)
        else:
            out[k] = render_one(*requests[k])
    for (_, _, generation), members in groups.items():
        render = requests[members[0]][0]
        assert isinstance(render, Renderer)
        try:
            texts = render.many([requests[k][1] for k in members], generation)
        except Exception:  # one of them refused: find it, with its own line
            texts = [render_one(*requests[k]) for k in members]
        for k, text in zip(members, texts, strict=True):
            out[k] = text
    return [text if text is not None else "" for text in out]


# ---------------------------------------------------------------------------------------------
# Templates


def load_template(setting: str | None) -> str | None:
    """``data.chat_template``: a shipped template's name (``xtrain/data/templates``: qwen2.5,
    llama3.1, ...), a file holding a Jinja template, or the template text itself."""
    from xtrain.data import templates

    if setting is None:
        return None
    shipped = templates.named(setting) if "{" not in setting and len(setting) < 64 else None
    if shipped is not None:
        return shipped
    path = Path(setting).expanduser()
    if "{" not in setting and len(setting) < 1024:
        if not path.is_file():
            raise XtrainError(
                f"data.chat_template file {setting} not found",
                "give a shipped template's name (" + ", ".join(templates.NAMES) + "), a Jinja template "
                "file (e.g. chat_template.jinja) or the template text itself",
            )
        return read_text(path, "chat template")
    return setting


def require_template(owner: TemplateOwner, template: str | None, source: str) -> str:
    """The template to render with: ``data.chat_template`` if set, else the tokenizer's or processor's."""
    found = template or getattr(owner, "chat_template", None)
    if isinstance(found, dict):  # several named templates: the default one
        found = found.get("default")
    if not found:
        raise XtrainError(
            f"the tokenizer of {source} has no chat template, so `messages` cannot be rendered",
            "set data.chat_template to a Jinja template file or string (the format the model should learn)",
        )
    return found


def renderer(
    owner: TemplateOwner, template: str, setting: str | None = None, kwargs: dict[str, Any] | None = None
) -> Render:
    """``render(messages, add_generation_prompt)`` through ``owner.apply_chat_template``;
    ``setting``: ``data.chat_template`` when the template came from it (named in refusals);
    ``kwargs``: ``data.chat_template_kwargs``, given to every rendering (``enable_thinking``)."""
    return Renderer(owner, template, setting, kwargs)


def template_of(render: Render) -> tuple[str, dict[str, Any]] | None:
    """(the template text, its extra variables) of a renderer ``renderer`` made; None for any
    other callable. What a cache of rendered rows is keyed by."""
    return (render.template, dict(render.kwargs)) if isinstance(render, Renderer) else None


class Renderer:
    """Picklable (spawned DataLoader workers, encoding processes): holds the tokenizer/processor
    and the template text, the template's extra variables, and (``with_tools``) the tool schemas
    of one conversation."""

    def __init__(
        self,
        owner: TemplateOwner,
        template: str,
        setting: str | None = None,
        kwargs: dict[str, Any] | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> None:
        self.owner = owner
        self.template = template
        self.setting = setting
        self.kwargs = dict(kwargs or {})
        self.tools = tools
        # where the template came from, for a refusal that names it rather than a data row
        kind = "processor" if hasattr(owner, "image_processor") else "tokenizer"
        named = f"={setting}" if setting is not None and "{" not in setting and len(setting) < 200 else ""
        self.origin = f"data.chat_template{named}" if setting is not None else f"the {kind}'s chat template"
        # renderers of one group render their conversations in one call (``render_many``)
        self.group = json.dumps([template, self.kwargs, tools], sort_keys=True, default=str)
        self.direct_agrees: bool | None = None  # ``many`` renders through ``direct`` (probed once)

    @property
    def batches(self) -> bool:
        """A tokenizer renders a batch of text conversations in one call (a processor: one each)."""
        return not hasattr(self.owner, "image_processor")

    def __call__(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        return self.owner.apply_chat_template(
            messages,
            chat_template=self.template,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            **({"tools": self.tools} if self.tools else {}),
            **self.kwargs,
        )

    def many(self, conversations: list[list[dict[str, Any]]], add_generation_prompt: bool) -> list[str]:
        """Several conversations in one template call (transformers' batched form), through
        ``direct`` where it renders as ``apply_chat_template`` does."""
        if self.direct_agrees is None:
            self.direct_agrees = self._direct_agrees()
        if self.direct_agrees:
            return self.direct(conversations, add_generation_prompt)
        texts = self.owner.apply_chat_template(
            conversations,
            chat_template=self.template,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            **({"tools": self.tools} if self.tools else {}),
            **self.kwargs,
        )
        return list(texts)

    def direct(self, conversations: list[list[dict[str, Any]]], add_generation_prompt: bool) -> list[str]:
        """What ``apply_chat_template(tokenize=False)`` renders, for conversations that are plain
        JSON data already (what xtrain's row readers make): the template rendered by transformers'
        own ``render_jinja_template`` with the tokenizer's special tokens, its step that turns
        message objects into dicts (a third of the time a render takes) left out; the keys whose
        value is None dropped, as that step drops them."""
        from transformers.utils.chat_template_utils import render_jinja_template

        plain = [[{k: v for k, v in m.items() if v is not None} for m in conv] for conv in conversations]
        texts, _ = render_jinja_template(
            conversations=plain,
            tools=self.tools or None,
            chat_template=self.template,
            add_generation_prompt=add_generation_prompt,
            **{**self.owner.special_tokens_map, **self.kwargs},
        )
        return list(texts)

    def _direct_agrees(self) -> bool:
        """``direct`` renders a probe conversation exactly as ``apply_chat_template`` does (with
        and without the generation prompt); otherwise (another transformers, a template that
        refuses the probe) every batch goes through ``apply_chat_template``."""
        probe = [[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]]
        try:
            return all(self.direct(probe, g) == [self(probe[0], g)] for g in (False, True))
        except Exception:
            return False

    def with_tools(self, tools: list[dict[str, Any]] | None) -> Renderer:
        return Renderer(self.owner, self.template, self.setting, self.kwargs, tools)
