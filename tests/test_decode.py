"""The compiled decode step (models/architectures/decoding.py, docs/decoding.md) against eager
generation with the KV cache: the same logits bit for bit and the same tokens."""

from pathlib import Path

import numpy as np
import pytest

import autograd
import nn
from models.architectures.decoding import DecodeStep
from models.architectures.gpt import GPT, GPTConfig
from models.architectures.llama import Llama, llama_config

VOCAB, BLOCK = 29, 12

FAMILIES = {
    "gpt2": lambda: GPT(GPTConfig(VOCAB, BLOCK, 2, 2, 16)),
    "gpt2-untied-no-bias": lambda: GPT(
        GPTConfig(VOCAB, BLOCK, 2, 4, 16, bias=False, tie_word_embeddings=False)
    ),
    "llama-gqa-untied": lambda: Llama(
        llama_config(
            vocab_size=VOCAB,
            block_size=BLOCK,
            n_layer=2,
            n_head=4,
            n_kv_head=2,
            n_embd=32,
            ffn_hidden=40,
        )  # fmt: skip
    ),
    "llama-mqa-tied": lambda: Llama(
        llama_config(
            vocab_size=VOCAB,
            block_size=BLOCK,
            n_layer=3,
            n_head=3,
            n_kv_head=1,
            n_embd=18,
            ffn_hidden=20,
            tie_word_embeddings=True,
        )  # fmt: skip
    ),
    "qwen2-qkv-bias": lambda: Llama(
        llama_config(
            vocab_size=VOCAB,
            block_size=BLOCK,
            n_layer=2,
            n_head=4,
            n_kv_head=2,
            n_embd=24,
            ffn_hidden=30,
            qkv_bias=True,
            model_type="qwen2",
            rope_theta=1e6,
        )  # fmt: skip
    ),
    "llama3-scaled-rope-mha": lambda: Llama(
        llama_config(
            vocab_size=VOCAB,
            block_size=BLOCK,
            n_layer=2,
            n_head=2,
            n_embd=16,
            ffn_hidden=24,
            rope_scaling=dict(
                rope_type="llama3",
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=8,
            ),
        )  # fmt: skip
    ),
}


def model_for(family, dtype, seed=1):
    """A model with weights larger than the init's, so that greedy tokens are not near-ties."""
    autograd.set_default_dtype(dtype)
    model = FAMILIES[family]()
    rng = np.random.default_rng(seed)
    with autograd.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name and "ln_" not in name:
                p.data = rng.normal(0, 0.5, p.shape).astype(p.dtype)
            else:
                p.data = rng.uniform(0.5, 1.5, p.shape).astype(p.dtype)
    return model


def prompt(batch=2, length=3, seed=0):
    return np.random.default_rng(seed).integers(0, VOCAB, (batch, length))


def eager_and_compiled_logits(model, ids, steps, exact=True):
    """Each step's logits (B, V): eager's cached forward and the compiled step, fed the same
    (eager's greedy) tokens after the same eager prefill."""
    eager_caches, compiled_caches = (model.new_kv_caches(ids.shape[0]) for _ in range(2))
    model.eval()
    with autograd.no_grad():
        first, _ = model(ids, kv_caches=eager_caches)
        model(ids, kv_caches=compiled_caches)
        step = model.compile_decoder(compiled_caches, exact)
        token = first.data[:, -1].argmax(axis=-1)
        eager, compiled = [], []
        for _ in range(steps):
            logits, _ = model(token[:, None], kv_caches=eager_caches)
            eager.append(logits.data[:, -1].copy())
            compiled.append(step(token).copy())
            token = eager[-1].argmax(axis=-1)
    check = np.testing.assert_array_equal if exact else np.testing.assert_allclose
    for mine, theirs in zip(compiled_caches, eager_caches, strict=True):
        assert mine.length == theirs.length
        check(mine.k[:, :, : mine.length], theirs.k[:, :, : mine.length])
        check(mine.v[:, :, : mine.length], theirs.v[:, :, : mine.length])
    return np.array(eager), np.array(compiled)


@pytest.mark.parametrize("family", FAMILIES)
def test_each_exact_step_s_logits_equal_eager_s_bit_for_bit_in_float64(family):
    model = model_for(family, np.float64)
    # 3 prompt tokens + 9 steps: the caches fill to block_size exactly
    eager, compiled = eager_and_compiled_logits(model, prompt(), BLOCK - 3)
    np.testing.assert_array_equal(compiled, eager)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("batch", [2, 1])  # one row: q, k, v are views of the one product
