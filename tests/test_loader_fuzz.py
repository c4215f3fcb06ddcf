"""Files from strangers (issue 34): valid fixture directories, corrupted along each axis a user's
download can go wrong (config.json's fields and sizes, the index's shard names, each shard's
header and dtypes, tokenizer.json, tokenizer_config.json's chat template), must end in one of two
ways: a model (or tokenizer) equal to the original, or models.FileFormatError with the path of
the file at fault in its message. Never another exception, never a read outside the directory
(an audit hook watches every open), never more than a bounded allocation (tracemalloc's peak),
never an unbounded run (an alarm). Seeded by hypothesis's profile (`ci`: derandomized).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import models
import nn
from models.formats import chat_template
from models.formats.tokenizer import BPETokenizer

HF = Path(__file__).resolve().parent / "fixtures" / "hf"
ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ("llama", "qwen2", "mistral", "gpt2")  # BF16 one file, F32 tied, F16 shards, GPT-2
INDEX = "model.safetensors.index.json"
PEAK = 48 * 2**20  # the fixtures load in a few MiB; a blind allocation would show far above this
LIMIT = 32 * 2**20  # the loader's memory limit here (GLASSGRAD_MAX_LOAD_BYTES): a huge config's
SECONDS = int(os.environ.get("FUZZ_SECONDS", 20))  # a load or render running longer: unbounded


# --- the watch: reads outside the directory, allocation, time -----------------------------------

_WATCHED: list[tuple[Path, list[str]]] = []  # (directory, opens outside it) while a load runs
_ALLOWED = {Path(p).resolve() for p in (sys.prefix, sys.base_prefix, ROOT, "/proc/meminfo")}


def _audit(event: str, args: tuple) -> None:
    if event != "open" or not _WATCHED or not isinstance(args[0], (str, bytes, os.PathLike)):
        return
    directory, outside = _WATCHED[-1]
    path = Path(os.fsdecode(args[0])).resolve()
    if path.is_relative_to(directory) or any(path.is_relative_to(p) for p in _ALLOWED):
        return
    outside.append(str(path))


sys.addaudithook(_audit)  # audit hooks cannot be removed: this one does nothing unless watching


class _Unbounded(Exception):
    pass


def _alarm(signum, frame):
    raise _Unbounded(f"ran over {SECONDS} s")


@contextlib.contextmanager
def watch(directory: Path):
    """Record opens outside directory, the peak of traced allocations and a time limit."""
    outside: list[str] = []
    _WATCHED.append((directory.resolve(), outside))
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(SECONDS)
    tracemalloc.start()
    report = {"outside": outside}
    try:
        yield report
    finally:
        report["peak"] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
        _WATCHED.pop()


def outcome(directory: Path, load):
    """(result, error) of load() under the watch; any exception but FileFormatError fails."""
    with watch(directory) as report:
        try:
            result, error = load(), None
        except models.FileFormatError as exc:
            result, error = None, exc
    assert not report["outside"], f"read outside {directory}: {report['outside']}"
    assert report["peak"] < PEAK, f"allocated {report['peak'] / 2**20:.0f} MiB"
    return result, error


def assert_names_file(error: Exception, directory: Path, names) -> None:
    """The message holds the path of one of the files named (inside directory)."""
    message = str(error)
    assert any(str(directory / name) in message for name in names), (names, message)


# --- the originals and their corrupted copies ---------------------------------------------------


@pytest.fixture(scope="module")
def originals():
    return {name: models.from_pretrained(HF / name) for name in FIXTURES}


@pytest.fixture(autouse=True)
def _limits(monkeypatch):
    """The loader's memory limit, and a smaller render budget (the same code, reached sooner)."""
    monkeypatch.setenv("GLASSGRAD_MAX_LOAD_BYTES", str(LIMIT))
    monkeypatch.setattr(chat_template, "MAX_ITERATIONS", 20_000)
    monkeypatch.setattr(chat_template, "MAX_OUTPUT", 200_000)


