"""The loaders' one error class (models.formats.errors.FileFormatError)."""

import doctest
import json
import re
import shutil
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import models
import models.formats.errors
import nn
from models.formats import hf
from models.formats.hf import INDEX
from models.formats.tokenizer import BPETokenizer


def test_module_doctest():
    assert doctest.testmod(models.formats.errors).failed == 0


def test_message_names_file_field_and_value():
    err = models.FileFormatError("d/config.json", "vocab_size", "must be positive", -3)
    assert isinstance(err, ValueError)
    assert str(err) == "d/config.json: vocab_size: must be positive, got -3"
    assert (err.path, err.field, err.value) == ("d/config.json", "vocab_size", -3)
    with pytest.raises(models.FileFormatError, match=r"^d/x: no field$"):
        raise models.FileFormatError("d/x", None, "no field")
    long = models.FileFormatError("f", "k", "too long", "x" * 500)
    assert len(str(long)) < 160 and str(long).endswith("...")


# --- issue 34: each case it reported, as a user met it -------------------------------------------

HF = Path(__file__).resolve().parent / "fixtures" / "hf"


def copy(tmp_path: Path, name: str) -> Path:
    directory = tmp_path / name
    shutil.copytree(HF / name, directory)
    return directory


def edit_json(path: Path, **change) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **change}))


def equal(a, b) -> bool:
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    return a.config == b.config and all(np.array_equal(pa[k].data, pb[k].data) for k in pa)


@pytest.mark.parametrize(
    "name, field, value, message",
    [
        ("llama", "intermediate_size", "96", "intermediate_size: must be a positive integer"),
        ("llama", "num_key_value_heads", 0, "num_key_value_heads: must be a positive integer"),
        ("llama", "num_key_value_heads", 3, r"num_key_value_heads: must divide num_attention_he"),
        ("llama", "rope_parameters", "yes", "rope_parameters: must be an object"),
        ("llama", "model_type", ["llama"], r"model_type: \['llama'\] is not supported"),
        ("llama", "hidden_size", "64", "hidden_size: must be a positive integer, got '64'"),
        ("qwen2", "hidden_size", 15, r"hidden_size: must be divisible by num_attention_heads"),
        ("llama", "tie_word_embeddings", "false", "tie_word_embeddings: must be true or false"),
        ("qwen2", "tie_word_embeddings", "false", "tie_word_embeddings: must be true or false"),
        ("llama", "eos_token_id", 2.7, "eos_token_id: must be a token id or a list of them"),
        ("llama", "eos_token_id", 512, "eos_token_id: .* and below vocab_size 512"),
        ("llama", "rms_norm_eps", "1e-5", "rms_norm_eps: must be a positive number"),
        ("llama", "rope_scaling", {"rope_type": "yarn"}, "rope_scaling.rope_type: 'yarn' is no"),
        ("mistral", "sliding_window", 0, "sliding_window: must be a positive integer"),
        ("gpt2", "n_embd", 16.0, "n_embd: must be a positive integer, got 16.0"),
        ("gpt2", "n_inner", "64", "n_inner: must be a positive integer"),
        ("gpt2", "glassgrad", {"n_layer": 2}, r"glassgrad.vocab_size: is missing"),
        ("gpt2", "glassgrad", {"vocab_size": 8, "x": 1}, r"glassgrad: is not a GPTConfig"),
    ],
)
def test_config_json_errors_name_the_field_as_written(tmp_path, name, field, value, message):
    directory = copy(tmp_path, name)
    edit_json(directory / "config.json", **{field: value})
    with pytest.raises(models.FileFormatError, match=message) as info:
        models.from_pretrained(directory)
    assert str(info.value).startswith(f"{directory / 'config.json'}: {field}")


def test_generation_config_eos_is_checked_in_its_own_file(tmp_path):
    directory = copy(tmp_path, "llama")
    edit_json(directory / "generation_config.json", eos_token_id=[2, "3"])
    with pytest.raises(models.FileFormatError, match=r"generation_config.json: eos_token_id"):
        models.from_pretrained(directory)


