"""Fine-tuning at the engine level: frozen parameters, LoRA, gradient accumulation, the loss mask.

Frozen (requires_grad=False): no gradient computed (the VJP returns None for it) or stored, eager
and compiled; optimizers skip it; checkpoints keep it. LoRA: step 0 equals the base model,
gradients of A and B gradchecked in float64, merge / unmerge / unload, the adapter saved alone.
Accumulation: N micro-batches give the update of one batch N times larger. Loss mask (notes 9.2):
a user token shapes the assistant's loss through attention but is never a target itself.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

import autograd
import nn
from autograd import Tensor, hooks
from autograd.gradcheck import gradcheck
from benchmarks.configs import training_step
from models import lora as models_lora
from models.architectures.gpt import GPT, IGNORE_INDEX, GPTConfig
from models.architectures.llama import Llama, llama_config
from models.formats.tokenizer import load_tokenizer
from models.training import chat_data
from models.training.sft import (
    chat_format,
    chatml,
    conversation_segments,
    encode_conversation,
    loss_mask_targets,
    pad_batch,
    read_conversations,
    tokens_and_mask,
)
from nn import checkpoint

V, T = 17, 8


@pytest.fixture(autouse=True)
def _float64():
    previous = autograd.get_default_dtype()
    autograd.set_default_dtype(np.float64)
    yield
    autograd.set_default_dtype(previous)


def _gpt(seed=0, n_embd=16):
    config = GPTConfig(vocab_size=V, block_size=T, n_layer=2, n_head=2, n_embd=n_embd)
    return GPT(config, rng=np.random.default_rng(seed))


def _batch(rows=4, seed=1):
    data = np.random.default_rng(seed).integers(0, V, size=(rows, T + 1))
    return data[:, :-1], data[:, 1:]


def _assert_close(a, b, fusion, name):
    """Bit for bit with fusion off; else the norm of the difference within 1e-12 of the
    tensor's (fused attention and AdamW round differently, as in tests/test_compile.py)."""
    if fusion is False:
        np.testing.assert_array_equal(a, b, err_msg=name)
    else:
        assert np.linalg.norm(a - b) <= 1e-12 * np.linalg.norm(b), name


FROZEN = ("transformer.wte.weight", "transformer.h.0.*", "transformer.ln_f.*")


# --- freezing --------------------------------------------------------------------------------


class _VJPs(hooks.Observer):
    """Every VJP's returned gradients, by the input tensors they are for."""

    def __init__(self):
        self.returned = []

    def backward_step(self, step, fn, output, grad, input_grads):
        self.returned += list(zip(fn.inputs, input_grads, strict=True))


def test_frozen_parameters_get_no_gradient_computed_or_stored():
    model = _gpt()
    names = model.freeze(*FROZEN)
    assert (
        "transformer.h.0.attn.c_attn.weight" in names and "transformer.h.1.ln_1.bias" not in names
    )
    frozen = {id(p) for n, p in model.named_parameters() if n in names}
    x, y = _batch()
    observer = _VJPs()
    hooks.ACTIVE.append(observer)
    try:
        model(x, y)[1].backward()
    finally:
        hooks.ACTIVE.remove(observer)
    computed = [id(t) for t, g in observer.returned if g is not None]
    assert not frozen & set(computed), "a VJP computed a gradient for a frozen parameter"
    for name, p in model.named_parameters():
        assert (p.grad is None) == (name in names), name
    # what is trained gets exactly the gradient it gets with nothing frozen (same products)
    reference = _gpt()
    reference(x, y)[1].backward()
    for (name, p), q in zip(model.named_parameters(), reference.parameters(), strict=True):
        if name not in names:
            np.testing.assert_array_equal(p.grad, q.grad, err_msg=name)


def test_linear_and_matmul_skip_the_product_of_an_input_without_grad():
    x = Tensor(np.ones((3, 4)), requires_grad=True)
    w = Tensor(np.ones((4, 2)))  # a frozen weight
    out = autograd.functional.linear(x, w)
    assert out.op.backward(np.ones((3, 2)))[1] is None
    out = x @ w
    assert out.op.backward(np.ones((3, 2)))[1] is None
    assert (x * 2.0).op.backward(np.ones((3, 4)))[1] is None