def test_the_fused_q_k_v_product_stays_within_rounding_of_eager(family, batch):
    model = model_for(family, np.float64)
    eager, compiled = eager_and_compiled_logits(model, prompt(batch), BLOCK - 3, exact=False)
    np.testing.assert_allclose(compiled, eager, rtol=1e-12, atol=1e-12)
    if family.startswith("gpt2") and batch > 1:  # c_attn is one product already: nothing is
        np.testing.assert_array_equal(compiled, eager)  # fused (one row: kernels.matvec's sums)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize(("batch", "length", "new"), [(2, 3, 9), (1, 1, 11), (1, 5, 20)])
@pytest.mark.parametrize("compiled", [True, "exact"])
def test_compiled_generate_gives_eager_s_tokens(family, dtype, batch, length, new, compiled):
    """Up to block_size exactly (3 + 9, 1 + 11), and past it (5 + 20: the window slides, the
    cache is refilled eagerly, then the compiled step goes on)."""
    model = model_for(family, dtype)
    ids = prompt(batch, length)
    eager = model.generate(ids, new, temperature=0, eos_id=[])
    tokens = model.generate(ids, new, temperature=0, eos_id=[], compiled=compiled)
    assert tokens.shape == (batch, length + new)
    np.testing.assert_array_equal(tokens, eager)
    assert len(set(eager[:, length:].ravel().tolist())) > 2  # not a constant run of one token


def test_sampling_and_eos_go_through_the_compiled_step_as_through_eager():
    model = model_for("llama-gqa-untied", np.float64)
    kwargs = dict(temperature=0.9, top_k=8, top_p=0.9, eos_id=[3, 5])
    eager = model.generate(prompt(), 9, rng=np.random.default_rng(7), **kwargs)
    compiled = model.generate(prompt(), 9, rng=np.random.default_rng(7), compiled=True, **kwargs)
    np.testing.assert_array_equal(compiled, eager)


class CountingLinear(nn.Module):
    """A Linear-like module that offers forward_into, as a quantized linear does."""

    def __init__(self, linear):
        super().__init__()
        self.linear, self.calls = linear, 0

    def forward(self, x):
        return self.linear(x)

    def forward_into(self, x, out):
        self.calls += 1
        np.matmul(x, self.linear.weight.data, out=out)
        if self.linear.bias is not None:
            np.add(out, self.linear.bias.data, out=out)


def test_a_module_s_forward_into_is_the_step_s_product():
    model = model_for("qwen2-qkv-bias", np.float64)
    reference = model.generate(prompt(), 6, temperature=0)
    for block in model.model.layers:
        block.self_attn.q_proj = CountingLinear(block.self_attn.q_proj)
    compiled = model.generate(prompt(), 6, temperature=0, compiled=True)
    np.testing.assert_array_equal(compiled, reference)
    # 3 prompt tokens + 6 new: the prompt runs eagerly, then 5 compiled steps
    assert [b.self_attn.q_proj.calls for b in model.model.layers] == [5, 5]


def test_lora_adapters_run_their_own_forward_in_the_step():
    model = model_for("gpt2", np.float64)
    nn.lora.apply_lora(model, nn.lora.attention_projections(model), rank=2)
    rng = np.random.default_rng(3)
    for _, adapter in nn.lora.lora_modules(model):  # a trained adapter: B no longer zero
        adapter.lora_B.data = rng.normal(0, 0.5, adapter.lora_B.shape)
    eager, compiled = eager_and_compiled_logits(model, prompt(), 6)
    np.testing.assert_array_equal(compiled, eager)


def test_the_step_refuses_a_full_cache_and_the_explicit_attention_path():
    model = model_for("gpt2", np.float64)
    caches = model.new_kv_caches(1, 4)
    with autograd.no_grad():
        model(prompt(1, 4), kv_caches=caches)
    with pytest.raises(ValueError, match="hold 4 positions, all used"):
        model.compile_decoder(caches)(np.array([1]))
    model.transformer.h[1].attn.score_scale = 0.5
    with pytest.raises(ValueError, match="score_scale"):
        DecodeStep(model, caches)
    with pytest.raises(ValueError, match="needs 2 caches"):
        DecodeStep(model, caches[:1])
    with pytest.raises(ValueError, match="compiled must be False, True, 'exact' or 'int8'"):
        model.generate(prompt(), 2, compiled="fast")
    with pytest.raises(ValueError, match="use_cache=True"):
        model.generate(prompt(), 2, compiled=True, use_cache=False)
    model.transformer.h = nn.ModuleList([nn.Linear(2, 2), model.transformer.h[1]])
    with pytest.raises(TypeError, match="no step for the block Linear"):
        model.generate(prompt(), 2, compiled=True)


