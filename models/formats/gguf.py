"""GGUF files (llama.cpp's format): a model from one, its metadata and its tensors.

One home for reading GGUF: the metadata as a dict of plain Python values (read_metadata), the
tensors' infos, and each tensor dequantized to a requested dtype. The header itself is read by
gguf_header.py (gguf's own GGUFReader costs ~170 MB on a real vocabulary). F32, F16, BF16, the
block formats glassgrad keeps (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K: autograd.quantized)
and the other K-quants (Q2_K, Q3_K: ggml_blocks.py) are dequantized here, with the arithmetic
of gguf.quants.dequantize (the code transformers uses; tests hold them bit-equal); the rarer types
(the IQ types, TQ, MXFP4, ...) by gguf.quants itself, so only files of those need the optional
`gguf` package (`pip install glassgrad[gguf]`).

>>> meta = read_metadata("model.gguf")  # doctest: +SKIP
>>> meta["general.architecture"], len(meta["tokenizer.ggml.tokens"])  # doctest: +SKIP
('llama', 49152)
"""

from __future__ import annotations

import mmap
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from autograd.quantized import FORMATS, KEPT, QuantizedWeight, from_blocks
from autograd.quantized import quantize as quantize_weight
from models.formats.errors import FileFormatError
from models.formats.ggml_blocks import DEQUANTIZERS
from models.formats.gguf_header import GGMLType, GGUFHeader
from models.formats.quantized import QuantizedLoading


def open_reader(path: str | Path) -> GGUFHeader:
    """The file's header (models.formats.gguf_header: its metadata and tensor records, the data
    memory-mapped: tensors are read only when used). A malformed header is a FileFormatError."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    return GGUFHeader(path)


def read_metadata(source: str | Path | GGUFHeader) -> dict[str, Any]:
    """Every key-value pair of a GGUF file's header, in file order, as plain Python values: str,
    int, float, bool, or a list of them (tokenizer.ggml.tokens is a list of str). `source` is a
    path or an open header (open_reader). A path is read afresh each call (SmolLM2's 49152
    tokens and 48900 merges: ~0.1 s); nothing is kept between calls (~8 MB for SmolLM2)."""
    header = source if isinstance(source, GGUFHeader) else open_reader(source)
    return dict(header.metadata)


# --- tensors ----------------------------------------------------------------------------------

# Dequantize this many values at a time: dequantizing makes a few float32 temporaries the size of
# what it is given, so a whole 49152 x 576 embedding at once would cost several copies of it.
CHUNK_VALUES = 1 << 20
# the types dequantized here; every other one (but F64 and the integers) by gguf.quants
OWN_TYPES = ("F32", "F16", "BF16", *(fmt.upper() for fmt in KEPT), *DEQUANTIZERS)


class TensorInfo(NamedTuple):
    """A tensor as the file describes it: `dims` in GGUF's order (ne0, the contiguous one, first),
    `shape` in numpy's (dims reversed: a (rows, columns) matrix of ne0 columns), `type` the
    ggml type's name (F32, Q4_K, ...)."""

    name: str
    type: str
    dims: tuple[int, ...]
    shape: tuple[int, ...]


def tensor_infos(reader: Any) -> list[TensorInfo]:
    """The file's tensors in file order (reads no tensor data)."""
    return [_info(t) for t in reader.tensors]


def _info(tensor: Any) -> TensorInfo:
    dims = tuple(int(d) for d in tensor.shape.tolist())
    return TensorInfo(tensor.name, tensor.tensor_type.name, dims, dims[::-1])


def gguf_package(why: str) -> Any:
    """The `gguf` package, or an ImportError that says what needs it and how to get it."""
    try:
        import gguf
    except ImportError:
        raise ImportError(
            f"{why} needs the gguf package (llama.cpp's reader): "
            "pip install 'glassgrad[gguf]' (or pip install gguf)"
        ) from None
    return gguf


