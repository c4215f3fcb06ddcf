"""The README's Python snippets run (so the first code a user copies cannot rot)."""

import re
from pathlib import Path

import numpy as np

import autograd
from autograd import Function, Tensor
from models.gpt import GPT, GPTConfig
from models.llama import Llama, llama_config
from models.tokenizer import BPETokenizer

README = Path(__file__).resolve().parent.parent / "README.md"


def python_blocks():
    return re.findall(r"```python\n(.*?)```", README.read_text("utf-8"), flags=re.S)


def test_readme_snippets_run_and_the_contributing_example_is_correct(tmp_path, monkeypatch):
    # The GPT-2 snippet loads "gpt2": a small model + tokenizer in GPT-2's file formats.
    tok = BPETokenizer.from_pretrained(Path(__file__).parent / "fixtures" / "bpe")
    config = GPTConfig(vocab_size=tok.vocab_size, block_size=32, n_layer=1, n_head=2, n_embd=16)
    GPT(config).save_pretrained(tmp_path / "gpt2")
    tok.save(tmp_path / "gpt2")
    # The Llama snippet loads "SmolLM2-135M-Instruct": a tiny Llama + the same tokenizer.
    llama = llama_config(vocab_size=tok.vocab_size, block_size=64, n_layer=1, n_head=4, n_embd=16)
    Llama(llama).save_pretrained(tmp_path / "SmolLM2-135M-Instruct")
    tok.save(tmp_path / "SmolLM2-135M-Instruct")
    monkeypatch.chdir(tmp_path)
    blocks = python_blocks()
    assert len(blocks) >= 2
    namespace = {"np": np, "Function": Function}  # one session, like a reader typing them in
    for block in blocks:
        exec(compile(_dedent(block), str(README), "exec"), namespace)
    # The op written in CONTRIBUTING passes the same gradient check as every other op, and the
    # property test the README writes for it (autograd.testing.check_op) runs green.
    softplus = namespace["Softplus"]
    x = Tensor(np.linspace(-3, 3, 7), dtype=np.float64, requires_grad=True)
    assert autograd.gradcheck(lambda t: softplus.apply(t), [x]).ok
    namespace["test_softplus"]()


def _dedent(block):
    lines = block.splitlines()
    indent = min((len(line) - len(line.lstrip()) for line in lines if line.strip()), default=0)
    return "\n".join(line[indent:] for line in lines)
