"""The encoder-decoder (notes 8.7): tasks and the held-out split, an end-to-end float64 gradcheck,
cached greedy decoding == uncached, the notes' who-reads-whom claims, errors, and the CLI."""

import re

import numpy as np
import pytest

import autograd
from autograd import Tensor
from models import seq2seq
from models.architectures.gpt import IGNORE_INDEX
from models.architectures.seq2seq import BOS, EOS, PAD, Seq2Seq, Seq2SeqConfig, decode, encode
from models.training.tasks.digits import TASKS, held_out_set, is_held_out, sample_pairs, to_arrays
from tests.test_nn_layers import randomize


def tiny(pre_ln=True, positions="learned", n_embd=4, seed=0, scale=0.5):
    config = Seq2SeqConfig(
        max_src_len=7, max_tgt_len=6, n_layer=1, n_head=2, n_embd=n_embd, pre_ln=pre_ln,
        positions=positions,
    )  # fmt: skip
    return randomize(Seq2Seq(config), seed=seed, scale=scale)


PAIRS = [("31+402", "433"), ("7+5", "12"), ("0+0", "0")]


def test_tasks_vocabulary_and_padding():
    assert TASKS["reverse"].target("0123") == "3210"
    assert TASKS["sort"].target("3130") == "0133"
    assert TASKS["add"].target("95+7") == "102"
    assert decode(encode("12+9") + [EOS, 4]) == "12+9"
    src, tgt_in, tgt_out = to_arrays(PAIRS[:2])
    np.testing.assert_array_equal(src[1], encode("7+5") + [PAD] * 3)
    np.testing.assert_array_equal(tgt_in[1], [BOS, *encode("12"), PAD])
    np.testing.assert_array_equal(tgt_out[1], [*encode("12"), EOS, IGNORE_INDEX])
    rng = np.random.default_rng(0)
    for name, task in TASKS.items():
        for _ in range(50):
            source = task.source(rng, task.min_len, task.max_len)
            longest_src, longest_tgt = task.max_lengths(task.max_len)
            assert len(source) <= longest_src and len(task.target(source)) <= longest_tgt, name
    sources = [TASKS["add"].source(rng, 1, 3) for _ in range(200)]
    assert all(re.fullmatch(r"(0|[1-9]\d{0,2})\+(0|[1-9]\d{0,2})", s) for s in sources)


def test_held_out_sources_are_never_trained_on():
    task = TASKS["reverse"]
    held = held_out_set(task, 300, 2, 10, seed=0)
    assert len(held) == 300 and len({s for s, _ in held}) == 300
    assert all(is_held_out(s) and t == s[::-1] for s, t in held)
    trained = set()
    for step in range(20):  # the CLI's batches: a function of (seed, step)
        rng = np.random.default_rng([0, 0, step])
        trained |= {s for s, _ in sample_pairs(task, rng, 64, 2, 10, held_out=False)}
    assert not trained & {s for s, _ in held}
    assert not any(is_held_out(s) for s in trained)
    # The split is a hash of the text: about 1 in 10 sources, the same on every run and seed.
    every_3_digit = [f"{i:03d}" for i in range(1000)]
    assert 70 < sum(map(is_held_out, every_3_digit)) < 130
    # Lengths with few held-out sources give fewer (all distinct) rather than loop forever.
    assert len(held_out_set(task, 50, 1, 1, seed=0)) < 10


def test_gradcheck_end_to_end(float64):
    model = tiny()
    src, tgt_in, _ = to_arrays(PAIRS)  # with source and target padding
    autograd.gradcheck(lambda *ps: model(src, tgt_in)[0], list(model.parameters()))


def test_post_ln_sinusoidal_gradient_along_a_random_direction(float64):
    # The other variant, checked along one random direction d of all the parameters at once:
    # grad . d == (L(p + eps d) - L(p - eps d)) / (2 eps), two forwards instead of two per element.
    model = tiny(pre_ln=False, positions="sinusoidal")
    src, tgt_in, tgt_out = to_arrays(PAIRS)
    params = list(model.parameters())
    _, loss = model(src, tgt_in, tgt_out)
    loss.backward()
    rng = np.random.default_rng(0)
    direction = [rng.standard_normal(p.shape) for p in params]
    analytic = sum(float((p.grad * d).sum()) for p, d in zip(params, direction, strict=True))

    def loss_at(eps):
        with autograd.no_grad():
            for p, d in zip(params, direction, strict=True):
                p.data = p.data + eps * d
            value = model(src, tgt_in, tgt_out)[1].item()
            for p, d in zip(params, direction, strict=True):
                p.data = p.data - eps * d
        return value

    numeric = (loss_at(1e-6) - loss_at(-1e-6)) / 2e-6
    assert analytic == pytest.approx(numeric, rel=1e-6, abs=1e-9)


