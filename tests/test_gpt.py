"""The GPT model: names and layouts (HF GPT-2), causality, loss mask, gradients, checkpoints."""

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import autograd
import nn
from models.architectures.gpt import GPT, GPTConfig

TINY = dict(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=8)


def tiny_model(seed=0, scale=None, **overrides):
    """A tiny GPT; scale re-draws every weight at that std so that gradients are not tiny."""
    model = GPT(GPTConfig(**{**TINY, **overrides}), rng=np.random.default_rng(seed))
    if scale is not None:
        rng = np.random.default_rng(seed + 1)
        with autograd.no_grad():
            for name, p in model.named_parameters():
                base = 1.0 if name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")) else 0.0
                p.data = (base + rng.normal(0, scale, p.shape)).astype(p.dtype)
    return model


def hf_names(n_layer):
    names = ["transformer.wte.weight", "transformer.wpe.weight"]
    for i in range(n_layer):
        for part in ("ln_1", "attn.c_attn", "attn.c_proj", "ln_2", "mlp.c_fc", "mlp.c_proj"):
            names += [f"transformer.h.{i}.{part}.weight", f"transformer.h.{i}.{part}.bias"]
    return names + ["transformer.ln_f.weight", "transformer.ln_f.bias"]


# --- configuration ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change, message",
    [
        (dict(n_embd=10, n_head=4), "divisible by n_head"),
        (dict(vocab_size=0), "vocab_size must be a positive integer"),
        (dict(block_size=2.5), "block_size must be a positive integer"),
        (dict(n_layer=True), "n_layer must be a positive integer"),
        (dict(dropout=1.0), "dropout must be in"),
    ],
)
def test_config_rejects_bad_values(change, message):
    with pytest.raises(ValueError, match=message):
        GPTConfig(**{**TINY, **change})


def test_config_json_round_trip():
    config = GPTConfig(**TINY, dropout=0.1, bias=False)
    hf = config.to_hf_dict()
    assert hf["n_positions"] == hf["n_ctx"] == 8 and hf["model_type"] == "gpt2"
    assert GPTConfig.from_hf_dict(hf) == config
    plain = {k: v for k, v in hf.items() if k != "glassgrad"}
    assert GPTConfig.from_hf_dict(plain) == GPTConfig(**TINY)


# --- structure ----------------------------------------------------------------------------------


def test_parameter_names_and_layouts_are_hf_gpt2():
    model = tiny_model()
    shapes = {name: p.shape for name, p in model.named_parameters()}
    assert list(shapes) == hf_names(2)
    c, v = 8, 11
    assert shapes["transformer.wte.weight"] == (v, c)
    assert shapes["transformer.wpe.weight"] == (8, c)
    assert shapes["transformer.h.1.attn.c_attn.weight"] == (c, 3 * c)
    assert shapes["transformer.h.1.attn.c_proj.weight"] == (c, c)
    assert shapes["transformer.h.0.mlp.c_fc.weight"] == (c, 4 * c)
    assert shapes["transformer.h.0.mlp.c_proj.weight"] == (4 * c, c)
    # The head is tied (no separate lm_head parameter): 2 embeddings + 2 blocks + ln_f.
    per_block = (
        2 * c + (c * 3 * c + 3 * c) + (c * c + c) + 2 * c + (c * 4 * c + 4 * c) + 4 * c * c + c
    )
    assert model.num_parameters() == v * c + 8 * c + 2 * per_block + 2 * c


def test_same_rng_seed_same_weights_and_bias_free_variant():
    a, b = tiny_model(seed=3), tiny_model(seed=3)
    for (name, p), (_, q) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        np.testing.assert_array_equal(p.data, q.data, err_msg=name)
    bare = tiny_model(bias=False)
    assert not any(name.endswith("bias") for name, _ in bare.named_parameters())


def test_fresh_model_loss_is_near_log_vocab():
    vocab = 50
    model = GPT(GPTConfig(vocab, 16, 2, 2, 16))
    rng = np.random.default_rng(0)
    idx = rng.integers(0, vocab, (4, 16))
    targets = rng.integers(0, vocab, (4, 16))
    _, loss = model(idx, targets)
    assert abs(loss.item() - math.log(vocab)) < 0.05


# --- forward semantics --------------------------------------------------------------------------


