"""Checkpoint I/O: the safetensors format by hand, clear errors for bad files, atomic saves, and
train -> save -> reload in a fresh process with bit-identical outputs."""

import errno
import json
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import autograd.functional as F
import nn
from nn import checkpoint

REPO = Path(__file__).resolve().parent.parent


def make_file(header: dict, data: bytes, pad: bool = False) -> bytes:
    """A safetensors file assembled independently of nn.checkpoint (as another writer would)."""
    encoded = json.dumps(header).encode()
    if pad:
        encoded += b" " * (-len(encoded) % 8)
    return len(encoded).to_bytes(8, "little") + encoded + data


# --- the format -------------------------------------------------------------------------------

DTYPES = [np.float32, np.float64, np.float16, np.int64, np.int32, np.uint8, np.bool_]


@settings(deadline=None)
@given(
    dtypes=st.lists(st.sampled_from(DTYPES), min_size=0, max_size=4),
    shapes=st.lists(st.lists(st.integers(0, 4), max_size=3), min_size=4, max_size=4),
    seed=st.integers(0, 1000),
)
def test_roundtrip_every_dtype_and_shape(tmp_path_factory, dtypes, shapes, seed):
    rng = np.random.default_rng(seed)
    arrays = {
        f"t{i}.w": (rng.normal(size=shape) * 50).astype(dtype)
        for i, (dtype, shape) in enumerate(zip(dtypes, shapes, strict=False))
    }
    path = tmp_path_factory.mktemp("rt") / "x.safetensors"
    nn.save_safetensors(path, arrays, metadata={"step": "7"})
    loaded, metadata = nn.load_safetensors(path)
    assert metadata == {"step": "7"} and list(loaded) == list(arrays)
    for name, array in arrays.items():
        assert loaded[name].dtype == array.dtype and loaded[name].shape == array.shape
        np.testing.assert_array_equal(loaded[name], array)


def test_byte_layout_matches_the_spec(tmp_path):
    path = tmp_path / "a.safetensors"
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.array([1, -2], dtype=np.int64)
    nn.save_safetensors(path, {"a": a, "b": b}, metadata={"k": "v"})
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    assert n % 8 == 0  # data buffer aligned
    header = json.loads(raw[8 : 8 + n])
    assert header == {
        "__metadata__": {"k": "v"},
        "a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
        "b": {"dtype": "I64", "shape": [2], "data_offsets": [24, 40]},
    }
    assert raw[8 + n :] == a.astype("<f4").tobytes() + b.astype("<i8").tobytes()


def test_non_contiguous_and_big_endian_inputs(tmp_path):
    path = tmp_path / "a.safetensors"
    base = np.arange(12, dtype=np.float64).reshape(3, 4)
    arrays = {"t": base.T, "be": np.arange(3, dtype=">i4"), "s": np.float64(2.5)}
    nn.save_safetensors(path, arrays)
    loaded, metadata = nn.load_safetensors(path)
    assert metadata == {}
    np.testing.assert_array_equal(loaded["t"], base.T)
    np.testing.assert_array_equal(loaded["be"], [0, 1, 2])
    assert loaded["be"].dtype == np.int32 and loaded["s"].shape == ()


def test_reads_files_from_other_writers_including_bf16(tmp_path):
    # Unpadded header, entries out of offset order, a BF16 tensor (read as float32).
    values = np.array([1.5, -2.0, 3.140625], dtype=np.float32)
    bf16 = (values.view(np.uint32) >> 16).astype("<u2")
    ints = np.array([7, 8], dtype="<i4")
    header = {
        "ints": {"dtype": "I32", "shape": [2], "data_offsets": [6, 14]},
        "w": {"dtype": "BF16", "shape": [3], "data_offsets": [0, 6]},
    }
    path = tmp_path / "hf.safetensors"
    path.write_bytes(make_file(header, bf16.tobytes() + ints.tobytes()))
    loaded, _ = nn.load_safetensors(path)
    assert loaded["w"].dtype == np.float32
    np.testing.assert_array_equal(loaded["w"], values)
    np.testing.assert_array_equal(loaded["ints"], [7, 8])


def test_unsupported_dtype_and_bad_names_are_refused(tmp_path):
    with pytest.raises(TypeError, match="'c' has dtype complex128"):
        nn.save_safetensors(tmp_path / "x", {"c": np.ones(2, complex)})
    with pytest.raises(ValueError, match="invalid tensor name"):
        nn.save_safetensors(tmp_path / "x", {"__metadata__": np.ones(2)})
    with pytest.raises(TypeError, match="metadata must map str to str"):
        nn.save_safetensors(tmp_path / "x", {}, metadata={"step": 3})
    assert list(tmp_path.iterdir()) == []


# --- bad files give clear errors ---------------------------------------------------------------