@contextlib.contextmanager
def copy_of(name: str):
    """A fresh copy of fixture `name` at <tmp>/model (with <tmp>/elsewhere beside it)."""
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "model"
        shutil.copytree(HF / name, directory)
        (directory / "reference.npz").unlink()
        (Path(tmp) / "elsewhere").mkdir()
        yield directory


def same_model(a, b) -> bool:
    pa, pb = dict(a.named_parameters()), dict(b.named_parameters())
    return (
        type(a) is type(b)
        and a.config == b.config
        and pa.keys() == pb.keys()
        and all(np.array_equal(pa[k].data, pb[k].data) for k in pa)
    )


def shards(directory: Path) -> list[str]:
    if (directory / INDEX).is_file():
        return sorted(set(json.loads((directory / INDEX).read_text())["weight_map"].values()))
    return ["model.safetensors"]


def load_model(directory: Path, originals, name: str, files, must_load: bool = False):
    model, error = outcome(directory, lambda: models.from_pretrained(directory))
    if error is not None:
        assert not must_load, f"refused a valid directory: {error}"
        assert_names_file(error, directory, files)
    else:
        assert same_model(model, originals[name]), "loaded a different model, silently"
    return error


def read_json(path: Path):
    return json.loads(path.read_text())


def write_json(path: Path, value) -> None:
    path.write_text(json.dumps(value))


# --- config.json: every field a family reads, given a wrong value -------------------------------

POSITIVE = "positive integer"
FIELDS = {  # the fields each family reads, as written, and what they must be
    "llama": {
        "vocab_size": POSITIVE,
        "hidden_size": POSITIVE,
        "intermediate_size": POSITIVE,
        "num_hidden_layers": POSITIVE,
        "num_attention_heads": POSITIVE,
        "num_key_value_heads": POSITIVE,
        "head_dim": POSITIVE,
        "max_position_embeddings": POSITIVE,
        "rms_norm_eps": "positive number",
        "rope_theta": "positive number",
        "rope_scaling": "rope",
        "tie_word_embeddings": "boolean",
        "attention_bias": "boolean",
        "mlp_bias": "boolean",
        "eos_token_id": "token ids",
        "hidden_act": "name",
        "model_type": "name",
    },
    "gpt2": {
        "vocab_size": POSITIVE,
        "n_embd": POSITIVE,
        "n_layer": POSITIVE,
        "n_head": POSITIVE,
        "n_positions": POSITIVE,
        "n_inner": POSITIVE,
        "layer_norm_epsilon": "positive number",
        "activation_function": "name",
        "eos_token_id": "token ids",
        "tie_word_embeddings": "boolean",
        "model_type": "name",
        "glassgrad": "glassgrad",
    },
}
FIELDS["qwen2"] = FIELDS["llama"]
FIELDS["mistral"] = {
    **{k: v for k, v in FIELDS["llama"].items() if k not in ("rope_scaling", "attention_bias")},
    "rope_parameters": "rope",
    "sliding_window": POSITIVE,
}
REQUIRED = {
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "intermediate_size",
    "max_position_embeddings",
    "model_type",
    "n_embd",
    "n_layer",
    "n_head",
}