def test_parameter_count_is_the_models_own(tmp_path):
    for name in ("llama", "qwen2", "mistral", "gpt2"):
        model = models.from_pretrained(HF / name)
        assert model.config.parameter_count() == sum(p.data.size for p in model.parameters())


@pytest.mark.parametrize(
    "field, value", [("vocab_size", 10**12), ("num_hidden_layers", 10**6), ("hidden_size", 2**40)]
)
def test_a_config_too_large_for_memory_is_refused_before_allocating(tmp_path, field, value):
    directory = copy(tmp_path, "llama")
    edit_json(directory / "config.json", **{field: value}, head_dim=None)
    tracemalloc.start()
    try:
        with pytest.raises(models.FileFormatError, match=r"config.json: the model has [\d,]+ par"):
            models.from_pretrained(directory)
        assert tracemalloc.get_traced_memory()[1] < 16 * 2**20
    finally:
        tracemalloc.stop()


def test_the_memory_limit_is_an_argument_and_an_environment_variable(tmp_path, monkeypatch):
    need = models.from_pretrained(HF / "llama").config.parameter_count() * 4
    with pytest.raises(models.FileFormatError, match=rf"{need:,} bytes in float32.*\(max_bytes\)"):
        models.from_pretrained(HF / "llama", max_bytes=need - 1)
    assert models.from_pretrained(HF / "llama", max_bytes=need)
    monkeypatch.setenv("GLASSGRAD_MAX_LOAD_BYTES", str(need - 1))
    with pytest.raises(models.FileFormatError, match=r"\(\$GLASSGRAD_MAX_LOAD_BYTES\)"):
        models.from_pretrained(HF / "llama")
    assert models.from_pretrained(HF / "llama", max_bytes=10**12)  # the argument wins
    monkeypatch.delenv("GLASSGRAD_MAX_LOAD_BYTES")
    assert hf.available_bytes()[1] in ("MemAvailable in /proc/meminfo", "the free physical memory")


def index_with(directory: Path, name) -> str:
    """Point every tensor of the first shard at `name`; return that shard's file name."""
    index = json.loads((directory / INDEX).read_text())
    first = sorted(set(index["weight_map"].values()))[0]
    index["weight_map"] = {k: name if v == first else v for k, v in index["weight_map"].items()}
    (directory / INDEX).write_text(json.dumps(index))
    return first


@pytest.mark.parametrize(
    "name, message",
    [
        ("../elsewhere/{shard}", "must be a plain file name"),
        ("{tmp}/elsewhere/{shard}", "must be a plain file name"),
        ("../../../../../../etc/passwd", "must be a plain file name"),
        (5, "must be a plain file name in this directory, got 5"),
        ("link.safetensors", "leads outside"),
        ("nope.safetensors", "names a shard that is missing"),
    ],
)
def test_index_shard_names_are_plain_files_inside_the_directory(tmp_path, name, message):
    directory = copy(tmp_path, "mistral")
    shard = sorted(set(json.loads((directory / INDEX).read_text())["weight_map"].values()))[0]
    (tmp_path / "elsewhere").mkdir()
    shutil.copy(directory / shard, tmp_path / "elsewhere" / shard)
    (directory / "link.safetensors").symlink_to(tmp_path / "elsewhere" / shard)
    if isinstance(name, str):
        name = name.format(shard=shard, tmp=tmp_path)
    index_with(directory, name)
    with pytest.raises(models.FileFormatError, match=message) as info:
        models.from_pretrained(directory)
    assert str(info.value).startswith(f"{directory / INDEX}: weight_map[")


