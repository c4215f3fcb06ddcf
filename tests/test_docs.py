"""Every ```python block of the guides runs, and its `>>>` outputs match (the docs cannot rot).

The blocks of one file share one namespace, in order, like a reader typing them into one session.
A block with `>>>` prompts runs as a doctest (ELLIPSIS and NORMALIZE_WHITESPACE on); a block
without runs as a script.
"""

import doctest
import re
from pathlib import Path

import numpy as np
import pytest

import autograd

DOCS = Path(__file__).resolve().parent.parent / "docs"
GUIDES = [
    "internals.md",
    "worked_example.md",
    "tokenizer.md",
    "higher_order.md",
    "forward_mode.md",
    "finetune.md",
]
FENCE = re.compile(r"^```python\n(.*?)^```", flags=re.M | re.S)


def python_blocks(path):
    """(line number, code) of every ```python block."""
    text = path.read_text(encoding="utf-8")
    return [(text[: m.start()].count("\n") + 2, m.group(1)) for m in FENCE.finditer(text)]


def test_blocks_are_found():
    for guide in GUIDES:
        assert len(python_blocks(DOCS / guide)) >= 3, guide
    # A malformed fence would silently drop code from the test: count fences against blocks.
    for guide in GUIDES:
        text = (DOCS / guide).read_text(encoding="utf-8")
        assert text.count("```python") == len(python_blocks(DOCS / guide)), guide


@pytest.mark.parametrize("guide", GUIDES)
def test_guide_snippets_run(guide):
    path = DOCS / guide
    autograd.set_default_dtype(np.float32)  # the guides assume the documented default
    namespace = {"__name__": f"docs.{path.stem}"}
    parser = doctest.DocTestParser()
    flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    for lineno, code in python_blocks(path):
        if ">>>" in code:
            test = parser.get_doctest(code, namespace, f"{guide}:{lineno}", str(path), lineno)
            runner = doctest.DocTestRunner(optionflags=flags)
            runner.run(test, clear_globs=False)
            namespace = test.globs  # DocTest works on a copy; carry its names to the next block
            assert runner.failures == 0, f"{guide}: the block at line {lineno} failed (see above)"
        else:
            exec(compile(code, f"{path}:{lineno}", "exec"), namespace)
