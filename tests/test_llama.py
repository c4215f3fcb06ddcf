"""The Llama family as a setting of the one decoder: against a numpy transcription of Hugging
Face's LlamaForCausalLM (repeat_kv, rotate_half, RMSNorm, SwiGLU), float64 gradients, the KV cache
of the K/V heads, HF directories (BF16, shards, both RoPE spellings, errors), generation, chat."""

import json

import numpy as np
import pytest

import autograd
import models
import nn
from models.architectures.llama import Llama, llama_config
from models.chat import Chat, run
from models.formats.tokenizer import CharTokenizer

LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}


def tiny(**change):
    sizes = dict(vocab_size=13, block_size=24, n_layer=2, n_head=4, n_kv_head=2, n_embd=16)
    qwen2 = dict(ffn_hidden=20, qkv_bias=True, norm_eps=1e-6, rope_theta=500.0, model_type="qwen2")
    return llama_config(**{**sizes, **qwen2, "eos_token_ids": [3, 7], **change})


def llama(seed=0, scale=0.3, **change):
    model = Llama(tiny(**change))
    rng = np.random.default_rng(seed)
    with autograd.no_grad():
        for p in model.parameters():
            p.data = rng.normal(0.0, scale, size=p.shape).astype(p.dtype)
    return model


# --- a numpy transcription of transformers' modeling_llama (torch's (out, in) weights) ---------


def hf_weights(model):
    """The model's tensors as a Hugging Face file holds them."""
    return {k: np.asarray(v, dtype=np.float64) for k, v in model.hf_tensors().items()}


