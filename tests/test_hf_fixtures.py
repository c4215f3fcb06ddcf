"""The Hugging Face fixtures in tests/fixtures/hf hold together (made by make_fixtures.py there).

These tests read only the committed files: safetensors through nn.load_safetensors, the rest with
json and numpy. They check the layouts the loaders will meet (one file, or an index with shards;
BF16, F16 and F32 storage; a tied head stored once) and that each reference.npz is consistent
with its checkpoint: a gradient for every stored tensor with its shape, logits over the config's
vocabulary, the loss equal to HF's shifted cross-entropy of those logits, greedy tokens equal to
the argmax where the reference says so. The model-vs-reference tests live with the models.
"""

import json
import struct
from pathlib import Path

import numpy as np
import pytest

import nn

HF = Path(__file__).resolve().parent / "fixtures" / "hf"
# name -> (model_type, storage dtype, sharded, tied head)
CHECKPOINTS = {
    "llama": ("llama", "BF16", False, False),
    "qwen2": ("qwen2", "F32", False, True),
    "mistral": ("mistral", "F16", True, False),
    "gpt2": ("gpt2", "F32", False, True),
}


def header(path: Path) -> dict:
    """The JSON header of a safetensors file, read independently of nn.checkpoint."""
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + n])


def tensor_files(directory: Path) -> list[Path]:
    """model.safetensors, or the shards that model.safetensors.index.json names."""
    index = directory / "model.safetensors.index.json"
    if not index.is_file():
        return [directory / "model.safetensors"]
    weight_map = json.loads(index.read_text())["weight_map"]
    return [directory / name for name in sorted(set(weight_map.values()))]


def load_weights(directory: Path) -> dict[str, np.ndarray]:
    weights = {}
    for path in tensor_files(directory):
        arrays, _ = nn.load_safetensors(path)
        assert not set(arrays) & set(weights), f"{path} repeats tensors of another shard"
        weights.update(arrays)
    return weights


def config(name: str) -> dict:
    return json.loads((HF / name / "config.json").read_text())


@pytest.fixture(scope="module", params=sorted(CHECKPOINTS))
def checkpoint(request):
    name = request.param
    with np.load(HF / name / "reference.npz") as npz:
        reference = dict(npz)
    return name, load_weights(HF / name), reference


def test_layouts_are_hugging_faces(checkpoint):
    name, weights, _ = checkpoint
    model_type, storage, sharded, tied = CHECKPOINTS[name]
    cfg = config(name)
    assert cfg["model_type"] == model_type
    files = tensor_files(HF / name)
    assert (len(files) >= 2) == sharded
    if sharded:
        index = json.loads((HF / name / "model.safetensors.index.json").read_text())
        in_shards = {t: f.name for f in files for t in header(f) if t != "__metadata__"}
        assert in_shards == index["weight_map"]
        assert not (HF / name / "model.safetensors").exists()
    dtypes = {info["dtype"] for f in files for t, info in header(f).items() if t != "__metadata__"}
    assert dtypes == {storage}
    assert cfg.get("tie_word_embeddings", True) == tied
    assert ("lm_head.weight" in weights) == (not tied)  # a tied head is stored once
    if storage == "BF16":  # loaded as float32 whose low 16 bits are zero: exactly the BF16 values
        for array in weights.values():
            assert not (array.view(np.uint32) & 0xFFFF).any()


def test_rope_settings_in_both_spellings():
    legacy, newer = config("llama"), config("mistral")
    assert "rope_parameters" not in legacy and legacy["rope_theta"] == 500000.0
    assert legacy["rope_scaling"]["rope_type"] == "llama3"
    assert "rope_theta" not in newer and "rope_scaling" not in newer
    assert newer["rope_parameters"]["rope_type"] == "llama3"
    assert newer["rope_parameters"]["rope_theta"] == 10000.0
    assert config("qwen2")["rope_scaling"] is None and "head_dim" not in config("qwen2")


def test_reference_matches_its_checkpoint(checkpoint):
    name, weights, ref = checkpoint
    cfg = config(name)
    vocab = cfg["vocab_size"]
    grads = {k.removeprefix("grad:"): v for k, v in ref.items() if k.startswith("grad:")}
    stored = dict(weights)
    if CHECKPOINTS[name][3]:
        stored.pop("lm_head.weight", None)
    assert {k: v.shape for k, v in stored.items()} == {k: v.shape for k, v in grads.items()}
    assert all(g.dtype == np.float64 and np.isfinite(g).all() and g.any() for g in grads.values())
    ids, labels, logits = ref["input_ids"], ref["labels"], ref["logits"]
    assert logits.shape == (*ids.shape, vocab) and logits.dtype == np.float64
    assert ids.min() >= 0 and ids.max() < vocab
    assert (labels == np.where(labels == -100, labels, ids)).all() and (labels == -100).sum() == 1


def test_loss_is_hfs_shifted_cross_entropy(checkpoint):
    """loss = mean over kept positions of -log softmax(logits[:, t])[labels[:, t + 1]]."""
    _, _, ref = checkpoint
    logits, labels = ref["logits"][:, :-1], ref["labels"][:, 1:]
    keep = labels != -100
    shifted = logits - logits.max(-1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    picked = np.take_along_axis(logp, np.where(keep, labels, 0)[..., None], -1)[..., 0]
    assert keep.sum() == 11
    np.testing.assert_allclose(-picked[keep].mean(), ref["loss"], rtol=1e-13)


def test_greedy_reference_is_well_posed(checkpoint):
    name, _, ref = checkpoint
    prompt, greedy = ref["prompt_ids"], ref["greedy_ids"]
    assert prompt.shape == (1, 5) and greedy.shape == (1, 13)
    assert (greedy[:, :5] == prompt).all()
    assert not set(greedy[0, 5:].tolist()) & set(ref["eos_token_ids"].tolist())
    eos = config(name)["eos_token_id"]
    assert sorted(ref["eos_token_ids"].tolist()) == sorted(eos if isinstance(eos, list) else [eos])
    assert ref["greedy_min_margin"] > 1e-4  # far above float64 noise: no near-ties


@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_tokenizer_pairs_with_its_model(name):
    tokenizer = json.loads((HF / name / "tokenizer.json").read_text(encoding="utf-8"))
    tokenizer_config = json.loads((HF / name / "tokenizer_config.json").read_text())
    cfg = config(name)
    added = {t["content"]: t["id"] for t in tokenizer["added_tokens"]}
    size = len(tokenizer["model"]["vocab"]) + len(added)
    assert size == cfg["vocab_size"] == 512
    eos = cfg["eos_token_id"]
    assert added[tokenizer_config["eos_token"]] in (eos if isinstance(eos, list) else [eos])
    if tokenizer_config.get("bos_token"):
        assert added[tokenizer_config["bos_token"]] == cfg["bos_token_id"]
    assert {str(i) for i in added.values()} == set(tokenizer_config["added_tokens_decoder"])