def test_a_hub_snapshot_may_link_into_its_blobs(tmp_path):
    """Hugging Face's cache: snapshots/<revision>/<file> are links to ../../blobs/<hash>."""
    repo = tmp_path / "models--org--tiny"
    snapshot, blobs = repo / "snapshots" / "abc123", repo / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    for i, file in enumerate(sorted(p for p in (HF / "mistral").iterdir())):
        shutil.copy(file, blobs / f"blob{i}")
        (snapshot / file.name).symlink_to(Path("../../blobs") / f"blob{i}")
    assert equal(models.from_pretrained(snapshot), models.from_pretrained(HF / "mistral"))


def test_a_single_file_wins_over_an_index_as_in_transformers(tmp_path):
    directory = copy(tmp_path, "mistral")
    tensors = {}
    for shard in sorted(set(json.loads((directory / INDEX).read_text())["weight_map"].values())):
        tensors.update(nn.load_safetensors(directory / shard)[0])
    nn.save_safetensors(directory / "model.safetensors", tensors)
    index_with(directory, "../../etc/passwd")  # never read
    assert equal(models.from_pretrained(directory), models.from_pretrained(HF / "mistral"))


@pytest.mark.parametrize(
    "tensor, dtype",
    [
        ("model.layers.0.self_attn.k_proj.weight", np.int32),
        ("model.norm.weight", np.uint8),
        ("model.norm.weight", np.bool_),
        ("model.embed_tokens.weight", np.int64),
    ],
)
def test_an_integer_tensor_for_a_float_parameter_names_tensor_and_shard(tmp_path, tensor, dtype):
    directory = copy(tmp_path, "qwen2")
    tensors, metadata = nn.load_safetensors(directory / "model.safetensors")
    tensors[tensor] = (tensors[tensor] * 10).astype(dtype)
    nn.save_safetensors(directory / "model.safetensors", tensors, metadata)
    kind = {np.int32: "I32", np.uint8: "U8", np.bool_: "BOOL", np.int64: "I64"}[dtype]
    with pytest.raises(models.FileFormatError, match=rf"tensor '{tensor}' has dtype {kind}, a fl"):
        models.from_pretrained(directory)


def test_a_missing_tensor_names_the_file_or_the_index(tmp_path):
    directory = copy(tmp_path, "qwen2")
    tensors, metadata = nn.load_safetensors(directory / "model.safetensors")
    del tensors["model.norm.weight"]
    nn.save_safetensors(directory / "model.safetensors", tensors, metadata)
    match = rf"^{re.escape(str(directory / 'model.safetensors'))}: the checkpoint lacks model.no"
    with pytest.raises(models.FileFormatError, match=match):
        models.from_pretrained(directory)
    directory = copy(tmp_path, "mistral")  # the first shard's tensors listed in the last
    index_with(
        directory,
        sorted(set(json.loads((directory / INDEX).read_text())["weight_map"].values()))[-1],
    )
    with pytest.raises(models.FileFormatError, match=rf"{INDEX}: the checkpoint lacks model"):
        models.from_pretrained(directory)


def test_a_huge_tensor_in_a_header_is_refused_before_any_allocation(tmp_path):
    """A shard whose header declares a 6.4 GB tensor (the file really that long, sparse):
    refused by its name and shape, before a byte of it is read."""
    directory = copy(tmp_path, "mistral")
    path = directory / "model-00001-of-00003.safetensors"
    entry = {"dtype": "F32", "shape": [40000, 40000], "data_offsets": [0, 6_400_000_000]}
    encoded = json.dumps({"model.embed_tokens.weight": entry}).encode()
    with open(path, "wb") as f:
        f.write(len(encoded).to_bytes(8, "little") + encoded)
        f.truncate(8 + len(encoded) + 6_400_000_000)
    tracemalloc.start()
    try:
        with pytest.raises(models.FileFormatError, match=r"has shape \(40000, 40000\), the conf"):
            models.from_pretrained(directory)
        assert tracemalloc.get_traced_memory()[1] < 16 * 2**20
    finally:
        tracemalloc.stop()