def test_parameter_counts_and_freeze_errors():
    model = _gpt()
    total = model.num_parameters()
    assert model.parameter_counts() == (total, total)
    model.freeze("transformer.wpe.weight")
    assert model.parameter_counts() == (total - T * 16, total)
    with pytest.raises(KeyError, match=r"no parameter name matches \['h\.0\.\*'\]"):
        model.freeze("h.0.*")  # HF names start with transformer.
    model.requires_grad_(False)
    assert model.parameter_counts() == (0, total)


def test_optimizers_skip_frozen_parameters():
    model = _gpt()
    model.freeze(*FROZEN)
    for opt in (
        nn.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        nn.optim.AdamW(model.parameters()),
    ):
        before = {n: p.data.copy() for n, p in model.named_parameters()}
        x, y = _batch()
        opt.zero_grad()
        model(x, y)[1].backward()
        for p in model.parameters():  # a stale gradient on a frozen one: still skipped
            if not p.requires_grad:
                p.grad = np.ones_like(p.data)
        opt.step()
        for name, p in model.named_parameters():
            changed = not np.array_equal(p.data, before[name])
            assert changed == p.requires_grad, name
            assert (p in opt.state) == p.requires_grad, name


def test_checkpoints_keep_frozen_parameters(tmp_path):
    model = _gpt()
    names = model.freeze(*FROZEN)
    checkpoint.save_checkpoint(tmp_path, model)
    fresh = _gpt(seed=3)
    checkpoint.load_checkpoint(tmp_path, fresh)
    assert [n for n, p in fresh.named_parameters() if not p.requires_grad] == names


def _compiled_vs_eager(fusion, prepare, steps=3):
    """Losses, model and step of `steps` AdamW steps, eager then compiled, models prepared alike."""
    runs = []
    for compiled in (False, True):
        model = _gpt()
        prepare(model)
        optimizer = nn.optim.AdamW(model.parameters(), lr=1e-2)
        step = training_step(model, optimizer)
        shards = 2 if fusion is True else None  # fusion on: the batch-sharded step, always
        run = autograd.compile(step, fusion=fusion, shards=shards) if compiled else step
        losses = [float(run(*_batch(seed=s)).data) for s in range(steps)]
        runs.append((losses, model, run))
    return runs


@pytest.mark.parametrize("fusion", [False, True])
def test_compiled_step_with_frozen_parameters_equals_eager(fusion):
    original = {n: p.data.copy() for n, p in _gpt().named_parameters()}
    (l_e, m_e, _), (l_c, m_c, run) = _compiled_vs_eager(fusion, lambda m: m.freeze(*FROZEN))
    for (name, p), q in zip(m_c.named_parameters(), m_e.parameters(), strict=True):
        if not p.requires_grad:  # untouched, and no gradient buffer at all
            np.testing.assert_array_equal(p.data, original[name], err_msg=name)
            assert p.grad is None, name
        _assert_close(p.data, q.data, fusion, name)
    np.testing.assert_allclose(l_c, l_e, rtol=0 if fusion is False else 1e-12)
    plan = run.plan_for(*_batch())
    if fusion is True:  # sharded; the trainable ones update as one fused AdamW (flat buffer)
        assert len(plan.shards) == 2 and "AdamW fused" in plan.describe()
    shards = getattr(plan, "shards", [plan])
    for shard in shards:
        for v in shard.leaves:
            if not v.requires_grad:
                assert shard.grads[v.id] is None, "a gradient buffer for a frozen parameter"


def _gradient_bytes(plan):
    shards = getattr(plan, "shards", [plan])
    return sum(s.grads[v.id].nbytes for s in shards for v in s.leaves if s.grads[v.id] is not None)


def test_compiled_step_keeps_no_gradient_buffers_for_frozen_parameters():
    (_, _, full), (_, _, frozen) = (
        _compiled_vs_eager(False, lambda m: None)[1],
        _compiled_vs_eager(False, lambda m: m.freeze(*FROZEN))[1],
    )
    model = _gpt()
    model.freeze(*FROZEN)
    frozen_bytes = sum(p.data.nbytes for p in model.parameters() if not p.requires_grad)
    saved = _gradient_bytes(full.plan_for(*_batch())) - _gradient_bytes(frozen.plan_for(*_batch()))
    assert saved == frozen_bytes


