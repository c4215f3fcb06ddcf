"""Generation: greedy/sampling rules, top-k/top-p, EOS, cropping, and the KV cache (notes 12)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

import autograd
import autograd.functional as F
from models.architectures.gpt import GPT, GPTConfig, choose_next_token, next_token_probs

VOCAB, BLOCK = 13, 12


def model_for(dtype, seed=0, n_layer=2):
    autograd.set_default_dtype(dtype)
    model = GPT(GPTConfig(VOCAB, BLOCK, n_layer, 2, 16), rng=np.random.default_rng(seed))
    rng = np.random.default_rng(seed + 1)
    with autograd.no_grad():  # larger weights than the 0.02 init, so tokens are not near-ties
        for name, p in model.named_parameters():
            if not name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
                p.data = rng.normal(0, 0.5, p.shape).astype(p.dtype)
    return model


def prompt(batch=2, length=3, seed=0):
    return np.random.default_rng(seed).integers(0, VOCAB, (batch, length))


# --- the KV cache -------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_greedy_with_cache_equals_without_token_for_token(dtype):
    model = model_for(dtype)
    # 3 prompt tokens + 25 new ones: past block_size (12), so the window slides too.
    with_cache = model.generate(prompt(), 25, temperature=0, use_cache=True)
    without = model.generate(prompt(), 25, temperature=0, use_cache=False)
    assert with_cache.shape == (2, 28)
    np.testing.assert_array_equal(with_cache, without)
    np.testing.assert_array_equal(with_cache[:, :3], prompt())


def test_cached_logits_match_full_forward(float64):
    model = model_for(np.float64)
    idx = prompt(batch=2, length=9)
    full, _ = model(idx, idx)
    caches = model.new_kv_caches(2)
    with autograd.no_grad():
        model(idx[:, :4], kv_caches=caches)
        for t in range(4, 9):
            step, _ = model(idx[:, t : t + 1], kv_caches=caches)
            np.testing.assert_allclose(step.data[:, 0], full.data[:, t], rtol=1e-10, atol=1e-12)
    assert caches[0].length == 9


def test_sampling_with_cache_equals_without_for_the_same_rng():
    model = model_for(np.float64)
    kwargs = dict(temperature=0.8, top_k=5, top_p=0.9)
    a = model.generate(prompt(), 15, use_cache=True, rng=np.random.default_rng(3), **kwargs)
    b = model.generate(prompt(), 15, use_cache=False, rng=np.random.default_rng(3), **kwargs)
    np.testing.assert_array_equal(a, b)


def test_cached_decoding_does_linear_work_per_token(monkeypatch):
    """After the prompt, every layer projects one position per step and attends one query over
    the cached keys: the work of a step grows like T (the attention row), not T^2."""
    model = model_for(np.float32, n_layer=3)
    attention_shapes, linear_rows = [], []
    attention_forward, linear_forward = F.Attention.forward, F.Linear.forward

    def record_attention(self, q, k, v, causal=True):
        attention_shapes.append((q.shape[2], k.shape[2]))
        return attention_forward(self, q, k, v, causal=causal)

    def record_linear(self, x, weight, bias=None):
        linear_rows.append(int(np.prod(x.shape[:-1])))
        return linear_forward(self, x, weight, bias)

    monkeypatch.setattr(F.Attention, "forward", record_attention)
    monkeypatch.setattr(F.Linear, "forward", record_linear)
    batch, start, new = 2, 4, BLOCK - 4
    model.generate(prompt(batch, start), new, temperature=0, use_cache=True)

    n_layer = 3
    assert len(attention_shapes) == n_layer * new
    prefill = attention_shapes[:n_layer]
    assert prefill == [(start, start)] * n_layer
    for step in range(1, new):
        shapes = attention_shapes[step * n_layer : (step + 1) * n_layer]
        assert shapes == [(1, start + step)] * n_layer  # one query row over the cached keys
    # Every step runs the same projections; after the prompt each sees one position per sequence.
    per_step = len(linear_rows) // new
    assert len(linear_rows) == per_step * new and per_step >= n_layer * 3
    assert set(linear_rows[:per_step]) <= {batch * start, batch}  # the head: last position only
    assert set(linear_rows[per_step:]) == {batch}

    attention_shapes.clear()
    model.generate(prompt(batch, start), new, temperature=0, use_cache=False)
    assert attention_shapes[-1] == (BLOCK - 1, BLOCK - 1)  # without the cache: the whole prefix


# --- choosing a token (notes 12.2) --------------------------------------------------------------


# Logits at least 0.1 apart: the kept sets of top-k / top-p are then unambiguous (no ties).
logit_rows = arrays(
    np.int64,
    st.tuples(st.integers(1, 3), st.integers(2, 12)),
    elements=st.integers(-50, 50),
    unique=True,
).map(lambda a: a / 10.0)


@settings(deadline=None)
@given(logits=logit_rows, k=st.integers(1, 12))
def test_top_k_keeps_the_k_largest_and_renormalises(logits, k):
    probs = next_token_probs(logits, temperature=1.0, top_k=k)
    full = next_token_probs(logits)
    kept = probs > 0
    assert (kept.sum(-1) == min(k, logits.shape[-1])).all()
    for row in range(len(logits)):
        threshold = np.sort(logits[row])[::-1][min(k, logits.shape[-1]) - 1]
        np.testing.assert_array_equal(kept[row], logits[row] >= threshold)
        np.testing.assert_allclose(
            probs[row][kept[row]], full[row][kept[row]] / full[row][kept[row]].sum()
        )
    np.testing.assert_allclose(probs.sum(-1), 1.0)


@settings(deadline=None)
@given(logits=logit_rows, p=st.floats(0.01, 1.0))
def test_top_p_keeps_the_smallest_set_reaching_p(logits, p):
    full = next_token_probs(logits)
    probs = next_token_probs(logits, top_p=p)
    for row in range(len(logits)):
        order = np.argsort(-full[row])
        mass_before = np.cumsum(full[row][order]) - full[row][order]
        expected = order[mass_before < p]  # add tokens, most probable first, until mass >= p
        assert set(np.flatnonzero(probs[row])) == set(expected.tolist())
        kept = probs[row] > 0
        np.testing.assert_allclose(probs[row][kept], full[row][kept] / full[row][kept].sum())
        assert full[row][kept].sum() >= min(p, 1.0) - 1e-12


def test_temperature_sharpens_and_flattens():
    logits = np.array([[2.0, 1.0, 0.0]])
    cold, base, hot = (next_token_probs(logits, t)[0, 0] for t in (0.5, 1.0, 2.0))
    assert cold > base > hot > 1 / 3


def test_sampling_follows_the_distribution_and_never_picks_a_cut_token():
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]]))
    rng = np.random.default_rng(0)
    draws = np.array([choose_next_token(logits, 1.0, 3, None, rng)[0] for _ in range(4000)])
    assert 3 not in draws
    freq = np.bincount(draws, minlength=4) / len(draws)
    np.testing.assert_allclose(freq[:3], np.array([0.5, 0.3, 0.15]) / 0.95, atol=0.03)
    assert (choose_next_token(logits, 0.0, None, None, rng) == 0).all()


def test_sampling_is_reproducible_with_a_seeded_rng():
    model = model_for(np.float32)
    a = model.generate(prompt(), 10, rng=np.random.default_rng(11))
    b = model.generate(prompt(), 10, rng=np.random.default_rng(11))
    np.testing.assert_array_equal(a, b)
    top1 = model.generate(prompt(), 10, top_k=1, rng=np.random.default_rng(5))
    np.testing.assert_array_equal(top1, model.generate(prompt(), 10, temperature=0))


# --- stopping and cropping (notes 12.5) ---------------------------------------------------------


def test_stops_at_eos_and_pads_finished_rows():
    model = model_for(np.float64)
    greedy = model.generate(prompt(), 8, temperature=0)
    eos = int(greedy[0, 5])  # the third new token of row 0
    out = model.generate(prompt(), 8, temperature=0, eos_id=eos)
    row0_stop = 3 + int(np.flatnonzero(greedy[0, 3:] == eos)[0])
    hits1 = np.flatnonzero(greedy[1, 3:] == eos)
    row1_stop = 3 + (int(hits1[0]) if hits1.size else 7)
    assert out.shape[1] == max(row0_stop, row1_stop) + 1  # stops once every row has ended
    for row, stop in ((0, row0_stop), (1, row1_stop)):
        np.testing.assert_array_equal(out[row, : stop + 1], greedy[row, : stop + 1])
        assert (out[row, stop + 1 :] == eos).all()


def test_long_prompt_is_cropped_to_block_size():
    model = model_for(np.float64)
    long_prompt = prompt(batch=1, length=BLOCK + 7, seed=4)
    out = model.generate(long_prompt, 5, temperature=0)
    cropped = model.generate(long_prompt[:, -BLOCK:], 5, temperature=0, use_cache=False)
    np.testing.assert_array_equal(out[:, : BLOCK + 7], long_prompt)
    np.testing.assert_array_equal(out[:, BLOCK + 7 :], cropped[:, BLOCK:])


def test_generate_restores_training_mode_and_records_no_graph():
    model = model_for(np.float32)
    model.train()
    out = model.generate(prompt(), 3)
    assert model.training and out.dtype == np.int64
    assert all(p.grad is None for p in model.parameters())
    assert model.generate(prompt(), 0).shape == (2, 3)


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(temperature=-1.0), ValueError, "temperature must be >= 0"),
        (dict(top_k=0), ValueError, "top_k must be a positive int"),
        (dict(top_p=0.0), ValueError, "top_p must be in"),
        (dict(top_p=1.5), ValueError, "top_p must be in"),
        (dict(eos_id=VOCAB), ValueError, "eos_id 13 is not a token id"),
        (dict(max_new_tokens=-1), ValueError, "max_new_tokens must be >= 0"),
        (dict(max_new_tokens=2.0), TypeError, "max_new_tokens must be an int"),
    ],
)
def test_bad_generate_arguments(kwargs, error, message):
    model = model_for(np.float32)
    kwargs = {"max_new_tokens": 3, **kwargs}
    with pytest.raises(error, match=message):
        model.generate(prompt(), **kwargs)