def wrong_values(kind: str, value):
    """Values a field of this kind must refuse (none of them means what the original does)."""
    anything = st.sampled_from([[value], {"value": value}, "yes", [], {}])
    if kind == POSITIVE:
        v = value if isinstance(value, int) and not isinstance(value, bool) else 8
        return st.one_of(
            anything,
            st.sampled_from([str(v), float(v), v + 0.5, True, False, 0, -v, "", "1e3"]),
            st.integers(max_value=0),
        )
    if kind == "positive number":
        return st.one_of(anything, st.sampled_from([str(value), True, 0, 0.0, -1e-5, "nan", -3]))
    if kind == "boolean":
        return st.one_of(anything, st.sampled_from(["false", "true", "False", 0, 1, 0.0, "no"]))
    if kind == "token ids":
        return st.one_of(
            st.sampled_from([2.7, "2", [2.5], [True], True, -1, [-1], 10**12, "x", {"a": 1}]),
            st.lists(st.sampled_from([1.5, "1", None]), min_size=1, max_size=3),
        )
    if kind == "name":
        return st.one_of(anything, st.sampled_from([5, None, True, "LLAMA", "bert", " llama"]))
    if kind == "rope":
        return st.one_of(
            st.sampled_from(["yes", 5, [1], True]),
            st.fixed_dictionaries({"rope_type": st.sampled_from([5, "yarn", ["llama3"], None])}),
            st.fixed_dictionaries(
                {
                    "rope_type": st.just("llama3"),
                    "factor": st.sampled_from(["8", -1, 0, None, [8]]),
                    "low_freq_factor": st.just(1.0),
                    "high_freq_factor": st.sampled_from([4.0, "4", 0.5]),
                    "original_max_position_embeddings": st.sampled_from([8192, 0, 8192.5, "x"]),
                }
            ),
        )
    return st.sampled_from([5, "x", [1], {"n_layer": "2"}, {"nope": 1}, {"vocab_size": -1}])


@given(data=st.data())
def test_config_fields_with_wrong_values(originals, data):
    name = data.draw(st.sampled_from(FIXTURES), "fixture")
    with copy_of(name) as directory:
        config = read_json(directory / "config.json")
        if name == "gpt2" and data.draw(st.booleans(), "as glassgrad writes it"):
            config["glassgrad"] = originals["gpt2"].config.__dict__
        key = data.draw(st.sampled_from(sorted(FIELDS[name])), "field")
        if key in REQUIRED and data.draw(st.booleans(), "delete it"):
            config.pop(key, None)
        else:
            config[key] = data.draw(wrong_values(FIELDS[name][key], config.get(key)), "value")
        write_json(directory / "config.json", config)
        error = load_model(directory, originals, name, ["config.json", *shards(directory)])
        if error is not None and str(directory / "config.json") in str(error):
            assert error.field, str(error)  # the field as written in the file


@given(data=st.data())
def test_config_files_that_are_not_configs(originals, data):
    name = data.draw(st.sampled_from(FIXTURES), "fixture")
    with copy_of(name) as directory:
        path = directory / "config.json"
        text = path.read_text()
        content = data.draw(
            st.one_of(
                st.sampled_from(["[]", "5", '"llama"', "null", "", "{", '{"model_type": 5}']),
                st.integers(0, len(text) - 1).map(lambda n: text[:n]),
                st.just(b"\xff\xfe{}"),
                st.sampled_from([{"model_type": ["llama"]}, {"model_type": {"a": 1}}]).map(
                    json.dumps
                ),
            ),
            "content",
        )
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
        load_model(directory, originals, name, ["config.json"])