def test_freezing_or_unfreezing_after_tracing_retraces():
    (_, model, run) = _compiled_vs_eager(False, lambda m: m.freeze("transformer.h.1.*"), steps=1)[1]
    weight = model.transformer.h[1].mlp.c_fc.weight
    before = weight.data.copy()
    weight.requires_grad = True  # a plan without its gradient would leave it as it is
    run(*_batch())
    assert not np.array_equal(weight.data, before)
    model.freeze("transformer.h.1.*")
    before = weight.data.copy()
    run(*_batch())
    np.testing.assert_array_equal(weight.data, before)
    assert weight.grad is None
    assert len(run.plans) == 1  # the stale plan was replaced, not kept beside


# --- LoRA ------------------------------------------------------------------------------------


def test_lora_step_zero_equals_the_base_model_and_only_adapters_train():
    model = _gpt()
    x, y = _batch()
    logits, loss = model(x, y)
    names = nn.apply_lora(model, "c_attn,c_fc", rank=2, alpha=4.0)
    assert names == [f"transformer.h.{i}.{m}" for i in (0, 1) for m in ("attn.c_attn", "mlp.c_fc")]
    lora_logits, lora_loss = model(x, y)
    np.testing.assert_array_equal(lora_logits.data, logits.data)  # B = 0: x W + b + 0
    trainable, _ = model.parameter_counts()
    assert trainable == sum(2 * (16 + out) for out in (48, 64)) * 2
    lora_loss.backward()
    for name, p in model.named_parameters():
        assert (p.grad is not None) == ("lora_" in name), name
    # with B = 0 only B gets a gradient: dA = x^T (g B^T) s = 0
    assert not model.transformer.h[0].attn.c_attn.lora_A.grad.any()
    assert model.transformer.h[0].attn.c_attn.lora_B.grad.any()


def test_lora_gradients_gradcheck():
    rng = np.random.default_rng(0)
    lora = nn.LoRA(nn.Linear(5, 3, rng=rng), rank=2, alpha=3.0, rng=rng)
    assert not lora.weight.requires_grad and not lora.bias.requires_grad  # the base is frozen
    lora.lora_B.data = rng.standard_normal((2, 3))  # nonzero B, so that A's gradient is too
    x = Tensor(rng.standard_normal((2, 4, 5)), requires_grad=True)
    gradcheck(lambda x, a, b: lora(x), [x, lora.lora_A, lora.lora_B])
    # the forward is x W + b + (alpha / r) (x A) B
    expected = x.data @ lora.weight.data + lora.bias.data
    expected = expected + 1.5 * (x.data @ lora.lora_A.data) @ lora.lora_B.data
    np.testing.assert_allclose(lora(x).data, expected, rtol=1e-13)


def _trained_lora(seed=0):
    model = _gpt()
    nn.apply_lora(model, ["c_attn", "transformer.h.1.mlp.c_proj"], rank=3, alpha=6.0)
    rng = np.random.default_rng(seed)
    for _, m in nn.lora.lora_modules(model):
        m.lora_B.data = rng.standard_normal(m.lora_B.shape) * 0.1  # as if trained
    return model


def test_lora_merge_unmerge_unload():
    model = _trained_lora()
    x, _ = _batch()
    logits = model(x)[0].data
    base_weight = model.transformer.h[0].attn.c_attn.weight.data.copy()
    nn.merge_lora(model)
    np.testing.assert_allclose(model(x)[0].data, logits, rtol=1e-12, atol=1e-13)
    nn.unmerge_lora(model)
    np.testing.assert_allclose(
        model.transformer.h[0].attn.c_attn.weight.data, base_weight, atol=1e-15
    )
    np.testing.assert_allclose(model(x)[0].data, logits, rtol=1e-12, atol=1e-13)
    keys = set(_gpt().state_dict())
    assert nn.unload_lora(model) == [
        n
        for n in (
            "transformer.h.0.attn.c_attn",
            "transformer.h.1.attn.c_attn",
            "transformer.h.1.mlp.c_proj",
        )
    ]
    assert set(model.state_dict()) == keys  # a plain GPT-2 again
    np.testing.assert_allclose(model(x)[0].data, logits, rtol=1e-12, atol=1e-13)


