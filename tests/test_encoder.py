"""The encoder-only model (notes 8.7): end-to-end float64 gradcheck, both-ways reading, permutation
equivariance without positions (notes 8.6), the masking, errors, and the CLI."""

import re

import numpy as np
import pytest

import autograd
from models import encoder
from models.architectures.encoder import Encoder, EncoderConfig
from models.architectures.gpt import IGNORE_INDEX
from models.training.tasks.masked import mask_characters, masked_accuracy
from tests.test_nn_layers import randomize


def tiny(positions="learned", pre_ln=True, n_embd=4):
    config = EncoderConfig(
        vocab_size=6, block_size=5, n_layer=1, n_head=2, n_embd=n_embd, positions=positions,
        pre_ln=pre_ln,
    )  # fmt: skip
    return randomize(Encoder(config), scale=0.5)


IDS = np.array([[1, 5, 2, 2, 0], [3, 4, 0, 1, 5]])


def test_gradcheck_end_to_end(float64):
    model = tiny()
    key_mask = np.array([[True] * 5, [True, True, True, False, False]])
    autograd.gradcheck(lambda *ps: model(IDS, key_mask=key_mask)[0], list(model.parameters()))


def test_every_position_reads_both_ways(float64):
    model = tiny(n_embd=8)
    changed = IDS.copy()
    changed[:, -1] = 3  # the last token: a causal model's earlier outputs would not move
    before, after = model(IDS)[0].data, model(changed)[0].data
    assert (np.abs(before - after).max(axis=-1) > 1e-6).all()


@pytest.mark.parametrize("pre_ln", [True, False])
def test_without_positions_the_encoder_is_permutation_equivariant(float64, pre_ln):
    # notes 8.6: permuting the tokens only permutes the outputs; positions break that.
    perm = np.array([3, 0, 4, 1, 2])
    model = tiny("none", pre_ln, n_embd=8)
    logits = model(IDS)[0].data
    np.testing.assert_allclose(model(IDS[:, perm])[0].data, logits[:, perm], atol=1e-12)
    learned = tiny("learned", pre_ln, n_embd=8)
    assert not np.allclose(learned(IDS[:, perm])[0].data, learned(IDS)[0].data[:, perm])


def test_mask_characters():
    rng = np.random.default_rng(0)
    x = rng.integers(0, 50, size=(64, 64))
    inputs, targets = mask_characters(x, 50, rng)
    hidden = inputs == 50
    assert hidden.any(axis=1).all() and 0.13 < hidden.mean() < 0.18
    np.testing.assert_array_equal(targets[hidden], x[hidden])
    assert (targets[~hidden] == IGNORE_INDEX).all()
    np.testing.assert_array_equal(inputs[~hidden], x[~hidden])


def test_masked_prediction_loss_and_accuracy():
    model = tiny()
    inputs, targets = mask_characters(IDS, 5, np.random.default_rng(1), rate=0.5)
    logits, loss = model(inputs, targets)
    hidden = targets != IGNORE_INDEX
    assert loss.item() > 0 and logits.shape == (2, 5, 6)
    accuracy, n = masked_accuracy(model, [(inputs, targets)])
    assert n == hidden.sum() and accuracy == np.mean(logits.data.argmax(-1)[hidden] == IDS[hidden])


def test_errors():
    with pytest.raises(ValueError, match=r"Encoder\(.*\): idx must be integer ids \(batch, 1..5\)"):
        tiny()(np.zeros((2, 6), dtype=np.int64))
    with pytest.raises(ValueError, match="EncoderConfig: positions must be one of"):
        EncoderConfig(vocab_size=4, block_size=4, positions="rotary")
    with pytest.raises(ValueError, match=r"SelfAttention: key_mask must be a boolean \(B, Tk\)"):
        tiny()(IDS, key_mask=np.ones((2, 4), dtype=bool))


def test_cli_smoke(tmp_path, capsys):
    text = tmp_path / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 40, encoding="utf-8")
    argv = ["--data", str(text), "--steps", "3", "--batch-size", "4", "--block-size", "16"]
    assert encoder.main([*argv, "--n-layer", "1", "--n-embd", "16", "--eval-batches", "2"]) == 0
    captured = capsys.readouterr()
    assert "3/3" in captured.err  # the progress bar
    last = captured.out.strip().splitlines()[-1]
    pattern = r"masked-token accuracy: [01]\.\d{4} vs unigram baseline [01]\.\d{4} \(always ' '\)"
    assert re.fullmatch(pattern + r" on \d+ masked characters", last)