def supported(tensor_type: GGMLType) -> bool:
    """Whether a tensor of this type can be read as floats: the OWN_TYPES, and every type the
    installed gguf package has a dequantizer for (the IQ types, TQ, MXFP4...; not F64 or the
    integer types), asked of the package itself on one block of zero bytes, so a newer gguf's
    types work without a change here. Another type without the package: an ImportError."""
    if tensor_type.name in OWN_TYPES:
        return True
    if tensor_type.block_size == 1:  # F64 and the integers: never model weights
        return False
    gguf = gguf_package(f"reading {tensor_type.name} tensors")
    try:
        qtype = gguf.GGMLQuantizationType(tensor_type.code)
        gguf.quants.dequantize(np.zeros((1, tensor_type.type_size), np.uint8), qtype)
    except (ValueError, NotImplementedError):
        return False
    return True


def _dequantize_rows(rows: np.ndarray, tensor_type: GGMLType) -> np.ndarray:
    """A tensor's rows (a view of the file: plain values, or bytes per row) as float32 values,
    as gguf.quants.dequantize makes them: F16 and BF16 widened exactly, d * q, d * (q - 8) and
    d * q + m in float32 for the formats glassgrad keeps (QuantizedWeight.dequantize_rows), and
    ggml_blocks' arithmetic for the others it reads."""
    name = tensor_type.name
    if name == "F32":
        return rows
    if name == "F16":
        return rows.astype(np.float32)
    if name == "BF16":  # the high half of a float32's bits
        return (rows.view(np.int16).astype(np.int32) << 16).view(np.float32)
    if name in DEQUANTIZERS:
        blocks = rows.reshape(-1, tensor_type.type_size)
        return DEQUANTIZERS[name](blocks).reshape(rows.shape[0], -1)
    if name in OWN_TYPES:
        n_in = rows.shape[-1] // tensor_type.type_size * tensor_type.block_size
        return from_blocks(rows, name.lower(), n_in).dequantize_rows()
    gguf = gguf_package(f"reading {name} tensors")
    return gguf.quants.dequantize(rows, gguf.GGMLQuantizationType(tensor_type.code))