@given(data=st.data())
def test_configs_too_large_for_memory_are_refused_before_allocating(originals, data):
    name = data.draw(st.sampled_from(FIXTURES), "fixture")
    with copy_of(name) as directory:
        config = read_json(directory / "config.json")
        huge = data.draw(st.sampled_from([10**6, 10**9, 10**12, 2**40 + 1]), "size")
        heads = "n_head" if name == "gpt2" else "num_attention_heads"
        sizes = {
            "gpt2": ["vocab_size", "n_layer", "n_positions", "n_inner"],
            "llama": ["vocab_size", "num_hidden_layers", "intermediate_size"],
        }[name if name == "gpt2" else "llama"]
        key = data.draw(st.sampled_from([*sizes, "width"]), "field")
        if key == "width":  # hidden size and heads grown together: divisibility still holds
            width = "n_embd" if name == "gpt2" else "hidden_size"
            config[width] = config[heads] * (huge // config[heads])
            config.pop("head_dim", None)
        else:
            config[key] = huge
        write_json(directory / "config.json", config)
        model, error = outcome(directory, lambda: models.from_pretrained(directory))
        assert error is not None and str(directory / "config.json") in str(error)
        assert "bytes" in str(error) and "GLASSGRAD_MAX_LOAD_BYTES" in str(error)


# --- model.safetensors.index.json: shard names, and which file wins ----------------------------

ESCAPES = [
    "../elsewhere/{shard}",
    "{tmp}/elsewhere/{shard}",
    "../../../../../../../../etc/passwd",
    "/etc/passwd",
    "sub/{shard}",
    "./{shard}",
    "link.safetensors",
    "",
    ".",
    "..",
    5,
    None,
    ["{shard}"],
    {"file": "{shard}"},
]


@given(data=st.data())
def test_index_shard_names_stay_inside_the_directory(originals, data):
    with copy_of("mistral") as directory:
        tmp = directory.parent
        index = read_json(directory / INDEX)
        weight_map = index["weight_map"]
        shard = data.draw(st.sampled_from(sorted(set(weight_map.values()))), "shard")
        escape = data.draw(st.sampled_from(ESCAPES), "escape")
        name = json.loads(json.dumps(escape).replace("{shard}", shard).replace("{tmp}", str(tmp)))
        # the shard's tensors really are where the name points: a loader that follows it loads
        for where in (tmp / "elsewhere", directory / "sub"):
            where.mkdir(exist_ok=True)
            shutil.copy(directory / shard, where / shard)
        (directory / "link.safetensors").symlink_to(tmp / "elsewhere" / shard)
        if data.draw(st.booleans(), "all the shard's tensors"):
            index["weight_map"] = {k: name if v == shard else v for k, v in weight_map.items()}
        else:
            weight_map[next(k for k, v in weight_map.items() if v == shard)] = name
        write_json(directory / INDEX, index)
        load_model(directory, originals, "mistral", [INDEX, *shards(HF / "mistral")])


@given(data=st.data())
def test_index_files_that_are_not_indexes(originals, data):
    with copy_of("mistral") as directory:
        index = read_json(directory / INDEX)
        content = data.draw(
            st.sampled_from(
                [
                    "[]",
                    "{",
                    "{}",
                    json.dumps({"weight_map": []}),
                    json.dumps({"weight_map": {}}),
                    json.dumps({"weight_map": "model-00001-of-00003.safetensors"}),
                    json.dumps({"weight_map": {"5": 5}}),
                    json.dumps({**index, "weight_map": {**index["weight_map"], "x": "nope"}}),
                ]
            ),
            "content",
        )
        (directory / INDEX).write_text(content)
        load_model(directory, originals, "mistral", [INDEX, *shards(HF / "mistral")])


@given(data=st.data())
def test_a_single_file_wins_over_an_index_as_in_transformers(originals, data):
    with copy_of("mistral") as directory:
        tensors = {}
        for shard in shards(directory):
            tensors.update(nn.load_safetensors(directory / shard)[0])
        nn.save_safetensors(directory / "model.safetensors", tensors, {"format": "pt"})
        broken = data.draw(st.sampled_from(["{", "[]", json.dumps({"weight_map": {"a": "/x"}})]))
        (directory / INDEX).write_text(broken)
        load_model(directory, originals, "mistral", [], must_load=True)


# --- shards: headers checked against the model before any data is read; dtypes ------------------


def rewrite(path: Path, change) -> None:
    """Load a shard, let change(tensors) edit it, write it back (a consistent file)."""
    tensors, metadata = nn.load_safetensors(path)
    change(tensors)
    nn.save_safetensors(path, tensors, metadata)


def raw_header(path: Path) -> tuple[dict, bytes]:
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    return json.loads(data[8 : 8 + n]), data[8 + n :]


def write_raw(path: Path, header: dict, data: bytes, size: int | None = None) -> None:
    encoded = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(len(encoded).to_bytes(8, "little") + encoded + data)
        if size is not None:
            f.truncate(8 + len(encoded) + size)  # sparse: the declared bytes cost no disk


SHARD_CHANGES = ["int32", "int64", "uint8", "bool", "float64", "rename", "drop", "transpose",
                 "extra dim", "huge", "huge unknown", "duplicate"]  # fmt: skip


@given(data=st.data())
def test_shards_with_the_wrong_tensors(originals, data):
    name = data.draw(st.sampled_from(FIXTURES), "fixture")
    with copy_of(name) as directory:
        shard = data.draw(st.sampled_from(shards(directory)), "shard")
        path = directory / shard
        header, _ = raw_header(path)
        tensor = data.draw(st.sampled_from(sorted(k for k in header if k != "__metadata__")))
        how = data.draw(st.sampled_from(SHARD_CHANGES), "how")
        if how == "float64":  # the same values, stored wider: loads as the original
            rewrite(path, lambda t: t.__setitem__(tensor, t[tensor].astype(how)))
        elif how in ("int32", "int64", "uint8", "bool"):
            rewrite(path, lambda t: t.__setitem__(tensor, (t[tensor] * 3).astype(how)))
        elif how == "rename":
            rewrite(path, lambda t: t.__setitem__(tensor + "_x", t.pop(tensor)))
        elif how == "drop":
            rewrite(path, lambda t: t.pop(tensor))
        elif how == "transpose":
            rewrite(path, lambda t: t.__setitem__(tensor, np.ascontiguousarray(t[tensor].T[None])))
        elif how == "extra dim":
            rewrite(path, lambda t: t.__setitem__(tensor, t[tensor][..., None]))
        elif how == "duplicate":
            other = directory / shards(directory)[-1]
            if other != path:
                value = nn.load_safetensors(path)[0][tensor]
                rewrite(other, lambda t: t.__setitem__(tensor, value))
            else:
                rewrite(path, lambda t: t.__setitem__(tensor + ".copy", t[tensor]))
        else:  # a header declaring 256 MiB: nothing may be allocated from that claim
            key = tensor if how == "huge" else "model.unknown.weight"
            write_raw(path, {key: {"dtype": "F32", "shape": [2**13, 2**13], "data_offsets":
                                   [0, 2**28]}}, b"", size=2**28)  # fmt: skip
        load_model(directory, originals, name, [shard, INDEX, "model.safetensors"])


@given(data=st.data())
def test_shards_that_are_not_safetensors(originals, data):
    name = data.draw(st.sampled_from(FIXTURES), "fixture")
    with copy_of(name) as directory:
        path = directory / data.draw(st.sampled_from(shards(directory)), "shard")
        raw = bytearray(path.read_bytes())
        n = int.from_bytes(raw[:8], "little")
        how = data.draw(st.sampled_from(["flip", "truncate", "length", "empty", "dir"]), "how")
        if how == "flip":  # a byte of the header changed
            i = data.draw(st.integers(0, 8 + n - 1), "byte")
            raw[i] ^= data.draw(st.integers(1, 255), "xor")
        elif how == "truncate":
            raw = raw[: data.draw(st.integers(0, len(raw) - 1), "length")]
        elif how == "length":
            raw[:8] = data.draw(st.sampled_from([2**63, 2**40, n + 1, 0])).to_bytes(8, "little")
        elif how == "empty":
            raw = bytearray()
        if how == "dir":
            path.unlink()
            path.mkdir()
        else:
            path.write_bytes(bytes(raw))
        load_model(directory, originals, name, [path.name, INDEX, "model.safetensors"])


# --- tokenizer.json and tokenizer_config.json's chat template ------------------------------------

MESSAGES = [{"role": "user", "content": "Hi there"}, {"role": "assistant", "content": "Hello"}]


@pytest.fixture(scope="module")
def tokenizers():
    return {name: BPETokenizer.from_pretrained(HF / name) for name in ("llama", "qwen2")}


def tokenizer_outcome(directory: Path, original, files):
    def use():
        tok = BPETokenizer.from_pretrained(directory)
        text = "Hello world, 12345 <|im_start|> héllo"
        return list(tok.encode(text, allowed_special="all")), tok.decode(tok.encode(text))

    result, error = outcome(directory, use)
    if error is None:
        text = "Hello world, 12345 <|im_start|> héllo"
        expected = list(original.encode(text, allowed_special="all"))
        assert result == (expected, original.decode(original.encode(text))), "silently different"
    else:
        assert_names_file(error, directory, files)


def tokenizer_corruptions(spec: dict):
    model, added = spec["model"], spec["added_tokens"]
    split = json.dumps(spec["pre_tokenizer"])
    return [
        ("model", [1]), ("model", "BPE"), ("model", None),
        ("model.merges", 5), ("model.merges", {}), ("model.merges", ["a"]),
        ("model.merges", [["a"]]), ("model.merges", ["a b c"]), ("model.merges", [5]),
        ("model.vocab", []), ("model.vocab", {"a": "1"}), ("model.vocab", {"a": -1}),
        ("model.vocab", {**model["vocab"], "zz": 0}), ("model.vocab", {"a": 2**40}),
        ("model.type", 5), ("model.ignore_merges", "yes"),
        ("added_tokens", "x"), ("added_tokens", ["x"]), ("added_tokens", [5]),
        ("added_tokens", [*added, {**added[0], "content": "", "id": 600}]),
        ("added_tokens", [*added, {**added[0], "content": "<x>", "id": -1}]),
        ("added_tokens", [*added, {**added[0], "content": "<x>", "id": "600"}]),
        ("added_tokens", [*added, {**added[0], "content": "<x>", "id": 2**40}]),
        ("added_tokens", [*added, {**added[0], "content": "<x>", "id": 600, "special": "no"}]),
        ("normalizer", "NFC"), ("normalizer", {"type": 5}), ("normalizer", {"normalizers": 5}),
        ("pre_tokenizer", "ByteLevel"), ("pre_tokenizer", {"type": "Sequence"}),
        ("pre_tokenizer", json.loads(split.replace('"Regex": "', '"Regex": "(?<'))),
        ("pre_tokenizer", json.loads(split.replace('"Regex"', '"String"'))),
        ("decoder", "ByteLevel"), ("post_processor", "x"), ("post_processor", {"type": 5}),
        (None, []), (None, "x"), (None, 5),
    ]  # fmt: skip


@given(data=st.data())
def test_tokenizer_json_corrupted(tokenizers, data):
    name = data.draw(st.sampled_from(sorted(tokenizers)), "fixture")
    with copy_of(name) as directory:
        spec = read_json(directory / "tokenizer.json")
        key, value = data.draw(st.sampled_from(tokenizer_corruptions(spec)), "corruption")
        if key is None:
            spec = value
        elif key.startswith("model."):
            spec["model"][key[len("model.") :]] = value
        else:
            spec[key] = value
        write_json(directory / "tokenizer.json", spec)
        tokenizer_outcome(directory, tokenizers[name], ["tokenizer.json"])


HOSTILE_TEMPLATES = [
    "{{ 1/0 }}",
    "{{ 1 // 0 }}",
    "{% macro f(x) %}{{ f(x) }}{% endmacro %}{{ f(1) }}",
    "{{ 'x' * 10**10 }}",
    "{{ ['x'] * 10**10 }}",
    "{{ 10 ** 10 ** 10 }}",
    "{% set s = namespace(x='ab') %}{% for i in range(64) %}{% set s.x = s.x ~ s.x %}{% endfor %}",
    "{% set s = namespace(x='ab') %}{% for i in range(64) %}{% set s.x = s.x + s.x %}{% endfor %}",
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
    "{{ 'x'.ljust(10**10) }}",
    "{{ 'x'|center(10**10) }}",
    "{{ messages[5] }}{{ messages.x.y }}",
    "{{ messages[0]['content'] + 5 }}",
    "{{ raise_exception('no') }}",
    "{{ messages.__class__ }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{% for m in messages %}{{ m.content|int / 0 }}{% endfor %}",
    "{{ '%s' % (1, 2) }}",
    "{{ 'x'|indent(10**10) }}",
    "{{ strftime_now(5) }}",
    "{{ messages|tojson(indent=10**9) }}",
    "{% for",
    5,
    2.5,
    True,
    {"default": 5},
    {"a": "b"},
    ["a", "b"],
    [{"name": "default"}],
    [{"name": "default", "template": 5}],
    [{"template": "x"}],
]


@given(data=st.data())
def test_chat_templates_from_strangers(tokenizers, data):
    name = data.draw(st.sampled_from(sorted(tokenizers)), "fixture")
    template = data.draw(
        st.one_of(st.sampled_from(HOSTILE_TEMPLATES), st.text(max_size=40)), "template"
    )
    with copy_of(name) as directory:
        (directory / "chat_template.jinja").unlink(missing_ok=True)
        config = read_json(directory / "tokenizer_config.json")
        config["chat_template"] = template
        write_json(directory / "tokenizer_config.json", config)

        def render():
            tok = BPETokenizer.from_pretrained(directory)
            return tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)

        text, error = outcome(directory, render)
        if error is None:
            assert isinstance(text, str) and len(text) <= chat_template.MAX_OUTPUT
        else:
            assert_names_file(error, directory, ["tokenizer_config.json"])