@settings(deadline=None)
@given(
    seed=st.integers(0, 2**16),
    cut=st.integers(0, 6),
)
def test_causality_changing_later_tokens_never_changes_earlier_logits(seed, cut):
    """Notes 7.5: logits at positions <= i depend only on tokens <= i, through every layer."""
    autograd.set_default_dtype(np.float64)
    model = tiny_model(scale=0.5)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, 11, (2, 8))
    changed = idx.copy()
    shift = rng.integers(1, 11, (2, 8 - cut - 1))
    changed[:, cut + 1 :] = (idx[:, cut + 1 :] + shift) % 11  # every later token differs
    before, _ = model(idx, idx)
    after, _ = model(changed, changed)
    np.testing.assert_allclose(
        after.data[:, : cut + 1], before.data[:, : cut + 1], rtol=0, atol=1e-12
    )
    assert not np.allclose(after.data[:, cut + 1 :], before.data[:, cut + 1 :])


def test_loss_ignores_minus_100_targets(float64):
    model = tiny_model(scale=0.5)
    rng = np.random.default_rng(1)
    idx = rng.integers(0, 11, (3, 8))
    targets = rng.integers(0, 11, (3, 8))
    targets[0, :5] = -100  # e.g. a prompt that is not scored (notes 9.2: a loss mask)
    targets[2, 7] = -100
    logits, loss = model(idx, targets)
    z = logits.data
    log_p = z - z.max(-1, keepdims=True)
    log_p -= np.log(np.exp(log_p).sum(-1, keepdims=True))
    kept = targets != -100
    expected = -log_p[kept, targets[kept]].mean()
    assert loss.item() == pytest.approx(expected, rel=1e-12)
    _, none_scored = model(idx, np.full_like(targets, -100))
    assert none_scored.item() == 0.0


def test_without_targets_only_the_last_position_is_computed(float64):
    model = tiny_model(scale=0.5)
    idx = np.random.default_rng(2).integers(0, 11, (2, 6))
    full, _ = model(idx, idx)
    last, loss = model(idx)
    assert loss is None and last.shape == (2, 1, 11)
    np.testing.assert_allclose(last.data[:, 0], full.data[:, -1], rtol=1e-12, atol=1e-12)


def test_gradcheck_whole_model_float64(float64):
    model = tiny_model(scale=0.3, n_embd=4, vocab_size=5, block_size=4)
    rng = np.random.default_rng(4)
    idx = rng.integers(0, 5, (2, 4))
    targets = rng.integers(0, 5, (2, 4))
    targets[1, 0] = -100
    params = list(model.parameters())

    def loss_fn(*_params):
        return model(idx, targets)[1]

    autograd.gradcheck(loss_fn, params, atol=1e-8, rtol=1e-6)


def test_tied_head_gets_both_gradient_paths(float64):
    """wte is used twice (lookup and output scores, notes 9.4): the two contributions add."""
    model = tiny_model(scale=0.3)
    idx = np.array([[1, 2, 3]])
    _, loss = model(idx, np.array([[2, 3, 4]]))
    loss.backward()
    grad = model.transformer.wte.weight.grad
    unused = [t for t in range(11) if t not in (1, 2, 3)]
    # Rows of tokens that never appear in the input still get the output-head gradient.
    assert np.abs(grad[unused]).sum() > 0


# --- bad input ----------------------------------------------------------------------------------


def test_bad_inputs_get_clear_errors():
    model = tiny_model()
    with pytest.raises(ValueError, match=r"GPT\(.*token ids must lie in \[0, vocab_size = 11\)"):
        model(np.array([[1, 11]]))
    with pytest.raises(ValueError, match="got ids from -1"):
        model(np.array([[-1, 2]]))
    with pytest.raises(ValueError, match="sequence length 9 exceeds block_size 8"):
        model(np.zeros((1, 9), dtype=np.int64))
    with pytest.raises(TypeError, match="integer token ids, got dtype float"):
        model(np.zeros((1, 3)))
    with pytest.raises(ValueError, match=r"shape \(batch, time\)"):
        model(np.zeros(3, dtype=np.int64))
    with pytest.raises(ValueError, match="targets must be integer ids shaped like idx"):
        model(np.zeros((1, 3), dtype=np.int64), np.zeros((1, 2), dtype=np.int64))
    with pytest.raises(ValueError, match="targets must lie in"):
        model(np.zeros((1, 2), dtype=np.int64), np.array([[0, 11]]))


# --- checkpoints: Hugging Face layout -----------------------------------------------------------


