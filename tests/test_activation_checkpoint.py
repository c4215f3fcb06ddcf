"""autograd.checkpoint and GPTConfig(gradient_checkpointing=True): the gradients equal the
un-checkpointed ones (float64, 1e-12), dropout masks included, with fewer activations kept."""

from __future__ import annotations

import numpy as np
import pytest

import autograd
import autograd.functional as F
import nn
from autograd import Tensor
from autograd.tensor import _topological_order
from benchmarks.configs import training_step
from models.architectures.gpt import GPT, GPTConfig
from models.architectures.llama import Llama, llama_config


def kept_bytes(out: Tensor) -> int:
    """Bytes of the distinct arrays the graph of `out` keeps for backward (its saved arrays)."""
    arrays = {}
    for t in _topological_order([out]):
        if t._ctx is not None:
            for a in t._ctx.saved:
                for x in a if isinstance(a, tuple) else (a,):
                    if isinstance(x, np.ndarray):
                        arrays[id(x)] = x.nbytes
    return sum(arrays.values())


def gpt_step(checkpointing: bool):
    config = GPTConfig(vocab_size=11, block_size=8, n_layer=3, n_head=2, n_embd=8, dropout=0.2)
    config.gradient_checkpointing = checkpointing
    model = GPT(config, rng=np.random.default_rng(5))
    rng = np.random.default_rng(6)
    idx, targets = rng.integers(0, 11, (2, 8)), rng.integers(0, 11, (2, 8))
    _, loss = model(idx, targets)
    kept = kept_bytes(loss)
    loss.backward()
    after = [m.rng.random() for m in model.modules() if isinstance(m, nn.Dropout)]
    return loss.item(), {n: p.grad for n, p in model.named_parameters()}, kept, after


def test_gpt_gradients_with_checkpointing_equal_the_plain_ones(float64):
    loss, grads, kept, after = gpt_step(checkpointing=False)
    loss_c, grads_c, kept_c, after_c = gpt_step(checkpointing=True)
    assert loss_c == loss
    for name, g in grads.items():
        np.testing.assert_allclose(grads_c[name], g, rtol=1e-12, atol=1e-15, err_msg=name)
    assert after_c == after  # the dropout streams go on exactly where they would have
    assert kept_c < 0.5 * kept  # the blocks' activations are not kept


def test_checkpoint_of_a_function_with_constants_and_its_own_parameters(float64):
    rng = np.random.default_rng(0)
    w = Tensor(rng.standard_normal((3, 3)), requires_grad=True)
    x = Tensor(rng.standard_normal((4, 3)), requires_grad=True)
    mask = rng.random((4, 3)) < 0.5

    def gradients(use_checkpoint):
        masks = np.random.default_rng(1)  # the same dropout stream for both runs

        def segment(h, keep, scale):  # reads w itself; keep and scale are constants
            return F.dropout(F.gelu(h @ w) * Tensor(keep), 0.3, rng=masks) * scale

        h = x * 2
        y = autograd.checkpoint(segment, h, mask, 3.0) if use_checkpoint else segment(h, mask, 3.0)
        y = F.dropout(y, 0.5, rng=masks)  # the stream goes on after the segment
        found = autograd.grad((y * y).sum(), [x, w])
        return found, masks.random()  # where the stream stands after backward

    plain, after = gradients(False)
    checked, after_checked = gradients(True)
    for a, b in zip(checked, plain, strict=True):
        np.testing.assert_allclose(a.data, b.data, rtol=1e-12, atol=1e-15)
    assert after_checked == after  # the replay put the generator back where it was
    # twice differentiable: the replay runs its VJPs on Tensors under create_graph
    autograd.gradgradcheck(
        lambda t: autograd.checkpoint(lambda u: (u @ w).tanh(), t), [Tensor(x.data, True)]
    )


def test_checkpoint_refuses_an_input_changed_in_place_before_backward(float64):
    x = Tensor(np.ones(3), requires_grad=True)
    h = x * 1.0
    y = autograd.checkpoint(lambda t: (t * t).sum(), h)
    with autograd.no_grad():
        h.data[0] = 5.0
        h._counter.value += 1
    with pytest.raises(RuntimeError, match="modified in place"):
        y.backward()


def test_checkpoint_without_grad_or_inside_forward_mode_is_the_plain_call(float64):
    x = Tensor(np.arange(3.0))
    with autograd.no_grad():
        assert autograd.checkpoint(lambda t: t * 2, Tensor(x.data, True)).op is None
    assert autograd.checkpoint(lambda t: t * 2, x).op is None
    _, dot = autograd.jvp(lambda t: autograd.checkpoint(lambda u: u * u, t), (x,), (np.ones(3),))
    np.testing.assert_array_equal(dot.data, 2 * x.data)
    with pytest.raises(TypeError, match="fn must return one Tensor"):
        autograd.checkpoint(lambda t: (t, t), Tensor(x.data, True))
    outer = Tensor(x.data, True) * 2  # not a leaf: fn must get it as an argument
    with pytest.raises(ValueError, match=r"reads a tensor of shape \(3,\) made by Mul outside"):
        autograd.checkpoint(lambda t: t * outer, Tensor(x.data, True))


def test_a_llama_with_checkpointed_blocks_compiles_to_the_plain_eager_step(float64):
    # rotary, RMSNorm, SwiGLU and grouped-query attention inside the segments, dropout on
    def setup(checkpointing):
        config = llama_config(
            vocab_size=50, block_size=16, n_layer=2, n_head=4, n_kv_head=2, n_embd=16,
            ffn_hidden=24, tie_word_embeddings=True, dropout=0.1,
            gradient_checkpointing=checkpointing,
        )  # fmt: skip
        model = Llama(config, rng=np.random.default_rng(0))
        optimizer = nn.optim.AdamW(model.parameters(), lr=1e-3)

        return model, training_step(model, optimizer)

    plain, eager = setup(False)
    checkpointed, step = setup(True)
    compiled = autograd.compile(step, fusion=False)
    rng = np.random.default_rng(1)
    for _ in range(3):
        d = rng.integers(0, 50, (3, 17))
        assert compiled(d[:, :-1], d[:, 1:]).item() == eager(d[:, :-1], d[:, 1:]).item()
    for (name, p), q in zip(plain.named_parameters(), checkpointed.parameters(), strict=True):
        assert np.array_equal(p.data, q.data), name
