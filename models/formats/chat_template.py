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
import math
import re
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.visitor import NodeTransformer

from models.formats.errors import FileFormatError

# A render's budget: a template is a stranger's program, so it gets this much and no more.
MAX_ITERATIONS = 1_000_000  # loop iterations, all loops of one render together
MAX_OUTPUT = 10_000_000  # characters of output, and of any one string or list it builds
_LOOP, _SIZE = "__glassgrad_loop", "__glassgrad_size"  # the budget's hooks, named in the tree


def render_chat_template(
    template: str,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool = False,
    tools: list[dict[str, Any]] | None = None,
    documents: list[dict[str, Any]] | None = None,
    template_source: tuple[str | Path, str | None] | None = None,
    **variables: Any,
) -> str:
    """The text of messages under template, as transformers' apply_chat_template(...,
    tokenize=False) renders it. variables: the special tokens' names (bos_token="<|...|>") and
    anything else the template reads (date_string=...).

    Anything that goes wrong in the template (a syntax error, its raise_exception("..."), any
    exception while rendering, a render over its budget of MAX_ITERATIONS loop iterations or
    MAX_OUTPUT characters) is a models.FileFormatError naming template_source: (the file, the
    field) the template came from, e.g. (".../tokenizer_config.json", "chat_template"); by
    default "chat template"."""
    path, field = template_source or ("chat template", None)
    if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
        raise ValueError(
            "render_chat_template: messages must be a list of dicts such as "
            f'{{"role": "user", "content": "Hi"}}, got {type(messages).__name__}'
        )
    if not isinstance(template, str):
        raise FileFormatError(path, field, "must be a string (a Jinja template)", template)
    budget = _Budget()
    try:
        compiled = _compile(template)
        pieces, size = [], 0
        for piece in compiled.generate(
            messages=messages,
            tools=tools,
            documents=documents,
            add_generation_prompt=add_generation_prompt,
            **variables,
            **{_LOOP: budget.loop, _SIZE: budget.size},
        ):
            size += len(piece)
            if size > MAX_OUTPUT:
                raise _OverBudget(f"its output exceeds {MAX_OUTPUT:,} characters")
            pieces.append(piece)
        return "".join(pieces)
    except jinja2.TemplateSyntaxError as exc:
        raise FileFormatError(path, field, f"line {exc.lineno}: {exc.message}") from None
    except jinja2.TemplateError as exc:  # raise_exception, undefined, the sandbox's refusals
        raise FileFormatError(path, field, str(exc)) from None
    except _OverBudget as exc:
        raise FileFormatError(path, field, f"rendering stopped: {exc}") from None
    except (Exception, RecursionError) as exc:  # the template's own error, whatever it is
        raise FileFormatError(
            path, field, f"rendering failed: {type(exc).__name__}: {exc}"
        ) from None


class _OverBudget(Exception):
    pass


class _Budget:
    """One render's counters; the template's loops and string building call these."""

    def __init__(self) -> None:
        self.iterations = 0

    def loop(self, iterable: Any) -> Any:
        for item in iterable:
            self.iterations += 1
            if self.iterations > MAX_ITERATIONS:
                raise _OverBudget(f"its loops exceed {MAX_ITERATIONS:,} iterations")
            yield item

    def size(self, value: Any) -> Any:
        _check_size(value)
        return value


def _check_size(value: Any, what: str = "a value") -> None:
    if isinstance(value, (str, list, tuple)) and len(value) > MAX_OUTPUT:
        raise _OverBudget(f"{what} of {len(value):,} items exceeds {MAX_OUTPUT:,}")


def _big_int(value: Any) -> bool:
    return type(value) is int and abs(value) > MAX_OUTPUT


# a width or precision in a format string: %10000000s, {:>10000000}
_FORMAT_WIDTH = re.compile(r"%[-#0 +]*\d{8,}|%[-#0 +]*\d*\.\d{8,}|\{[^{}]*:[^{}]*\d{8,}")