def test_lora_adapter_saved_alone_and_loaded(tmp_path):
    model = _trained_lora()
    x, _ = _batch()
    nn.save_adapter(tmp_path, model)
    arrays, _ = checkpoint.load_safetensors(tmp_path / "adapter_model.safetensors")
    assert sorted(arrays) == sorted(
        f"{n}.{p}" for n, _ in nn.lora.lora_modules(model) for p in ("lora_A", "lora_B")
    )
    fresh = _gpt()  # the same base weights
    nn.load_adapter(tmp_path, fresh)
    np.testing.assert_array_equal(fresh(x)[0].data, model(x)[0].data)
    assert fresh.parameter_counts() == model.parameter_counts()


def test_the_default_targets_are_the_attention_projections():
    assert nn.lora.attention_projections(_gpt()) == ["c_attn", "*.attn.c_proj"]
    model = _gpt()
    wrapped = nn.apply_lora(model, nn.lora.attention_projections(model))
    assert wrapped == [f"transformer.h.{i}.attn.{m}" for i in (0, 1) for m in ("c_attn", "c_proj")]


LLAMA_SETUPS = {
    "full": lambda m: None,
    "lora": lambda m: nn.apply_lora(m, "q_proj,v_proj", rank=2, alpha=4.0),
    "frozen MLP": lambda m: m.freeze("model.layers.*.mlp.*"),
}


@pytest.mark.parametrize("fusion", [False, True])
@pytest.mark.parametrize("setup", sorted(LLAMA_SETUPS))
def test_compiled_llama_step_equals_eager(fusion, setup):
    # The plan frees a forward value after the last VJP that reads it: RMSNorm its input, SwiGLU
    # both inputs, a product only the factor the other factor's gradient needs, a Linear its
    # input only for a trained weight; rotary, broadcasts and sums keep nothing. A buffer handed
    # on too early shows as a wrong gradient here (grouped-query attention, untied head).
    config = llama_config(
        vocab_size=V, block_size=T, n_layer=2, n_head=4, n_kv_head=2, n_embd=16, ffn_hidden=24,
        tie_word_embeddings=False,
    )  # fmt: skip
    runs = []
    for compiled in (False, True):
        model = Llama(config, rng=np.random.default_rng(0))
        LLAMA_SETUPS[setup](model)
        optimizer = nn.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
        step = training_step(model, optimizer)
        run = autograd.compile(step, fusion=fusion) if compiled else step
        losses = [float(run(*_batch(seed=s)).data) for s in range(3)]
        runs.append((losses, model))
    (l_e, m_e), (l_c, m_c) = runs
    np.testing.assert_allclose(l_c, l_e, rtol=0 if fusion is False else 1e-12)
    for (name, p), q in zip(m_c.named_parameters(), m_e.parameters(), strict=True):
        _assert_close(p.data, q.data, fusion, name)


def test_lora_errors():
    with pytest.raises(KeyError, match=r"no Linear matches \['q_proj'\]"):
        nn.apply_lora(_gpt(), "q_proj")
    with pytest.raises(ValueError, match="rank must be a positive integer"):
        nn.LoRA(nn.Linear(2, 2), rank=0, alpha=1.0)


@pytest.mark.parametrize("fusion", [False, True])
def test_compiled_lora_step_equals_eager(fusion):
    def prepare(model):
        nn.apply_lora(model, "c_attn,c_proj", rank=2, alpha=4.0)

    (l_e, m_e, _), (l_c, m_c, run) = _compiled_vs_eager(fusion, prepare)
    if fusion is True:  # LoRA keeps the step row-separable: sharded over the batch
        assert len(run.plan_for(*_batch()).shards) == 2
    for (name, p), q in zip(m_c.named_parameters(), m_e.parameters(), strict=True):
        _assert_close(p.data, q.data, fusion, name)
        assert (p.grad is not None) == p.requires_grad == ("lora_" in name), name
    assert m_c.transformer.h[0].attn.c_attn.lora_B.data.any()  # the adapters moved from B = 0
    np.testing.assert_allclose(l_c, l_e, rtol=0 if fusion is False else 1e-12)


# --- gradient accumulation -------------------------------------------------------------------