def test_the_real_model_s_first_32_greedy_tokens_equal_eager_s():
    from models.formats.hub import packaged_smollm2

    path = packaged_smollm2()
    if path is None:
        pytest.skip("the packaged SmolLM2-135M GGUF file is not installed")
    import models

    autograd.set_default_dtype(np.float32)
    net = models.from_pretrained(path)
    ids = np.array([[1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28,
                     7018, 411, 407, 19712, 8182, 2, 198]])  # fmt: skip
    eager = net.generate(ids, 32, temperature=0, eos_id=[])
    for compiled in (True, "exact"):
        tokens = net.generate(ids, 32, temperature=0, eos_id=[], compiled=compiled)
        np.testing.assert_array_equal(tokens, eager)


def test_past_the_first_rotary_tables_the_step_reads_the_same_angles():
    """RotaryPositions makes tables for 256 positions first and grows them when eager reaches
    position 256; the step grows them to its capacity when it is built: each position's angles
    are the same either way (two models of the same weights, so that neither sees the other's
    tables)."""
    autograd.set_default_dtype(np.float64)
    config = dict(vocab_size=VOCAB, block_size=300, n_layer=1, n_head=2, n_embd=8, ffn_hidden=8)
    eager_model, compiled_model = (Llama(llama_config(**config)) for _ in range(2))
    ids = np.random.default_rng(0).integers(0, VOCAB, (1, 250))
    eager_caches, compiled_caches = eager_model.new_kv_caches(1), compiled_model.new_kv_caches(1)
    with autograd.no_grad():
        eager_model(ids, kv_caches=eager_caches)
        compiled_model(ids, kv_caches=compiled_caches)
        step = compiled_model.compile_decoder(compiled_caches, exact=True)
        assert eager_model.model.layers[0].self_attn.rotary.cos.shape[0] == 256
        for token in range(40):
            logits, _ = eager_model(np.array([[token % VOCAB]]), kv_caches=eager_caches)
            np.testing.assert_array_equal(step(np.array([token % VOCAB])), logits.data[:, -1])


@pytest.mark.parametrize("fixture", ["llama-Q4_K.gguf", "llama-Q5_K.gguf", "llama-Q6_K.gguf"])
@pytest.mark.parametrize("exact", [True, False])
def test_a_model_keeping_k_quant_blocks_steps_as_its_eager_forward(fixture, exact):
    """A GGUF file's Q4_K / Q5_K / Q6_K blocks kept (quantize="gguf"): the compiled step's
    logits are eager's bit for bit (float64), one row and two."""
    import models

    path = Path(__file__).resolve().parent / "fixtures" / "gguf" / fixture
    model = models.from_pretrained(path, dtype=np.float64, quantize="gguf")
    kept = {m.weight.format for m in model.modules() if isinstance(m, nn.QuantizedLinear)}
    assert fixture[6:10].lower() in kept
    vocab = model.config.vocab_size
    for batch in (1, 2):
        ids = np.random.default_rng(batch).integers(0, vocab, (batch, 5))
        eager, compiled = eager_and_compiled_logits(model, ids, 6, exact=exact)
        np.testing.assert_array_equal(compiled, eager)


def quantized_llama(fmt, dtype):
    """A tiny Llama with a tied head, every Linear and the embedding quantized to fmt."""
    autograd.set_default_dtype(dtype)
    model = Llama(
        llama_config(vocab_size=VOCAB, block_size=BLOCK, n_layer=2, n_head=4, n_kv_head=2,
                     n_embd=64, ffn_hidden=96, tie_word_embeddings=True),
        rng=np.random.default_rng(3),
    )  # fmt: skip
    nn.quantize_linears(model, fmt, tied_embedding=model.transformer.wte)
    return model


@pytest.mark.parametrize("fmt", ["q8_0", "q4_1", "q5_0", "q5_1"])
@pytest.mark.parametrize("exact", [True, False])
@pytest.mark.parametrize("batch", [2, 1])  # one row: gate and up are views of the one product
def test_a_quantized_model_s_step_equals_its_eager_forward(fmt, exact, batch):
    """QuantizedLinear's forward_into and the quantized table's lookup and tied head run the
    same kernels as eager: the logits are eager's bit for bit (float64), fused or exact."""
    model = quantized_llama(fmt, np.float64)
    assert isinstance(model.transformer.wte, nn.QuantizedEmbedding)
    eager, compiled = eager_and_compiled_logits(model, prompt(batch), BLOCK - 3, exact=exact)
    np.testing.assert_array_equal(compiled, eager)
    tokens = model.generate(prompt(), 6, temperature=0, eos_id=[])
    np.testing.assert_array_equal(
        model.generate(
            prompt(), 6, temperature=0, eos_id=[], compiled=True if not exact else "exact"
        ),
        tokens,
    )