class _Budgeted(NodeTransformer):
    """Rewrites a parsed template: `for x in xs` -> `for x in __glassgrad_loop(xs)`, and
    `a ~ b` -> `__glassgrad_size(a ~ b)`."""

    def visit_For(self, node: nodes.For) -> nodes.For:  # noqa: N802 (the visitor's naming)
        node = self.generic_visit(node)
        node.iter = _hook(_LOOP, node.iter)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Call:  # noqa: N802
        return _hook(_SIZE, self.generic_visit(node))


def _hook(name: str, node: nodes.Expr) -> nodes.Call:
    call = nodes.Call(nodes.Name(name, "load"), [node], [], None, None)
    return call.set_lineno(node.lineno)


class _Sandbox(ImmutableSandboxedEnvironment):
    """transformers' sandbox, plus the budget: every for loop's iterable goes through
    _Budget.loop and every ~ concatenation through _Budget.size (a rewrite of the parsed
    template), and the operators and calls that could build a huge value in one step (*, **,
    +, str.ljust(10**10), a format width) are checked before they run."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        tree = _Budgeted().visit(super()._parse(source, name, filename))
        return tree.set_environment(self)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        sequences = (str, list, tuple)
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, sequences) and type(n) is int and len(seq) * n > MAX_OUTPUT:
                    raise _OverBudget(f"{len(seq)} items * {n} exceeds {MAX_OUTPUT:,}")
        elif operator == "**":
            if type(left) is int and type(right) is int and abs(left) > 1 and right > 0:
                if right * math.log2(abs(left)) > 64 * MAX_OUTPUT:
                    raise _OverBudget(f"{left} ** {right} has too many digits")
        elif operator == "+":
            if isinstance(left, sequences) and isinstance(right, sequences):
                if len(left) + len(right) > MAX_OUTPUT:
                    raise _OverBudget(f"a concatenation exceeds {MAX_OUTPUT:,} items")
        elif operator == "%" and isinstance(left, str) and _FORMAT_WIDTH.search(left):
            raise _OverBudget(f"a format width above {MAX_OUTPUT:,}")
        return super().call_binop(context, operator, left, right)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        owner = getattr(__obj, "__self__", None)
        if isinstance(owner, (str, list, tuple)) and any(
            _big_int(a) for a in (*args, *kwargs.values())
        ):
            raise _OverBudget(f"{__obj.__name__} with a size above {MAX_OUTPUT:,}")
        return super().call(__context, __obj, *args, **kwargs)

    def format_string(self, s: str, *args: Any, **kwargs: Any) -> str:
        if _FORMAT_WIDTH.search(s):
            raise _OverBudget(f"a format width above {MAX_OUTPUT:,}")
        return super().format_string(s, *args, **kwargs)


def _bounded_filter(function: Any) -> Any:
    """A filter that takes a size (center, indent, wordwrap, format, tojson's indent): refused
    when the size is beyond the budget, before it runs."""

    def bounded(*args: Any, **kwargs: Any) -> Any:
        values = (*args, *kwargs.values())
        if any(_big_int(v) or (isinstance(v, str) and _FORMAT_WIDTH.search(v)) for v in values):
            raise _OverBudget(f"a size above {MAX_OUTPUT:,}")
        return function(*args, **kwargs)

    bounded.__dict__.update(function.__dict__)  # keeps jinja's pass_context/pass_environment
    return bounded


@lru_cache(maxsize=16)
def _compile(template: str) -> jinja2.Template:
    environment = _Sandbox(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationTag, jinja2.ext.loopcontrols],
    )
    environment.filters["tojson"] = _tojson
    for name in ("center", "indent", "wordwrap", "format", "tojson", "truncate", "batch"):
        environment.filters[name] = _bounded_filter(environment.filters[name])
    environment.globals["raise_exception"] = _raise_exception
    environment.globals["strftime_now"] = lambda format: datetime.now().strftime(format)
    return environment.from_string(template)


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