def test_accumulation_equals_one_large_batch_with_unevenly_ignored_targets():
    x, y = _batch(rows=6, seed=2)
    y = y.copy()
    y[0, :7] = IGNORE_INDEX  # micro-batch 0 keeps few targets, micro-batch 2 all of them
    y[1, 2:] = IGNORE_INDEX
    y[3, ::2] = IGNORE_INDEX
    results = []
    for micro in (1, 3):
        model = _gpt()
        optimizer = nn.optim.AdamW(model.parameters(), lr=1e-2)
        for _ in range(2):
            optimizer.zero_grad()
            loss = nn.accumulate_gradients(
                lambda a, b, model=model: model(a, b)[1], nn.split_batch(x, y, micro)
            )
            optimizer.step()
        results.append((loss.item(), [p.data.copy() for p in model.parameters()]))
    (loss_1, params_1), (loss_3, params_3) = results
    assert abs(loss_1 - loss_3) <= 1e-12 * abs(loss_1)
    for a, b in zip(params_1, params_3, strict=True):
        np.testing.assert_allclose(b, a, rtol=1e-12, atol=1e-12)


def test_accumulation_weights_by_counted_targets_not_by_micro_batch():
    x, y = _batch(rows=2, seed=2)
    y = y.copy()
    y[0, 1:] = IGNORE_INDEX  # 1 target against 8
    grads = []
    for micro in (1, 2):
        model = _gpt()
        nn.accumulate_gradients(
            lambda a, b, model=model: model(a, b)[1], nn.split_batch(x, y, micro)
        )
        grads.append(model.transformer.wte.weight.grad)
    np.testing.assert_allclose(grads[1], grads[0], rtol=1e-12, atol=1e-15)
    assert nn.counted_targets(y) == 9
    with pytest.raises(ValueError, match="no target in 1 micro-batches counts"):
        nn.accumulate_gradients(lambda a, b: None, [(x, np.full_like(y, IGNORE_INDEX))])


def _accumulating_step(model, optimizer):
    def step(weights, *arrays):  # x_1, y_1, x_2, y_2, ...: every micro-batch an argument
        optimizer.zero_grad()
        pairs = list(zip(arrays[::2], arrays[1::2], strict=True))
        loss = nn.accumulate_gradients(lambda a, b: model(a, b)[1], pairs, weights)
        optimizer.step()
        return loss

    return step


@pytest.mark.parametrize("fusion", [False, True])
def test_compiled_accumulation_equals_eager_and_reuses_the_activations(fusion):
    runs = []
    for compiled in (False, True):
        model = _gpt()
        optimizer = nn.optim.AdamW(model.parameters(), lr=1e-2)
        step = _accumulating_step(model, optimizer)
        if compiled:
            step = autograd.compile(step, fusion=fusion)
        losses = []
        for seed in range(3):  # new data, new counts, new weights: the same plan replays
            x, y = _batch(rows=4, seed=seed)
            y = y.copy()
            y[seed, : 2 + seed] = IGNORE_INDEX
            pairs = nn.split_batch(x, y, 2)
            weights = nn.accumulation_weights([b for _, b in pairs])
            arrays = [a.copy() for pair in pairs for a in pair]  # arrays of their own
            losses.append(float(step(weights, *arrays).data))
        runs.append((losses, model, step))
    (l_e, m_e, _), (l_c, m_c, run) = runs
    np.testing.assert_allclose(l_c, l_e, rtol=0 if fusion is False else 1e-12)
    for (name, p), q in zip(m_c.named_parameters(), m_e.parameters(), strict=True):
        _assert_close(p.data, q.data, fusion, name)
    assert len(run.plans) == 1
    # the second micro-batch's forward reuses the first one's activation buffers: the arena is
    # that of one micro-batch (2 rows) plus the second backward's gradient buffers (one per
    # parameter, added into .grad) and a few scalars (the weighted losses and their sum), not
    # two micro-batches' activations
    fresh = _gpt()
    single = autograd.compile(lambda x, y: _single_step(fresh, x, y), fusion=fusion, shards=1)
    single(*_batch(rows=2))
    accumulating, one = run.plans[next(iter(run.plans))], single.plans[next(iter(single.plans))]
    gradients = sum(p.data.nbytes for p in fresh.parameters())
    assert accumulating.arena.nbytes <= one.arena.nbytes + gradients + 256


def _single_step(model, x, y):
    _, loss = model(x, y)
    loss.backward()
    for p in model.parameters():
        p.grad = None
    return loss


# --- the loss mask (notes 9.2) ---------------------------------------------------------------


def _conversation(user):
    """system/user tokens (not trained), then the assistant's answer (trained)."""
    tokens, trained = tokens_and_mask([([1, *user], False), ([2], False), ([5, 6, 7], True)])
    return loss_mask_targets(tokens, trained)