def dequantize(tensor: Any, dtype: Any, path: str | Path = "") -> np.ndarray:
    """One tensor of the reader (a TensorRecord) as an array of `dtype` in numpy's shape (GGUF's
    dims reversed), dequantized a group of rows at a time straight into the result: the peak is
    the result plus one group's temporaries. Each row is a whole number of blocks, so the values
    equal those of dequantizing the tensor at once."""
    info = _info(tensor)
    out = np.empty(info.shape, dtype=dtype)
    if out.size == 0:
        return out
    # a plain ndarray view of the memory map: slices of an np.memmap are memmaps, whose
    # bookkeeping cost more than the dequantizing when it is split into row groups
    data = np.asarray(tensor.data)
    rows_in = data.reshape(-1, data.shape[-1])  # quantized: (rows, bytes per row)
    rows_out = out.reshape(-1, info.shape[-1])
    step = max(1, CHUNK_VALUES // info.shape[-1])
    if not supported(tensor.tensor_type):
        raise FileFormatError(path, info.name, "has a type that cannot be dequantized", info.type)
    for start in range(0, rows_out.shape[0], step):
        rows_out[start : start + step] = _dequantize_rows(
            rows_in[start : start + step], tensor.tensor_type
        )
    return out


def quantize_rows(tensor: Any, fmt: str, path: str | Path = "") -> QuantizedWeight:
    """A tensor whose rows are a weight's outputs (a Linear's W^T, an embedding's table) quantized
    to fmt, a group of rows at a time: its float values are never whole (SmolLM2's 49152 x 576
    embedding is 113 MB in float32, 30 MB in q8_0). The same blocks as quantizing the whole
    dequantized tensor: each block is 32 values of one row."""
    info = _info(tensor)
    if not supported(tensor.tensor_type):
        raise FileFormatError(path, info.name, "has a type that cannot be dequantized", info.type)
    data = np.asarray(tensor.data)
    rows_in = data.reshape(-1, data.shape[-1])
    # a quarter of CHUNK_VALUES: quantizing makes ~5 float32 temporaries of its input's size
    step = max(1, CHUNK_VALUES // 4 // info.shape[-1])
    arrays: dict[str, np.ndarray] = {}  # the blocks' arrays, filled a group of rows at a time
    for start in range(0, rows_in.shape[0], step):
        values = _dequantize_rows(rows_in[start : start + step], tensor.tensor_type)
        part = quantize_weight(values.T, fmt)
        for name, block_array in part.arrays().items():
            if name not in arrays:
                rows = (rows_in.shape[0], *block_array.shape[1:])
                arrays[name] = np.empty(rows, block_array.dtype)
            arrays[name][start : start + len(block_array)] = block_array
    return QuantizedWeight(fmt, (info.shape[-1], rows_in.shape[0]), **arrays)


def unpermute_qk(weight: np.ndarray, n_head: int) -> np.ndarray:
    """Undo the row permutation llama.cpp's converter applies to attn_q / attn_k (and their
    biases) of a llama-architecture file (convert_hf_to_gguf.py, LlamaModel.permute), exactly as
    transformers' GGUF loader undoes it (LlamaTensorProcessor._reverse_permute_weights).

    Why it exists: HF's rotary embedding turns the pair (x_r, x_{r+D/2}) of each head (rotate
    half), llama.cpp's "normal" rope mode turns adjacent pairs (x_{2r}, x_{2r+1}). The converter
    interleaves each head's two halves of rows, row r and row r + D/2 becoming rows 2r and
    2r + 1, so that llama.cpp rotates the same pairs; reading rows back in HF's order is the
    inverse. `weight` is (rows, ...) in numpy's shape, rows = n_head * D; n_head is the number
    of query heads for attn_q, of key/value heads for attn_k. A QuantizedWeight's rows (whole
    rows of blocks) move the same way."""
    if isinstance(weight, QuantizedWeight):
        return weight.take_rows(unpermute_qk(np.arange(weight.out_features), n_head))
    half = weight.shape[0] // n_head // 2
    heads = weight.reshape(n_head, half, 2, *weight.shape[1:])  # file: (head, r, pair member)
    return heads.swapaxes(1, 2).reshape(weight.shape)  # HF: (head, which half, r)


# --- the model: GGUF metadata and names -> a Hugging Face config and HF-named tensors ----------

ARCHITECTURES = ("llama", "qwen2")

# GGUF's tensor names (llama.cpp's gguf-py/gguf/constants.py) -> Hugging Face's, for the Llama
# family, whose HF_NAMES (models/architectures/llama.py) then loads them; a block's tensors are
# blk.{i}.<name>.{weight,bias}.
GLOBAL_TENSORS = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
BLOCK_TENSORS = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_HF_GLOBAL = {hf: name for name, hf in GLOBAL_TENSORS.items()}
_HF_BLOCK = {hf: name for name, hf in BLOCK_TENSORS.items()}
_HF_LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)\.(weight|bias)")


def gguf_name(hf_name: str) -> str:
    """A Hugging Face Llama-family tensor name -> the name llama.cpp gives it in a GGUF file:
    model.layers.3.self_attn.q_proj.weight -> blk.3.attn_q.weight."""
    if m := _HF_LAYER.fullmatch(hf_name):
        return f"blk.{m[1]}.{_HF_BLOCK[m[2]]}.{m[3]}"
    stem, kind = hf_name.rsplit(".", 1)
    return f"{_HF_GLOBAL[stem]}.{kind}"


def _value(meta: dict[str, Any], key: str, path: Path, kind: str, default: Any = ...) -> Any:
    """meta[key] checked to be of `kind` ("str", "count": an int > 0, "number": a finite float
    or int), or a FileFormatError naming the key as the file writes it."""
    if key not in meta:
        if default is ...:
            raise FileFormatError(path, key, "is missing")
        return default
    value = meta[key]
    if kind == "str":
        ok = isinstance(value, str)
    elif kind == "count":  # bool is an int in Python; a GGUF bool is not a count
        ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
    else:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and np.isfinite(value)
    if not ok:
        what = {"str": "a string", "count": "a positive integer", "number": "a finite number"}
        raise FileFormatError(path, key, f"must be {what[kind]}", value)
    return value


def _token_id(meta: dict[str, Any], key: str, path: Path) -> int | None:
    value = meta.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise FileFormatError(path, key, "must be a token id (an integer >= 0)", value)
    return value


def hf_config(meta: dict[str, Any], tensor_names: set[str], path: str | Path) -> dict[str, Any]:
    """A GGUF file's metadata (read_metadata) -> the config.json a Hugging Face directory of the
    same model holds, which models.architectures.llama reads (so a GGUF model and a directory go
    through one path, its checks included). The keys are llama.cpp's: {arch}.block_count,
    .context_length, .embedding_length, .feed_forward_length, .attention.head_count(_kv),
    .rope.freq_base, .rope.dimension_count, .attention.layer_norm_rms_epsilon; the vocabulary's size
    is {arch}.vocab_size or the length of tokenizer.ggml.tokens; the head is tied to the embedding
    when the file has no output.weight (as llama.cpp and transformers decide)."""
    path = Path(path)
    arch = _value(meta, "general.architecture", path, "str")
    if arch not in ARCHITECTURES:
        raise FileFormatError(
            path,
            "general.architecture",
            f"is not supported (known: {', '.join(ARCHITECTURES)})",
            arch,
        )
    p = f"{arch}."
    if meta.get(p + "expert_count"):
        raise FileFormatError(
            path,
            p + "expert_count",
            "mixture-of-experts models are not supported",
            meta[p + "expert_count"],
        )
    n_embd = _value(meta, p + "embedding_length", path, "count")
    n_head = _value(meta, p + "attention.head_count", path, "count")
    n_kv_head = _value(meta, p + "attention.head_count_kv", path, "count", n_head)
    # llama.cpp: the head size is attention.key_length, else embedding_length / head_count; the
    # rotary dimensions (rope.dimension_count) must cover the whole head, as HF's Llama rotates.
    head_dim = _value(meta, p + "attention.key_length", path, "count", n_embd // n_head)
    value_dim = _value(meta, p + "attention.value_length", path, "count", head_dim)
    if value_dim != head_dim:
        raise FileFormatError(
            path, p + "attention.value_length", f"must equal the key length {head_dim}", value_dim
        )
    rope_dims = _value(meta, p + "rope.dimension_count", path, "count", head_dim)
    if rope_dims != head_dim:
        raise FileFormatError(
            path,
            p + "rope.dimension_count",
            f"partial rotary embeddings are not supported (the head size is {head_dim})",
            rope_dims,
        )
    _check_rope_scaling(meta, p, tensor_names, path)
    if p + "vocab_size" in meta:
        vocab_size = _value(meta, p + "vocab_size", path, "count")
    else:
        tokens = meta.get("tokenizer.ggml.tokens")
        if not isinstance(tokens, list) or not tokens:
            raise FileFormatError(
                path,
                "tokenizer.ggml.tokens",
                "is missing (the vocabulary's size comes from it)",
                tokens,
            )
        vocab_size = len(tokens)
    # llama.cpp stops generating at any end-of-generation token: EOS, end-of-turn, end-of-message
    eos = [_token_id(meta, f"tokenizer.ggml.{k}_token_id", path) for k in ("eos", "eot", "eom")]
    eos = list(dict.fromkeys(i for i in eos if i is not None))
    config = {
        "model_type": arch,
        "architectures": [{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}[arch]],
        "vocab_size": vocab_size,
        "hidden_size": n_embd,
        "intermediate_size": _value(meta, p + "feed_forward_length", path, "count"),
        "num_hidden_layers": _value(meta, p + "block_count", path, "count"),
        "num_attention_heads": n_head,
        "num_key_value_heads": n_kv_head,
        "head_dim": head_dim,
        "max_position_embeddings": _value(meta, p + "context_length", path, "count"),
        "rms_norm_eps": float(_value(meta, p + "attention.layer_norm_rms_epsilon", path, "number")),
        "rope_theta": float(_value(meta, p + "rope.freq_base", path, "number", 10000.0)),
        "hidden_act": "silu",
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "bos_token_id": _token_id(meta, "tokenizer.ggml.bos_token_id", path),
        "eos_token_id": eos[0] if len(eos) == 1 else (eos or None),
    }
    if arch == "llama":  # biases, when a llama file has them (Qwen2 always has q/k/v biases)
        config["attention_bias"] = "blk.0.attn_q.bias" in tensor_names
        config["mlp_bias"] = "blk.0.ffn_up.bias" in tensor_names
    return config


def _check_rope_scaling(meta: dict[str, Any], p: str, tensor_names: set[str], path: Path) -> None:
    """glassgrad's Llama rotates without scaling here: a file that scales (rope.scaling.type
    linear / yarn / longrope with a factor other than 1, the older rope.scale_linear, or Llama
    3's per-frequency factors stored as the tensor rope_freqs.weight) is refused, not misread."""
    kind = meta.get(p + "rope.scaling.type", "none")
    factor = meta.get(p + "rope.scaling.factor", 1.0)
    if kind not in ("none", None) and factor != 1.0:
        raise FileFormatError(path, p + "rope.scaling.type", "RoPE scaling is not supported", kind)
    if meta.get(p + "rope.scale_linear", 1.0) != 1.0:
        raise FileFormatError(
            path,
            p + "rope.scale_linear",
            "RoPE scaling is not supported",
            meta[p + "rope.scale_linear"],
        )
    if "rope_freqs.weight" in tensor_names:
        raise FileFormatError(
            path,
            "rope_freqs.weight",
            "per-frequency RoPE factors (Llama 3.1's scaling) are not supported",
        )


def read_config(path: str | Path) -> dict[str, Any]:
    """The Hugging Face config a GGUF file stands for (hf_config), without reading its weights."""
    reader = open_reader(path)
    return hf_config(read_metadata(reader), {t.name for t in reader.tensors}, path)


def load(
    path: str | Path, dtype: Any = None, max_bytes: int | None = None, quantize: str | None = None
) -> Any:
    """The model of a GGUF file, weights in dtype (default: the default float dtype, float32).

    The metadata becomes a Hugging Face config (hf_config) and the tensors HF-named arrays in
    HF's layout, which the family's own loader (Decoder.load_hf_tensors) takes as it takes a
    directory's: one path builds every model. Every tensor's presence, dims and type is checked
    before any is read; then each is dequantized straight into dtype, one at a time (the peak is
    the model in dtype plus about one tensor).

    quantize: None (every weight in dtype), a format of autograd.quantized.FORMATS (every Linear
    weight and a tied embedding quantized as it is read) or "gguf" (those weights keep the file's
    own Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K or Q6_K blocks, never dequantized; of another type
    they are dequantized to dtype). The float weights the quantized ones replace are never allocated
    (QuantizedLoading)."""
    from autograd import get_default_dtype
    from models.architectures.decoder import _NoInit  # every weight is about to be loaded
    from models.architectures.llama import Llama
    from models.formats import hf

    path = Path(path)
    dtype = np.dtype(get_default_dtype() if dtype is None else dtype)
    reader = open_reader(path)
    tensors = {t.name: t for t in reader.tensors}
    config = hf_config(read_metadata(reader), set(tensors), path)
    settings = Llama.config_from_hf(config, str(path))
    hf.check_memory(path, settings.parameter_count(), dtype, max_bytes)  # before allocating
    model = Llama(settings, _NoInit())
    expected = _expected_tensors(model, path)
    _check_tensors(expected, tensors, path, config["model_type"])
    n_head, n_kv_head = config["num_attention_heads"], config["num_key_value_heads"]
    permuted = {"attn_q": n_head, "attn_k": n_kv_head} if config["model_type"] == "llama" else {}

    quantized = None if quantize is None else QuantizedLoading(model, quantize, dtype)

    def hf_tensors() -> Iterator[tuple[str, str, Any]]:
        for name, tensor in tensors.items():  # file order: the memory map is read front to back
            hf_name = expected[name][0]
            fmt = tensor.tensor_type.name.lower()
            if quantize == "gguf" and fmt in KEPT and hf_name in quantized.targets:
                n_in = int(tensor.shape[0])  # ne0: the values of a row
                array = from_blocks(
                    np.asarray(tensor.data).reshape(-1, tensor.data.shape[-1]), fmt, n_in
                )
            elif quantize in FORMATS and quantized.rows_are_outputs(hf_name):
                array = quantize_rows(tensor, quantize, path)
            else:
                array = dequantize(tensor, dtype, path)
            kind = name.split(".")[-2]  # blk.3.attn_q.weight -> attn_q
            if kind in permuted:  # llama's converter permuted these rows (weights and biases)
                array = unpermute_qk(array, permuted[kind])
            yield str(path), hf_name, array
            _release(reader, tensor)  # copied by now: its pages of the file can go

    if quantized is None:
        model.load_hf_tensors(hf_tensors(), dtype)
    else:
        model.load_hf_tensors(quantized.take(hf_tensors()), dtype)
        quantized.check(path)
    return model


def _release(reader: Any, tensor: Any) -> None:
    """Take a tensor's pages of the memory-mapped file out of this process's resident memory
    (madvise MADV_DONTNEED; the OS keeps them in its page cache): read front to back, the file's
    pages would otherwise stay resident beside the copies made of them (the Q4_1 SmolLM2's 98 MB)
    until the reader is closed."""
    file_map = getattr(reader.data, "_mmap", None)
    if file_map is None or not hasattr(mmap, "MADV_DONTNEED"):
        return
    start = tensor.data_offset // mmap.PAGESIZE * mmap.PAGESIZE
    file_map.madvise(mmap.MADV_DONTNEED, start, tensor.data_offset + tensor.n_bytes - start)


def _expected_tensors(model: Any, path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """GGUF name -> (HF name, dims as the file should write them: HF's shape reversed, i.e.
    glassgrad's (in, out) for the Linear weights HF stores (out, in)) for every row of the
    model's HF_NAMES."""
    params = dict(model.named_parameters())
    expected = {}
    for hf_name, (name, transposed) in model.hf_names().items():
        hf_shape = params[name].shape[::-1] if transposed else params[name].shape
        expected[gguf_name(hf_name)] = (hf_name, tuple(hf_shape[::-1]))
    return expected


def _check_tensors(
    expected: dict[str, tuple[str, tuple[int, ...]]], tensors: dict[str, Any], path: Path, arch: str
) -> None:
    """Every tensor the metadata implies is present, of the right dims and of a type that can be
    dequantized (supported), and the file holds no other (llama.cpp refuses a file with tensors
    it does not use, too): a FileFormatError naming the tensor otherwise."""
    for name, (_, dims) in expected.items():
        if name not in tensors:
            raise FileFormatError(
                path, name, f"is missing (the metadata describes a {arch} model with it)"
            )
        info = _info(tensors[name])
        if info.dims != dims:
            raise FileFormatError(
                path,
                name,
                f"must have dims {list(dims)} (ne0 first) by the metadata",
                list(info.dims),
            )
    for name in tensors:
        if name not in expected:
            raise FileFormatError(
                path, name, f"is not a tensor of the {arch} model the metadata describes"
            )
    for name, tensor in tensors.items():
        if not supported(tensor.tensor_type):
            raise FileFormatError(
                path, name, "has a type that cannot be dequantized", tensor.tensor_type.name
            )