def reference_gpt2_logits(w, idx, n_head):
    """GPT-2's forward written from its definition, on HF-named arrays (an independent check of
    the layout: fused c_attn columns [q | k | v], heads split as (B, T, H, D))."""

    def ln(x, p):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + 1e-5) * w[p + ".weight"] + w[p + ".bias"]

    def gelu(x):
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))

    B, T = idx.shape
    x = w["wte.weight"][idx] + w["wpe.weight"][:T]
    C = x.shape[-1]
    D = C // n_head
    n_layer = len({k.split(".")[1] for k in w if k.startswith("h.")})
    for i in range(n_layer):
        p = f"h.{i}."
        qkv = ln(x, p + "ln_1") @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]
        q, k, v = (
            qkv[..., j * C : (j + 1) * C].reshape(B, T, n_head, D).transpose(0, 2, 1, 3)
            for j in range(3)
        )
        s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(D)
        s = np.where(np.tril(np.ones((T, T), bool)), s, -np.inf)
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        y = (a @ v).transpose(0, 2, 1, 3).reshape(B, T, C)
        x = x + y @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
        h = gelu(ln(x, p + "ln_2") @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"])
        x = x + h @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
    return ln(x, "ln_f") @ w["wte.weight"].T


def write_hf_checkpoint(directory, with_prefix):
    """A GPT-2 style checkpoint with random weights, as the original upload lays it out."""
    rng = np.random.default_rng(7)
    c, n_layer, vocab, n_ctx = 8, 2, 11, 8
    shapes = {"wte.weight": (vocab, c), "wpe.weight": (n_ctx, c)}
    for i in range(n_layer):
        shapes.update(
            {
                f"h.{i}.ln_1.weight": (c,),
                f"h.{i}.ln_1.bias": (c,),
                f"h.{i}.attn.c_attn.weight": (c, 3 * c),
                f"h.{i}.attn.c_attn.bias": (3 * c,),
                f"h.{i}.attn.c_proj.weight": (c, c),
                f"h.{i}.attn.c_proj.bias": (c,),
                f"h.{i}.ln_2.weight": (c,),
                f"h.{i}.ln_2.bias": (c,),
                f"h.{i}.mlp.c_fc.weight": (c, 4 * c),
                f"h.{i}.mlp.c_fc.bias": (4 * c,),
                f"h.{i}.mlp.c_proj.weight": (4 * c, c),
                f"h.{i}.mlp.c_proj.bias": (c,),
            }
        )
    shapes.update({"ln_f.weight": (c,), "ln_f.bias": (c,)})
    weights = {k: rng.normal(0, 0.3, s).astype(np.float32) for k, s in shapes.items()}
    stored = {("transformer." + k if with_prefix else k): v for k, v in weights.items()}
    for i in range(n_layer):  # the causal-mask buffers old GPT-2 checkpoints carry
        pre = "transformer." if with_prefix else ""
        stored[f"{pre}h.{i}.attn.bias"] = np.tril(np.ones((1, 1, n_ctx, n_ctx), np.float32))
        stored[f"{pre}h.{i}.attn.masked_bias"] = np.array(-1e4, np.float32)
    nn.save_safetensors(directory / "model.safetensors", stored, metadata={"format": "pt"})
    config = {
        "model_type": "gpt2",
        "vocab_size": vocab,
        "n_ctx": n_ctx,
        "n_embd": c,
        "n_layer": n_layer,
        "n_head": 2,
        "layer_norm_epsilon": 1e-5,
        "activation_function": "gelu_new",
    }
    (directory / "config.json").write_text(json.dumps(config))
    return weights


@pytest.mark.parametrize("with_prefix", [False, True])
def test_from_pretrained_loads_hf_checkpoint_as_is(tmp_path, with_prefix, float64):
    weights = write_hf_checkpoint(tmp_path, with_prefix)
    for path in (tmp_path, tmp_path / "model.safetensors"):
        model = GPT.from_pretrained(path)
        assert model.config == GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=8)
        state = model.state_dict()
        assert sorted(state) == sorted("transformer." + k for k in weights)
        for k, v in weights.items():
            np.testing.assert_array_equal(state["transformer." + k], v)
    idx = np.random.default_rng(0).integers(0, 11, (2, 8))
    logits, _ = model(idx, idx)
    w64 = {k: v.astype(np.float64) for k, v in weights.items()}
    np.testing.assert_allclose(
        logits.data, reference_gpt2_logits(w64, idx, 2), rtol=1e-10, atol=1e-10
    )


def test_save_pretrained_round_trip(tmp_path):
    model = tiny_model(seed=5, scale=0.2, bias=False)
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["n_positions"] == 8
    loaded = GPT.from_pretrained(tmp_path)
    assert loaded.config == model.config
    idx = np.array([[1, 2, 3, 4]])
    np.testing.assert_array_equal(loaded(idx)[0].data, model(idx)[0].data)


def test_from_pretrained_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        GPT.from_pretrained(tmp_path)
    write_hf_checkpoint(tmp_path, with_prefix=False)
    config = json.loads((tmp_path / "config.json").read_text())
    del config["n_ctx"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="n_positions or n_ctx"):
        GPT.from_pretrained(tmp_path)