def test_loss_mask_targets_only_the_assistant_tokens_and_never_padding():
    inputs, targets = _conversation([9, 10, 11])
    assert inputs.tolist() == [1, 9, 10, 11, 2, 5, 6]
    assert targets.tolist() == [IGNORE_INDEX] * 4 + [5, 6, 7]  # position 4 (the header) predicts 5
    x, y = pad_batch([(inputs, targets), _conversation([9])], pad_id=0, length=T)
    assert x[1].tolist() == [1, 9, 2, 5, 6, 0, 0, 0]
    assert y[1].tolist() == [IGNORE_INDEX] * 2 + [5, 6, 7] + [IGNORE_INDEX] * 3


def test_a_user_token_changes_the_assistant_loss_but_is_never_a_target():
    model = _gpt()
    losses, grads = [], []
    for user in ([9, 10, 11], [9, 3, 11]):  # one user token changed
        x, y = pad_batch([_conversation(user)], pad_id=0, length=T)
        logits, loss = model(x, y)
        logits.retain_grad()
        loss.backward()
        losses.append(loss.item())
        grads.append(logits.grad[0])
        user_rows = y[0] == IGNORE_INDEX
        # no user (or padding) position is a target: its logits get exactly zero gradient
        assert not grads[-1][user_rows].any()
        assert grads[-1][~user_rows].any()
    # the assistant positions read the user's tokens through attention: their loss moves
    assert abs(losses[0] - losses[1]) > 1e-6
    # and the causal attention mask: positions before the changed token (0) see no change
    x0, y0 = pad_batch([_conversation([9, 10, 11])], 0, T)
    x1, y1 = pad_batch([_conversation([9, 3, 11])], 0, T)
    l0, l1 = model(x0, y0)[0].data[0], model(x1, y1)[0].data[0]  # logits of every position
    np.testing.assert_array_equal(l0[:2], l1[:2])
    assert not np.allclose(l0[4:7], l1[4:7])


CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "3+3?"},
    {"role": "assistant", "content": "6"},
]


def test_the_template_locates_every_assistant_turn_and_its_end_marker():
    segments = conversation_segments(CONVERSATION, chatml)
    assert [text for text, trained in segments if trained] == ["4<|im_end|>\n", "6<|im_end|>\n"]
    assert "".join(text for text, _ in segments) == chatml(CONVERSATION, False)
    assert segments[0] == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
        "<|im_start|>assistant\n",
        False,
    )
    encode = lambda text: [ord(c) for c in text]  # noqa: E731  (one token per character)
    tokens, trained = encode_conversation(CONVERSATION, chatml, encode)
    assert "".join(chr(t) for t in tokens[trained]) == "4<|im_end|>\n6<|im_end|>\n"


def test_conversation_errors_are_clear(tmp_path):
    merging = lambda text: [ord(c) for c in text.replace("\n4", "\x00")]  # noqa: E731
    with pytest.raises(ValueError, match="encode differently from the whole text"):
        encode_conversation(CONVERSATION, chatml, merging)
    with pytest.raises(ValueError, match="no assistant message"):
        conversation_segments(CONVERSATION[:2], chatml)
    path = tmp_path / "chat.jsonl"
    path.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n', "utf-8")
    with pytest.raises(ValueError, match="chat.jsonl:1: the conversation has no assistant"):
        read_conversations(path)
    path.write_text('{"messages": [{"role": "user"}]}\n', "utf-8")
    with pytest.raises(ValueError, match=r"chat.jsonl:1: expected"):
        read_conversations(path)
    path.write_text(json.dumps({"messages": CONVERSATION}) + "\n\n", "utf-8")
    assert read_conversations(path) == [CONVERSATION]


def test_the_signature_conversations_come_from_the_stdlib_and_hold_functions_out(tmp_path):
    pairs = {n: s for n, s in chat_data.signatures() if len(s) <= chat_data.MAX_SIGNATURE}
    assert len(pairs) > 300
    assert pairs["bisect.insort_right"] == "insort_right(a, x, lo=0, hi=None, *, key=None)"
    assert pairs["argparse.ArgumentParser.error"] == "error(message)"  # self dropped
    train, held = chat_data.signature_conversations(held_out=0.1, seed=0)
    asked = lambda c: c[1]["content"]  # noqa: E731
    assert not {asked(c) for c in train} & {asked(c) for c in held}
    assert len(held) == round(0.1 * len(pairs))
    assert chat_data.signature_conversations(held_out=0.1, seed=0)[1] == held
    chat_data.write_jsonl(tmp_path / "held.jsonl", held)
    assert read_conversations(tmp_path / "held.jsonl") == held


