"""The chat templates xtrain ships (xtrain/data/templates): each file names where its text is from
and what it was checked against, and that comment changes nothing the template renders."""

from __future__ import annotations

import pytest

from xtrain.data import templates
from xtrain.export.file_checks import PROBE_CALL as CALL  # the export's own tool probes
from xtrain.export.file_checks import PROBE_TOOLS as TOOLS

PLAIN = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hello"},
    {"role": "assistant", "content": "Hi."},
    {"role": "user", "content": "Weather?"},
]
WITH_CALLS = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call00001", "name": "get_weather", "content": "sunny"},
    {"role": "assistant", "content": "Sunny."},
    {"role": "user", "content": "Thanks"},
]


@pytest.mark.parametrize("name", templates.NAMES)
def test_each_shipped_template_names_its_source(name):
    raw = templates.file_text(name)
    header, end, body = raw.partition("-#}\n")
    assert raw.startswith(f'{{#- xtrain "{name}": ') and end, "a source comment opens the file"
    assert ("tokenizer_config.json" in header or name == "chatml") and "named() drops" in header
    assert "checked" in header.lower()  # what it was compared with, and how
    assert templates.named(name) == body and not body.startswith("{#")
    # the comment says nothing that would make a template look tools-aware when it is not
    assert templates.renders_tools(raw) == templates.renders_tools(body)
    assert templates.renders_calls(raw) == templates.renders_calls(body)


@pytest.mark.parametrize("name", templates.NAMES)
def test_the_source_comment_renders_nothing(name):
    from transformers.utils.chat_template_utils import render_jinja_template

    raw, body = templates.file_text(name), templates.named(name)
    cases = [(PLAIN, None)] + ([(WITH_CALLS, TOOLS)] if templates.renders_tools(body) else [])
    for messages, tools in cases:
        renders = [
            render_jinja_template(
                [messages],
                tools=tools,
                chat_template=text,
                add_generation_prompt=True,
                bos_token="<s>",
                eos_token="</s>",
            )[0][0]
            for text in (raw, body)
        ]
        assert renders[0] == renders[1] and renders[0].strip()