class Boom:
    """Unpickling this would create a file: the proof that loading never runs code."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


def good_file(tmp_path) -> bytes:
    path = tmp_path / "good.safetensors"
    nn.save_safetensors(path, {"a": np.ones((4, 4), np.float32), "b": np.zeros(3, np.int64)})
    return path.read_bytes()


def bad_files(tmp_path):
    good = good_file(tmp_path)
    n = int.from_bytes(good[:8], "little")
    entry = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
    return {
        "empty": (b"", "too short"),
        "tiny": (b"abc", "too short"),
        "truncated data": (good[:-5], "truncated"),
        "truncated header": (good[: 8 + n // 2], "truncated"),
        "trailing data": (good + b"\0" * 8, "trailing data"),
        "pickle": (pickle.dumps(Boom(tmp_path / "pwned")), "not a safetensors file"),
        "json text": (b'{"a": 1, "b": [1, 2, 3]}' * 4, "not a safetensors file"),
        "npy": (b"\x93NUMPY\x01\x00v\x00{'descr': '<f8'}" + b" " * 100, "not a safetensors"),
        "header not json": ((2).to_bytes(8, "little") + b"\xff\xfe", "not valid JSON"),
        "header not object": (make_file([1, 2], b""), "not a JSON object"),
        "bad dtype": (make_file({"a": {**entry, "dtype": "F8"}}, b"\0" * 8), "unsupported dtype"),
        "bad shape": (make_file({"a": {**entry, "shape": [-2]}}, b"\0" * 8), "invalid shape"),
        "size mismatch": (make_file({"a": {**entry, "shape": [3]}}, b"\0" * 8), "needs 12 bytes"),
        "gap": (
            make_file({"a": {**entry, "data_offsets": [4, 12]}}, b"\0" * 12),
            "starts at byte 4, expected 0",
        ),
        "overlap": (
            make_file({"a": entry, "b": entry}, b"\0" * 8),
            "starts at byte 0, expected 8",
        ),
        "missing field": (make_file({"a": {"dtype": "F32"}}, b""), "malformed header entry"),
        "bad metadata": (make_file({"__metadata__": {"a": 1}}, b""), "__metadata__ must map"),
    }


def test_bad_files_raise_checkpoint_error(tmp_path):
    for label, (content, fragment) in bad_files(tmp_path).items():
        path = tmp_path / f"{label}.safetensors"
        path.write_bytes(content)
        with pytest.raises(nn.CheckpointError, match=fragment) as info:
            nn.load_safetensors(path)
        assert str(path) in str(info.value), label
        assert isinstance(info.value, ValueError)
    assert not (tmp_path / "pwned").exists()


# --- atomic saves -------------------------------------------------------------------------------


def test_failed_save_leaves_previous_checkpoint_and_no_temp_file(tmp_path, monkeypatch):
    path = tmp_path / "model.safetensors"
    old = {"w": np.arange(1000, dtype=np.float32)}
    nn.save_safetensors(path, old)
    new = {"w": np.zeros(1000, np.float32), "v": np.ones(5000, np.float32)}

    real_fdopen = os.fdopen

    class DiskFull:
        """A file that accepts the first 100 bytes, then fails as a full disk does."""

        def __init__(self, f):
            self.f, self.written = f, 0

        def write(self, data):
            size = memoryview(data).nbytes
            if self.written + size > 100:
                raise OSError(errno.ENOSPC, "No space left on device")
            self.written += size
            return self.f.write(data)

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    monkeypatch.setattr(checkpoint.os, "fdopen", lambda *a: DiskFull(real_fdopen(*a)))
    with pytest.raises(OSError, match="No space left"):
        nn.save_safetensors(path, new)
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == ["model.safetensors"]
    np.testing.assert_array_equal(nn.load_safetensors(path)[0]["w"], old["w"])

    # A failure at the very end (fsync) or an interrupt behaves the same.
    for error in (OSError(errno.EIO, "I/O error"), KeyboardInterrupt()):

        def fail(fd, error=error):
            raise error

        monkeypatch.setattr(checkpoint.os, "fsync", fail)
        with pytest.raises(type(error)):
            nn.save_safetensors(path, new)
        monkeypatch.undo()
        assert [p.name for p in tmp_path.iterdir()] == ["model.safetensors"]
        np.testing.assert_array_equal(nn.load_safetensors(path)[0]["w"], old["w"])


def test_save_json_atomic(tmp_path, monkeypatch):
    path = tmp_path / "config.json"
    nn.save_json_atomic(path, {"n_layer": 2, "name": "tiny"})
    assert json.loads(path.read_text()) == {"n_layer": 2, "name": "tiny"}
    monkeypatch.setattr(checkpoint.os, "replace", lambda *a: (_ for _ in ()).throw(OSError("x")))
    with pytest.raises(OSError):
        nn.save_json_atomic(path, {"n_layer": 3})
    monkeypatch.undo()
    with pytest.raises(ValueError):
        nn.save_json_atomic(path, {"lr": float("nan")})  # not JSON
    assert json.loads(path.read_text())["n_layer"] == 2
    assert [p.name for p in tmp_path.iterdir()] == ["config.json"]


# --- model + optimizer checkpoints, fresh process ----------------------------------------------

TINY_MODEL = textwrap.dedent(
    """
    import numpy as np
    import nn

    class Tiny(nn.Module):
        def __init__(self, seed):
            super().__init__()
            rng = np.random.default_rng(seed)
            self.wte = nn.Embedding(11, 16, rng=rng)
            self.h = nn.ModuleList(
                [nn.Block(16, 2, rotary=True, max_len=8, rng=rng, n_layer=2) for _ in range(2)]
            )
            self.ln_f = nn.LayerNorm(16)
            self.head = nn.Linear(16, 11, bias=False, rng=rng)

        def forward(self, idx):
            x = self.wte(idx)
            for block in self.h:
                x = block(x)
            return self.head(self.ln_f(x))
    """
)

RELOAD = textwrap.dedent(
    """
    import sys
    import numpy as np
    import autograd
    import nn
    from tiny_model import Tiny

    model = Tiny(seed=999)  # different init: everything must come from the checkpoint
    meta = nn.load_checkpoint(sys.argv[1], model)
    model.eval()
    idx = np.array(meta["probe"])
    with autograd.no_grad():
        logits = model(idx).data
    nn.save_safetensors(sys.argv[2], {"logits": logits})
    """
)


def tiny_setup(tmp_path):
    (tmp_path / "tiny_model.py").write_text(TINY_MODEL)
    namespace: dict = {}
    exec(compile(TINY_MODEL, str(tmp_path / "tiny_model.py"), "exec"), namespace)
    return namespace["Tiny"]


def make_optimizer(model):
    decay = [p for p in model.parameters() if p.ndim >= 2]
    other = [p for p in model.parameters() if p.ndim < 2]
    return nn.optim.AdamW(
        [{"params": decay}, {"params": other, "weight_decay": 0.0}], lr=3e-3, weight_decay=0.1
    )


def train(model, opt, steps, start):
    for step in range(start, start + steps):
        idx = np.random.default_rng(step).integers(0, 11, size=(2, 8))
        logits = model(idx[:, :-1])
        loss = F.cross_entropy(logits, idx[:, 1:])
        opt.zero_grad()
        loss.backward()
        for group in opt.param_groups:
            group["lr"] = nn.optim.cosine_with_warmup(step, 3e-3, 2, 8)
        nn.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()


def test_resume_from_checkpoint_files_is_bit_exact(tmp_path):
    Tiny = tiny_setup(tmp_path)
    straight = Tiny(seed=0)
    train(straight, make_optimizer(straight), 6, 0)

    model = Tiny(seed=0)
    opt = make_optimizer(model)
    train(model, opt, 3, 0)
    nn.save_checkpoint(tmp_path / "ckpt", model, opt, meta={"step": 3})
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [
        "checkpoint.json",
        "model.safetensors",
        "optimizer.safetensors",
    ]
    resumed = Tiny(seed=5)
    opt2 = make_optimizer(resumed)
    assert nn.load_checkpoint(tmp_path / "ckpt", resumed, opt2) == {"step": 3}
    train(resumed, opt2, 3, 3)
    for (name, a), (_, b) in zip(
        straight.named_parameters(), resumed.named_parameters(), strict=True
    ):
        np.testing.assert_array_equal(a.data, b.data, err_msg=name)


def test_train_save_reload_in_fresh_process_gives_identical_outputs(tmp_path):
    Tiny = tiny_setup(tmp_path)
    model = Tiny(seed=0)
    train(model, make_optimizer(model), 4, 0)
    probe = [[1, 2, 3, 4, 5, 6, 7], [10, 9, 8, 7, 6, 5, 4]]
    nn.save_checkpoint(tmp_path / "ckpt", model, meta={"probe": probe})
    model.eval()
    expected = model(np.array(probe)).data
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(tmp_path)])}
    script = tmp_path / "reload.py"
    script.write_text(RELOAD)
    out = tmp_path / "out.safetensors"
    subprocess.run(
        [sys.executable, str(script), str(tmp_path / "ckpt"), str(out)],
        check=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    logits = nn.load_safetensors(out)[0]["logits"]
    assert logits.dtype == expected.dtype == np.float32
    np.testing.assert_array_equal(logits, expected)


def test_load_checkpoint_errors(tmp_path):
    Tiny = tiny_setup(tmp_path)
    model = Tiny(seed=0)
    nn.save_checkpoint(tmp_path / "ckpt", model)
    with pytest.raises(nn.CheckpointError, match="no optimizer state"):
        nn.load_checkpoint(tmp_path / "ckpt", model, make_optimizer(model))
    (tmp_path / "ckpt" / "checkpoint.json").write_text('{"format": "other"}')
    with pytest.raises(nn.CheckpointError, match="not a glassgrad-checkpoint file"):
        nn.load_checkpoint(tmp_path / "ckpt", model)
    nn.save_checkpoint(tmp_path / "small", nn.Linear(16, 11))
    with pytest.raises(KeyError, match="missing keys: wte.weight"):
        nn.load_checkpoint(tmp_path / "small", model)


def test_mixed_files_from_an_interrupted_save_are_detected(tmp_path, monkeypatch):
    Tiny = tiny_setup(tmp_path)
    model = Tiny(seed=0)
    opt = make_optimizer(model)
    train(model, opt, 1, 0)
    nn.save_checkpoint(tmp_path / "ckpt", model, opt, meta={"step": 1})
    before = model.state_dict()
    train(model, opt, 1, 1)
    real = checkpoint.save_json_atomic

    def crash_before_json(path, obj):
        raise KeyboardInterrupt  # killed after the tensors were replaced, before the JSON

    monkeypatch.setattr(checkpoint, "save_json_atomic", crash_before_json)
    with pytest.raises(KeyboardInterrupt):
        nn.save_checkpoint(tmp_path / "ckpt", model, opt, meta={"step": 2})
    monkeypatch.setattr(checkpoint, "save_json_atomic", real)
    fresh = Tiny(seed=1)
    with pytest.raises(nn.CheckpointError, match="model.safetensors does not belong"):
        nn.load_checkpoint(tmp_path / "ckpt", fresh, make_optimizer(fresh))
    untouched = Tiny(seed=1).state_dict()
    for name, value in fresh.state_dict().items():  # nothing was loaded
        np.testing.assert_array_equal(value, untouched[name])
    assert not np.array_equal(untouched["wte.weight"], before["wte.weight"])


_ODD_VALUES = [None, True, 1.5, -1, 2**70, "F32", "", [], ["F32"], {}, {"a": 1}, [1, "2"], [-3, 4]]


def _mutants(valid: bytes, rng: np.random.Generator, count: int):
    """Seeded variants of a valid file: byte flips, truncations, and header entries rewritten
    with values of odd types and odd offsets."""
    n = int.from_bytes(valid[:8], "little")
    header = json.loads(valid[8 : 8 + n])
    data = valid[8 + n :]
    for i in range(count):
        kind = i % 3
        if kind == 0:  # flip 1-3 random bytes anywhere (length prefix, header or data)
            raw = bytearray(valid)
            for _ in range(rng.integers(1, 4)):
                raw[rng.integers(len(raw))] ^= 1 << int(rng.integers(8))
            yield bytes(raw)
        elif kind == 1:
            yield valid[: rng.integers(len(valid))]
        else:
            mutated = json.loads(json.dumps(header))
            name = str(rng.choice([k for k in mutated if k != "__metadata__"]))
            field = str(rng.choice(["dtype", "shape", "data_offsets", "__entry__", "__metadata__"]))
            value = _ODD_VALUES[rng.integers(len(_ODD_VALUES))]
            if field == "__entry__":
                mutated[name] = value
            elif field == "__metadata__":
                mutated["__metadata__"] = value if rng.random() < 0.5 else {"k": value}
            else:
                mutated[name][field] = value
            encoded = json.dumps(mutated).encode()
            yield len(encoded).to_bytes(8, "little") + encoded + data


def test_fuzzed_files_give_checkpoint_errors_naming_the_file(tmp_path):
    """Every malformed file gives a CheckpointError that names the file; nothing else escapes."""
    good = tmp_path / "good.safetensors"
    arrays = {
        "a": np.arange(6, dtype=np.float32).reshape(2, 3),
        "b": np.ones(4, dtype=np.int64),
        "c": np.zeros((), dtype=np.float64),
    }
    nn.save_safetensors(good, arrays, metadata={"step": "3"})
    valid = good.read_bytes()
    path = tmp_path / "mutant.safetensors"
    outcomes = {"error": 0, "loaded": 0}
    for mutant in _mutants(valid, np.random.default_rng(0), 1500):
        path.write_bytes(mutant)
        try:
            loaded, _ = nn.load_safetensors(path)
        except nn.CheckpointError as exc:
            assert str(path) in str(exc)
            outcomes["error"] += 1
            continue
        outcomes["loaded"] += 1  # a flip inside the data, or a harmless one: the file is valid
        for name, array in loaded.items():
            assert isinstance(array, np.ndarray), name
    assert outcomes["error"] > 500 and outcomes["loaded"] > 50, outcomes