def test_models_lora_merge_writes_a_base_checkpoint_with_the_same_logits(tmp_path, capsys):
    base = _gpt()
    base.save_pretrained(tmp_path / "base")
    (tmp_path / "base" / "tokenizer.json").write_text("{}", "utf-8")  # copied as it is
    model = _trained_lora()
    nn.save_adapter(tmp_path / "adapter", model)
    args = ["merge", "--base", str(tmp_path / "base"), "--adapter", str(tmp_path / "adapter")]
    args += ["--dtype", "float64"]
    assert models_lora.main([*args, "--out", str(tmp_path / "merged")]) == 0
    assert "merged 3 adapters" in capsys.readouterr().out
    merged = GPT.from_pretrained(tmp_path / "merged")
    assert set(merged.state_dict()) == set(base.state_dict())
    assert (tmp_path / "merged" / "tokenizer.json").read_text("utf-8") == "{}"
    x, _ = _batch()
    np.testing.assert_allclose(merged(x)[0].data, model(x)[0].data, rtol=1e-12, atol=1e-13)
    with pytest.raises(ValueError, match="--out must not be the --base"):
        models_lora.merge(tmp_path / "base", tmp_path / "adapter", tmp_path / "base")
    # the command line: a missing or malformed base or adapter is one line, exit status 2
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "adapter_config.json").write_text("{", "utf-8")
    for base_dir, adapter, message in (
        ("nothing", "adapter", "error: .*nothing does not exist"),
        ("base", "nothing", "error: .*nothing holds no LoRA adapter: no adapter_config.json"),
        ("base", "broken", "error: .*adapter_config.json: not JSON .*"),
    ):
        argv = ["merge", "--base", str(tmp_path / base_dir), "--adapter", str(tmp_path / adapter)]
        assert models_lora.main([*argv, "--out", str(tmp_path / "out")]) == 2
        assert re.fullmatch(message + "\n", capsys.readouterr().err), (base_dir, adapter)


class _Aliased(nn.Module):
    """A layer registered under one name and read by another (as Llama's o_proj is read as
    c_proj by the forward written for GPT-2's names)."""

    def __init__(self):
        super().__init__()
        self.o_proj = nn.Linear(4, 4, rng=np.random.default_rng(0))
        object.__setattr__(self, "c_proj", self.o_proj)

    def forward(self, x):
        return self.c_proj(x)


def test_lora_replaces_a_layer_under_every_name_the_forward_reads():
    layer = _Aliased()
    nn.apply_lora(layer, "o_proj", rank=2, alpha=2.0)
    assert layer.c_proj is layer.o_proj and isinstance(layer.c_proj, nn.LoRA)
    layer.o_proj.lora_B.data = np.ones((2, 4))
    x = Tensor(np.ones((1, 4)))
    assert not np.allclose(
        layer(x).data, autograd.functional.linear(x, layer.o_proj.weight, layer.o_proj.bias).data
    )
    nn.unload_lora(layer)
    assert layer.c_proj is layer.o_proj and type(layer.c_proj) is nn.Linear


def test_a_tokenizers_own_chat_template_marks_the_assistant_turns_in_single_tokens():
    """SmolLM2's tokenizer (tests/fixtures/hf): its ChatML template with <|im_start|> and
    <|im_end|> as added tokens; the trained piece of a turn is the answer and its end marker."""
    tokenizer = load_tokenizer(Path(__file__).parent / "fixtures" / "hf" / "smollm2_tokenizer")
    render, encode = chat_format(tokenizer)
    segments = conversation_segments(CONVERSATION, render)
    assert [text for text, trained in segments if trained] == ["4<|im_end|>\n", "6<|im_end|>\n"]
    tokens, trained = encode_conversation(CONVERSATION, render, encode)
    end = encode("<|im_end|>")
    assert len(end) == 1 and (tokens[trained] == end[0]).sum() == 2
    assert chat_format(CharTokenizerStub())[0] is chatml  # no template of its own: ChatML


class CharTokenizerStub:
    chat_template = None

    def encode(self, text):
        return [ord(c) for c in text]
