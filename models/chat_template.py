"""Chat templates: a conversation turned into the one text a chat model was trained to continue.

A chat model reads a conversation as a single sequence in which markers delimit the turns (notes
12.3): ChatML writes `<|im_start|>user\\n...<|im_end|>\\n`, Llama 3 writes
`<|start_header_id|>user<|end_header_id|>\\n\\n...<|eot_id|>`. Each model ships its layout as a
Jinja2 template in tokenizer_config.json (or chat_template.jinja). render_chat_template renders
one exactly as Hugging Face's transformers does (utils/chat_template_utils.py there): a sandboxed
environment with trim_blocks and lstrip_blocks (a template's line breaks and indentation around
{% %} tags are layout, not text), the loopcontrols extension, and the helpers templates call:
raise_exception, strftime_now, a tojson that keeps non-ASCII characters, and the
{% generation %} tag (which transformers uses to mark the assistant's tokens; here it only
renders its body).
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment


def render_chat_template(
    template: str,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool = False,
    tools: list[dict[str, Any]] | None = None,
    documents: list[dict[str, Any]] | None = None,
    **variables: Any,
) -> str:
    """The text of messages under template, as transformers' apply_chat_template(...,
    tokenize=False) renders it. variables: the special tokens' names (bos_token="<|...|>") and
    anything else the template reads (date_string=...). A template's raise_exception("...")
    becomes a ValueError with that message."""
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise ValueError(
            "render_chat_template: messages must be a list of dicts such as "
            f'{{"role": "user", "content": "Hi"}}, got {type(messages).__name__}'
        )
    try:
        return _compile(template).render(
            messages=messages,
            tools=tools,
            documents=documents,
            add_generation_prompt=add_generation_prompt,
            **variables,
        )
    except jinja2.TemplateError as exc:
        raise ValueError(f"chat template: {exc}") from None


@lru_cache(maxsize=16)
def _compile(template: str) -> jinja2.Template:
    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationTag, jinja2.ext.loopcontrols],
    )
    environment.filters["tojson"] = _tojson
    environment.globals["raise_exception"] = _raise_exception
    environment.globals["strftime_now"] = lambda format: datetime.now().strftime(format)
    try:
        return environment.from_string(template)
    except jinja2.TemplateSyntaxError as exc:
        raise ValueError(f"chat template line {exc.lineno}: {exc.message}") from None


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(value: Any, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    """transformers' tojson: json.dumps without Jinja's HTML escaping, non-ASCII kept."""
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


class _GenerationTag(jinja2.ext.Extension):
    """{% generation %}...{% endgeneration %}: renders its body (transformers also records where
    the assistant's text lies, for training masks; nothing here needs that)."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller: Any) -> str:
        return caller()