@pytest.mark.parametrize("pre_ln", [True, False])
def test_greedy_with_cache_equals_without(pre_ln):
    # A briefly trained model, so that greedy outputs differ between rows and positions.
    config = Seq2SeqConfig(max_src_len=10, max_tgt_len=11, n_layer=1, n_embd=16, pre_ln=pre_ln)
    model = seq2seq.train(TASKS["reverse"], 40, 32, config, 2, 10, 1e-2, 10, seed=0, quiet=True)
    pairs = held_out_set(TASKS["reverse"], 16, 2, 10, seed=0)
    src, _, _ = to_arrays(pairs)
    cached = model.generate(src, 11)
    np.testing.assert_array_equal(cached, model.generate(src, 11, use_cache=False))
    assert cached.shape[1] > 2 and len({tuple(row) for row in cached}) > 8


def test_cached_decoding_logits_equal_full_decoding(float64):
    model = tiny(n_embd=8, seed=1)
    src, tgt_in, _ = to_arrays(PAIRS)
    with autograd.no_grad():
        full, _ = model(src, tgt_in)
        memory, key_mask = model.encode(src)
        kvs = [block.cross_attn.memory_kv(memory) for block in model.decoder]
        caches = model.new_kv_caches(len(src))
        steps = [
            model.decode(tgt_in[:, i : i + 1], None, key_mask, caches, kvs).data
            for i in range(tgt_in.shape[1])
        ]
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full.data, rtol=0, atol=1e-12)


def test_a_source_token_reaches_every_decoder_position(float64):
    # notes 8.7: the encoder reads the source both ways, and every target position reads it all.
    model = tiny(n_embd=8, seed=2)
    src, tgt_in, _ = to_arrays(PAIRS[:1])
    changed = src.copy()
    changed[0, -1] = encode("9")[0]  # the last source token: "31+402" -> "31+409"
    memory, _ = model.encode(src)
    memory_changed, _ = model.encode(changed)
    diff = np.abs(memory.data - memory_changed.data).max(axis=-1)[0]
    assert (diff > 1e-6).all()  # every source position, the first one included
    logits, _ = model(src, tgt_in)
    logits_changed, _ = model(changed, tgt_in)
    assert (np.abs(logits.data - logits_changed.data).max(axis=-1)[0] > 1e-6).all()


def test_a_later_target_token_never_changes_earlier_outputs(float64):
    model = tiny(n_embd=8, seed=2)
    src, tgt_in, _ = to_arrays(PAIRS[:1])
    changed = tgt_in.copy()
    changed[0, 2] = encode("7")[0]
    logits, _ = model(src, tgt_in)
    logits_changed, _ = model(src, changed)
    np.testing.assert_array_equal(logits.data[:, :2], logits_changed.data[:, :2])  # causal
    assert not np.allclose(logits.data[:, 2:], logits_changed.data[:, 2:])


def test_errors_name_the_model_and_the_shapes():
    model = tiny()
    with pytest.raises(ValueError, match=r"Seq2Seq\(.*\): src has 8 positions, more than the 7"):
        model.encode(np.zeros((1, 8), dtype=np.int64))
    with pytest.raises(
        ValueError, match=r"src must be integer ids \(batch, time >= 1\), got dtype"
    ):
        model.generate(np.zeros((2, 3)), 3)
    with pytest.raises(ValueError, match=r"max_new_tokens must be in \[0, 6\]"):
        model.generate(np.ones((1, 3), dtype=np.int64), 9)
    with pytest.raises(ValueError, match="n_embd 10 must be divisible by n_head 4"):
        Seq2SeqConfig(max_src_len=4, max_tgt_len=4, n_embd=10)
    with pytest.raises(ValueError, match="positions must be 'learned' or 'sinusoidal'"):
        Seq2SeqConfig(max_src_len=4, max_tgt_len=4, positions="none")
    with pytest.raises(ValueError, match="max_src_len must be a positive integer"):
        Seq2SeqConfig(max_src_len=0, max_tgt_len=4)
    with pytest.raises(ValueError, match=r"CrossAttention: memory must be \(B, T, n_embd=4\)"):
        model.decode(np.ones((1, 2), dtype=np.int64), Tensor(np.zeros((1, 3, 5))), None)


@pytest.mark.parametrize("task", sorted(TASKS))
def test_cli_smoke(task, capsys):
    argv = ["--task", task, "--steps", "3", "--batch-size", "8", "--n-layer", "1", "--n-embd"]
    assert seq2seq.main([*argv, "16", "--eval-size", "20", "--quiet"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert re.fullmatch(r"exact-match accuracy: [01]\.\d{4} on 20 held-out sequences", last)


def test_cli_progress_bar_and_bad_lengths(capsys):
    seq2seq.main(["--steps", "2", "--batch-size", "4", "--n-embd", "8", "--eval-size", "5"])
    assert "2/2" in capsys.readouterr().err  # tqdm writes to stderr
    with pytest.raises(SystemExit, match="need 1 <= --min-len <= --max-len"):
        seq2seq.main(["--min-len", "5", "--max-len", "3"])