def reference_logits(w, c, idx):
    def linear(x, name):
        y = x @ w[name + ".weight"].T  # torch: y = x W^T + b, W (out, in)
        return y + w[name + ".bias"] if name + ".bias" in w else y

    def rms_norm(x, name):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + c.norm_eps) * w[name + ".weight"]

    def rotate_half(x):
        half = x.shape[-1] // 2
        return np.concatenate([-x[..., half:], x[..., :half]], axis=-1)

    D, H, Hkv = c.head_dim, c.n_head, c.n_kv_head
    inv_freq = 1.0 / c.rope_theta ** (np.arange(0, D, 2) / D)
    if c.rope_scaling:  # _compute_llama3_parameters, transcribed
        s = c.rope_scaling
        old, low, high = (
            s["original_max_position_embeddings"],
            s["low_freq_factor"],
            s["high_freq_factor"],
        )
        wavelen = 2 * np.pi / inv_freq
        scaled = np.where(wavelen > old / low, inv_freq / s["factor"], inv_freq)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / s["factor"] + smooth * scaled
        medium = ~(wavelen < old / high) & ~(wavelen > old / low)
        inv_freq = np.where(medium, smoothed, scaled)
    B, T = idx.shape
    freqs = np.arange(T)[:, None] * inv_freq[None, :]
    emb = np.concatenate([freqs, freqs], axis=-1)
    cos, sin = np.cos(emb), np.sin(emb)
    x = w["model.embed_tokens.weight"][idx]
    for i in range(c.n_layer):
        p = f"model.layers.{i}."
        h = rms_norm(x, p + "input_layernorm")
        q = linear(h, p + "self_attn.q_proj").reshape(B, T, H, D).transpose(0, 2, 1, 3)
        k = linear(h, p + "self_attn.k_proj").reshape(B, T, Hkv, D).transpose(0, 2, 1, 3)
        v = linear(h, p + "self_attn.v_proj").reshape(B, T, Hkv, D).transpose(0, 2, 1, 3)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = np.repeat(k, H // Hkv, axis=1), np.repeat(v, H // Hkv, axis=1)  # repeat_kv
        scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(D)
        scores = np.where(np.tril(np.ones((T, T), bool)), scores, -np.inf)
        a = np.exp(scores - scores.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        y = (a @ v).transpose(0, 2, 1, 3).reshape(B, T, H * D)
        x = x + linear(y, p + "self_attn.o_proj")
        h = rms_norm(x, p + "post_attention_layernorm")
        gate = linear(h, p + "mlp.gate_proj")
        x = x + linear(
            gate / (1 + np.exp(-gate)) * linear(h, p + "mlp.up_proj"), p + "mlp.down_proj"
        )
    x = rms_norm(x, "model.norm")
    head = w["model.embed_tokens.weight"] if c.tie_word_embeddings else w["lm_head.weight"]
    return x @ head.T


@pytest.mark.parametrize(
    "change",
    [
        {},  # Qwen2: GQA, q/k/v biases, untied
        dict(n_kv_head=1, qkv_bias=False, tie_word_embeddings=True, model_type="llama"),  # MQA
        dict(n_kv_head=4, rope_scaling=LLAMA3, model_type="llama", qkv_bias=False),  # llama3
        dict(head_dim=6, model_type="mistral", qkv_bias=False),  # H * D != C
    ],
)
def test_logits_match_the_hf_transcription(float64, change):
    model = llama(**change)
    idx = np.random.default_rng(1).integers(0, 13, (2, 20))
    logits, _ = model(idx, all_logits=True)
    expected = reference_logits(hf_weights(model), model.config, idx)
    np.testing.assert_allclose(logits.data, expected, rtol=0, atol=1e-12)


def test_every_gradient_by_central_differences(float64):
    model = llama(scale=0.4, n_layer=1, n_embd=8, ffn_hidden=6, vocab_size=7, eos_token_ids=[])
    idx = np.random.default_rng(2).integers(0, 7, (2, 5))
    targets = np.random.default_rng(3).integers(0, 7, (2, 5))
    targets[0, 1] = -100
    params = list(model.parameters())
    autograd.gradcheck(lambda *ps: model(idx, targets)[1], params)


def test_llama3_frequencies_follow_the_three_bands():
    cos, sin = autograd.functional.rotary_tables(2, 16, 10000.0, LLAMA3)
    inv = np.arctan2(sin[1], cos[1])  # position 1: the angle is the frequency itself
    plain = 10000.0 ** (-np.arange(0, 16, 2) / 16)
    wavelen = 2 * np.pi / plain
    high, low = wavelen < 16 / 4, wavelen > 16 / 1
    np.testing.assert_allclose(inv[high], plain[high], rtol=1e-12)  # short waves unchanged
    np.testing.assert_allclose(inv[low], plain[low] / 8, rtol=1e-12)  # long waves 8x slower
    mid = ~high & ~low
    assert mid.any() and np.all((inv[mid] < plain[mid]) & (inv[mid] > plain[mid] / 8))
    with pytest.raises(ValueError, match="'yarn' is not supported"):
        autograd.functional.rotary_tables(2, 16, 10000.0, {"rope_type": "yarn"})


# --- the KV cache of the K/V heads ---------------------------------------------------------------


def test_cache_holds_kv_heads_and_chunks_equal_full(float64):
    model = llama()
    idx = np.random.default_rng(4).integers(0, 13, (2, 9))
    full, _ = model(idx, all_logits=True)
    caches = model.new_kv_caches(2, 16)
    assert caches[0].k.shape == (2, 2, 16, 4)  # (B, Hkv, max_len, D): never H copies
    pieces = []
    with autograd.no_grad():
        for a, b in ((0, 4), (4, 5), (5, 9)):  # a prompt, one token (grouped rows), a chunk
            pieces.append(model(idx[:, a:b], kv_caches=caches, all_logits=True)[0].data)
    np.testing.assert_allclose(np.concatenate(pieces, axis=1), full.data, rtol=0, atol=1e-12)


def test_greedy_equal_with_and_without_cache_and_stops_on_any_eos(float64):
    model = llama()
    prompt = np.random.default_rng(5).integers(0, 13, (3, 4))
    cached = model.generate(prompt, 12, temperature=0, eos_id=[])
    again = model.generate(prompt, 12, temperature=0, eos_id=[], use_cache=False)
    np.testing.assert_array_equal(cached, again)
    # with the model's eos ids (3 and 7) a row ends at the first of them, padded with it after
    ended = model.generate(prompt, 12, temperature=0)
    for row, free in zip(ended, cached, strict=True):
        new, free_new = row[4:], free[4:]
        stops = np.flatnonzero(np.isin(free_new, [3, 7]))
        if stops.size:
            first = stops[0]
            np.testing.assert_array_equal(new[: first + 1], free_new[: first + 1])
            assert (new[first:] == free_new[first]).all()
        else:
            np.testing.assert_array_equal(new, free_new)


# --- Hugging Face directories --------------------------------------------------------------------


def to_bf16_bits(a):
    """float32 -> bfloat16 bits, rounded to nearest even (as torch does)."""
    bits = np.asarray(a, np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def write_bf16(path, tensors):
    """A safetensors file of BF16 tensors, written by hand (numpy has no bfloat16)."""
    header, offset, blobs = {}, 0, []
    for name, a in tensors.items():
        blob = to_bf16_bits(a).tobytes()
        header[name] = {
            "dtype": "BF16",
            "shape": list(a.shape),
            "data_offsets": [offset, offset + len(blob)],
        }
        offset += len(blob)
        blobs.append(blob)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + b"".join(blobs))


def hf_directory(tmp_path, model, rope_spelling="top"):
    """model as Hugging Face writes it: config.json, BF16 weights in two shards + index."""
    config = model.hf_config()
    if rope_spelling == "parameters":  # transformers >= 5
        scaling = config.pop("rope_scaling") or {"rope_type": "default"}
        config["rope_parameters"] = {**scaling, "rope_theta": config.pop("rope_theta")}
    (tmp_path / "config.json").write_text(json.dumps(config))
    tensors = model.hf_tensors()
    names = list(tensors)
    shards = {
        "model-00001-of-00002.safetensors": names[:5],
        "model-00002-of-00002.safetensors": names[5:],
    }
    for file, part in shards.items():
        write_bf16(tmp_path / file, {n: tensors[n] for n in part})
    index = {"weight_map": {n: f for f, part in shards.items() for n in part}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    return tmp_path


@pytest.mark.parametrize("spelling", ["top", "parameters"])
def test_from_pretrained_reads_sharded_bf16_and_both_rope_spellings(tmp_path, spelling):
    model = llama(rope_scaling=LLAMA3, model_type="llama", qkv_bias=False)
    directory = hf_directory(tmp_path, model, spelling)
    loaded = models.from_pretrained(directory)
    params = dict(model.named_parameters())
    assert isinstance(loaded, Llama) and loaded.config == model.config
    for name, p in loaded.named_parameters():
        assert p.dtype == np.float32
        bf16 = (to_bf16_bits(params[name].data).astype(np.uint32) << 16).view(np.float32)
        np.testing.assert_array_equal(p.data, bf16, err_msg=name)
    assert (
        models.from_pretrained(directory, dtype=np.float64).transformer.wte.weight.dtype
        == np.float64
    )


def test_save_pretrained_writes_hf_layout_and_reloads(tmp_path, float64):
    model = llama()
    model.save_pretrained(tmp_path)
    stored, _ = nn.load_safetensors(tmp_path / "model.safetensors")
    q = "model.layers.0.self_attn.q_proj.weight"
    np.testing.assert_array_equal(
        stored[q], dict(model.named_parameters())[q].data.T
    )  # torch's (out, in)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "qwen2" and config["num_key_value_heads"] == 2
    loaded = models.from_pretrained(tmp_path, dtype=np.float64)
    idx = np.array([[1, 2, 3, 4, 5]])
    np.testing.assert_array_equal(loaded(idx)[0].data, model(idx)[0].data)


def test_bad_directories_name_the_file_and_field(tmp_path):
    model = llama()
    directory = hf_directory(tmp_path, model)
    config = json.loads((directory / "config.json").read_text())

    def with_config(**change):
        (directory / "config.json").write_text(json.dumps({**config, **change}))

    with_config(model_type="bert")
    with pytest.raises(models.FileFormatError, match=r"config.json: model_type: 'bert' is not"):
        models.from_pretrained(directory)
    with_config(hidden_size=None)
    with pytest.raises(models.FileFormatError, match=r"config.json: hidden_size: is missing"):
        models.from_pretrained(directory)
    with_config(intermediate_size=21)
    shape = r"00002-of-00002.safetensors: tensor 'model.layers.0.mlp.gate_proj.weight' has shape"
    with pytest.raises(ValueError, match=shape + r" \(20, 16\), the config gives \(21, 16\)"):
        models.from_pretrained(directory)
    with_config()
    (directory / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(models.FileFormatError, match=r"index.json: weight_map.*a shard that is"):
        models.from_pretrained(directory)
    header = json.dumps({"x": {"dtype": "F8_E4M3", "shape": [1], "data_offsets": [0, 1]}}).encode()
    (directory / "model-00002-of-00002.safetensors").write_bytes(
        len(header).to_bytes(8, "little") + header + b"\0"
    )
    with pytest.raises(
        models.FileFormatError, match=r"00002.safetensors: tensor 'x' has unsupported dtype 'F8_E4"
    ):
        models.from_pretrained(directory)


# --- sampling and chat ---------------------------------------------------------------------------


class TurnTokenizer(CharTokenizer):
    """Characters, and a chat template in the style of ChatML: <role>text| ... <a>."""

    def apply_chat_template(self, messages, add_generation_prompt=False):
        text = "".join(f"<{m['role'][0]}>{m['content']}|" for m in messages)
        return text + ("<a>" if add_generation_prompt else "")


CHARS = "<>|aus bcdef"  # 12 characters; ids 3 ('|') and 7 ('b') end a turn


@pytest.mark.parametrize("ends_on_eos", [False, True])
@pytest.mark.parametrize("compiled", [False, True])
def test_chat_reuses_the_cache_and_matches_generate(float64, ends_on_eos, compiled):
    tokenizer = TurnTokenizer(CHARS)
    model = llama(vocab_size=12, block_size=64, eos_token_ids=[])
    first = tokenizer.encode(
        tokenizer.apply_chat_template([{"role": "user", "content": "ab"}], True)
    )
    if ends_on_eos:  # the third token of the first reply ends the turn
        model.config.eos_token_ids = [int(model.generate(first[None], 3, temperature=0)[0, -1])]
    eos = model.config.eos_token_ids
    chat = Chat(model, tokenizer, context=64, max_new_tokens=6, temperature=0, compiled=compiled)
    run_lengths, stream = [], model.stream
    model.stream = lambda ids, *args, **kw: (
        run_lengths.append(len(ids)),
        stream(ids, *args, **kw),
    )[1]
    cached = 0
    for text in ("ab", "dd"):
        reply = "".join(chat.reply(text))
        rendered = tokenizer.encode(tokenizer.apply_chat_template(chat.messages[:-1], True))
        expected = model.generate(rendered[None], 6, temperature=0, eos_id=eos)[0, len(rendered) :]
        ended = np.isin(expected, eos)
        expected = expected[: np.argmax(ended)] if ended.any() else expected
        assert reply == tokenizer.decode(expected)
        assert chat.caches[0].length == len(chat.tokens)  # the cache holds what the chat says
        assert run_lengths[-1] == len(rendered) - cached  # a turn runs only its new tokens
        cached = len(chat.tokens)
    assert chat.tokens[: len(rendered)] == list(rendered)
    chat.reset()
    assert chat.caches[0].length == 0 and chat.messages == []


def test_mistral_sliding_window_caps_the_context():
    model = llama(model_type="mistral", qkv_bias=False)
    config = {**model.hf_config(), "sliding_window": 8}
    assert models.architectures.llama.config_from_hf(config, "config.json").block_size == 8
    assert (
        models.architectures.llama.config_from_hf(
            {**config, "sliding_window": None}, "c"
        ).block_size
        == 24
    )


def test_chat_loop_streams_resets_and_fits_the_context(float64):
    tokenizer = TurnTokenizer(CHARS)
    model = llama(vocab_size=12, block_size=64, eos_token_ids=[3])
    chat = Chat(model, tokenizer, context=16, max_new_tokens=4, temperature=0)
    lines = iter(["ab", "ab", "ab" * 10, "/reset", "a"])
    out = []

    class Out:
        def write(self, s):
            out.append(s)

        def flush(self):
            pass

    def reader(prompt):  # the typed lines, then end of input (Ctrl-D)
        try:
            return next(lines)
        except StopIteration:
            raise EOFError from None

    run(chat, reader, Out())
    text = "".join(out)
    # the second message leaves out the first exchange; the third cannot fit even alone
    assert text.count("(the oldest 1 exchange(s) left out to fit the context)") == 1
    assert "error: the context is full: the message is" in text
    assert "(conversation cleared)" in text
    assert chat.messages[-1]["role"] == "assistant" and chat.messages[0]["content"] == "a"


def test_sample_cli_runs_a_llama_directory(tmp_path, capsys):
    model = llama(vocab_size=12)
    model.save_pretrained(tmp_path)
    CharTokenizer(CHARS).save(tmp_path / "tokenizer.json")
    from models.sample import main

    assert (
        main(
            [
                "--ckpt",
                str(tmp_path),
                "--prompt",
                "ab",
                "--max-new-tokens",
                "5",
                "--temperature",
                "0",
            ]
        )
        == 0
    )
    assert capsys.readouterr().out.startswith("ab")


@pytest.mark.parametrize("tq", [1, 3])  # one row (a group's heads as rows) or repeated K/V
def test_grouped_attention_gradcheck_with_a_key_mask(float64, tq):
    rng = np.random.default_rng(6)
    q = autograd.Tensor(rng.normal(size=(2, 4, tq, 6)), requires_grad=True)
    k, v = (autograd.Tensor(rng.normal(size=(2, 2, 3, 6)), requires_grad=True) for _ in "kv")
    mask = np.array([[True, True, True], [False, True, True]])[:, None, None, :]
    autograd.gradcheck(lambda q, k, v: nn.grouped_attention(q, k, v, False, mask), [q, k, v])
    # against the plain path: each query head h given a copy of K/V head h // 2
    k2, v2 = (autograd.Tensor(np.repeat(t.data, 2, axis=1)) for t in (k, v))
    expected = autograd.functional.scaled_dot_product_attention(q, k2, v2, False, mask)
    grouped = nn.grouped_attention(q, k, v, False, mask)
    np.testing.assert_allclose(grouped.data, expected.data, rtol=0, atol=1e-12)


def test_a_checkpoint_lacking_a_weight_is_refused(tmp_path):
    # loading skips the random init (every weight is about to be read), so a gap is an error
    llama().save_pretrained(tmp_path)
    stored, _ = nn.load_safetensors(tmp_path / "model.safetensors")
    del stored["model.norm.weight"]
    nn.save_safetensors(tmp_path / "model.safetensors", stored)
    with pytest.raises(ValueError, match=r"the checkpoint lacks model.norm.weight"):
        models.from_pretrained(tmp_path)