def test_a_config_with_more_layers_than_its_files_is_refused_before_building(tmp_path):
    directory = copy(tmp_path, "llama")
    edit_json(directory / "config.json", num_hidden_layers=100_000)
    with pytest.raises(models.FileFormatError, match=r"model.safetensors: holds 2 layers, conf"):
        models.from_pretrained(directory)


def tokenizer_copy(tmp_path: Path, change) -> Path:
    directory = copy(tmp_path, "llama")
    data = json.loads((directory / "tokenizer.json").read_text())
    change(data)
    (directory / "tokenizer.json").write_text(json.dumps(data))
    return directory


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda d: d.update(model=[1]), r"model: must be an object, got \[1\]"),
        (lambda d: d["model"].update(merges=5), "model.merges: must be a list, got 5"),
        (lambda d: d["model"].update(merges={}), r"model.merges: must be a list, got \{\}"),
        (lambda d: d["added_tokens"].append("x"), r"added_tokens\[11\]: must be an object"),
        (lambda d: d.update(normalizer="NFC"), "normalizer: must be an object or null"),
        (
            lambda d: d["pre_tokenizer"]["pretokenizers"][0]["pattern"].update(Regex="(?<"),
            r"pretokenizers\[0\].pattern.Regex: is not a valid regex",
        ),
        (
            lambda d: d["added_tokens"].append({**d["added_tokens"][0], "content": "", "id": 9}),
            r"added_tokens\[11\].content: must not be empty",
        ),
        (
            lambda d: d["added_tokens"].append({**d["added_tokens"][0], "content": "x", "id": -1}),
            r"added_tokens\[11\].id: must be an id in \[0, 2\*\*32\), got -1",
        ),
    ],
)  # fmt: skip
def test_tokenizer_json_errors_name_the_field(tmp_path, change, message):
    directory = tokenizer_copy(tmp_path, change)
    with pytest.raises(models.FileFormatError, match=message) as info:
        BPETokenizer.from_pretrained(directory)
    assert str(info.value).startswith(str(directory / "tokenizer.json"))


def test_a_tokenizer_json_that_is_not_an_object_is_named(tmp_path):
    directory = copy(tmp_path, "llama")
    (directory / "tokenizer.json").write_text("[1]")
    with pytest.raises(models.FileFormatError, match=r"tokenizer.json: must hold a JSON object"):
        BPETokenizer.from_pretrained(directory)


@pytest.mark.parametrize(
    "template, message",
    [
        ("{{ 1/0 }}", "rendering failed: ZeroDivisionError"),
        ("{% macro f(x) %}{{ f(x) }}{% endmacro %}{{ f(1) }}", "RecursionError"),
        ("{{ 'x' * 10**10 }}", r"rendering stopped: 1 items \* 10000000000 exceeds"),
        ("{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}",
         "its loops exceed 1,000,000 iterations"),
        ("{{ 'x'.ljust(10**10) }}", "ljust with a size above"),
        (5, "must be a string"),
        ({"a": 1}, "must be a string"),
        (["a", "b"], r"chat_template\[0\]: must be"),
    ],
)  # fmt: skip
def test_chat_template_errors_name_tokenizer_config(tmp_path, template, message):
    directory = copy(tmp_path, "llama")
    edit_json(directory / "tokenizer_config.json", chat_template=template)
    config = directory / "tokenizer_config.json"
    with pytest.raises(models.FileFormatError, match=message) as info:
        tok = BPETokenizer.from_pretrained(directory)
        tok.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False)
    assert str(info.value).startswith(f"{config}: chat_template")


def test_the_render_budget_leaves_real_templates_alone():
    for name in ("llama", "qwen2"):
        tok = BPETokenizer.from_pretrained(HF / name)
        messages = [{"role": "user", "content": "Hi " * 1000}] * 200
        assert len(tok.apply_chat_template(messages, tokenize=False)) > 600_000