# --- GGUF files: the metadata corrupted ----------------------------------------------------------

GGUF = HF.parent / "gguf"
GGUF_TOKENIZERS = HF.parent / "tokenizers" / "gguf"
GGUF_COUNTS = ["block_count", "embedding_length", "feed_forward_length", "attention.head_count",
               "attention.head_count_kv", "context_length"]  # fmt: skip


def gguf_value(path: Path, key: str) -> tuple[int, int]:
    """(offset, size) in the file of a metadata key's value (a scalar)."""
    gguf = pytest.importorskip("gguf")
    reader = gguf.GGUFReader(path)
    field = reader.fields[key]
    part = field.parts[field.data[0]]
    offset = part.ctypes.data - reader.data.ctypes.data
    del reader  # the memory map closes before the file is written
    return offset, part.nbytes


@given(data=st.data())
def test_gguf_files_with_corrupted_metadata(data):
    pytest.importorskip("gguf")
    blocks = [GGUF / f"llama-{kind}.gguf" for kind in ("Q4_1", "Q4_K", "Q5_K", "Q6_K")]
    files = [
        GGUF / "llama-F32.gguf",
        GGUF / "qwen2-F16.gguf",
        *blocks,
        *GGUF_TOKENIZERS.glob("*.gguf"),
    ]
    source = data.draw(st.sampled_from(sorted(files)), "file")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / source.name
        raw = bytearray(source.read_bytes())
        how = data.draw(st.sampled_from(["flip", "truncate", "value"]), "how")
        if how == "flip":  # bytes of the header and metadata (the tensors' data come later)
            for _ in range(data.draw(st.integers(1, 3), "flips")):
                raw[data.draw(st.integers(0, 4000), "byte") % len(raw)] ^= data.draw(
                    st.integers(1, 255), "xor"
                )
        elif how == "truncate":
            raw = raw[: data.draw(st.integers(0, len(raw) - 1), "length")]
        else:
            arch = "qwen2" if "qwen2" in source.name else "llama"
            keys = [f"{arch}.{k}" for k in GGUF_COUNTS] if "tokenizers" not in str(source) else [
                "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id"]  # fmt: skip
            key = data.draw(st.sampled_from(keys), "key")
            path.write_bytes(bytes(raw))
            try:
                offset, size = gguf_value(path, key)
            except KeyError:
                return  # this file has no such key
            value = data.draw(st.sampled_from([0, 2**32 - 1, 3, 2**31]), "value")
            raw[offset : offset + size] = value.to_bytes(8, "little")[:size]
        path.write_bytes(bytes(raw))
        quantize = data.draw(st.sampled_from([None, "gguf"]), "quantize")  # blocks kept or not
        load = (
            BPETokenizer.from_pretrained
            if "tokenizers" in str(source)
            else lambda p: models.from_pretrained(p, quantize=quantize)
        )
        _, error = outcome(path.parent, lambda: load(path))
        if error is not None:
            assert str(path) in str(error), str(error)
