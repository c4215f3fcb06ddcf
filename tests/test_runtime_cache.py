"""Numba's runtime module read from disk (autograd/kernels/_runtime_cache.py).

Each case runs fresh interpreters: the runtime is set up once per process. The function they
compile allocates arrays, returns them and drops references, so it calls every runtime function
(incref, decref, the data pointer); compiled without `cache=True`, it also links against the
runtime module the way every new kernel does.
"""

import json
import os
import pickle
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

USE_RUNTIME = """
    import json
    import numba, numpy as np
    from autograd.kernels import _runtime_cache
    _runtime_cache.install()

    @numba.njit
    def rows(n):
        out = [np.arange(i + 1.0) for i in range(n)]
        keep = out[-1]
        out = None  # decref of every other row
        return keep * 2.0, np.ones(3)

    a, b = rows(4)
    from numba.core.runtime import nrt
    codegen = nrt.rtsys.library.codegen
    print(json.dumps({"made": _runtime_cache.STATE["last"], "a": a.tolist(), "b": b.tolist(),
                      "path": _runtime_cache.cache_path(codegen)}))
"""


def run(code, cache_dir):
    env = {**os.environ, "PYTHONPATH": ROOT, "NUMBA_CACHE_DIR": str(cache_dir)}
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


EXPECTED = {"a": [0.0, 2.0, 4.0, 6.0], "b": [1.0, 1.0, 1.0]}


def test_written_once_then_read(tmp_path):
    first = run(USE_RUNTIME, tmp_path)
    assert first["made"] == "compiled" and os.path.exists(first["path"])
    assert os.path.dirname(first["path"]) == str(tmp_path)
    second = run(USE_RUNTIME, tmp_path)
    assert second["made"] == "loaded" and second["path"] == first["path"]
    for result in (first, second):
        assert {k: result[k] for k in EXPECTED} == EXPECTED


def test_a_bad_file_is_compiled_over(tmp_path):
    path = run(USE_RUNTIME, tmp_path)["path"]
    with open(path, "rb") as f:
        key, state = pickle.load(f)
    for bad in (b"", b"not a pickle", pickle.dumps(("another numba", state))):
        with open(path, "wb") as f:
            f.write(bad)
        result = run(USE_RUNTIME, tmp_path)
        assert result["made"] == "compiled"
        assert {k: result[k] for k in EXPECTED} == EXPECTED
        assert run(USE_RUNTIME, tmp_path)["made"] == "loaded"  # written again, whole


def test_an_unwritable_place_still_runs(tmp_path):
    blocked = tmp_path / "a file, not a folder"
    blocked.write_text("")
    for _ in range(2):
        result = run(USE_RUNTIME, blocked)
        assert result["made"] == "compiled"
        assert {k: result[k] for k in EXPECTED} == EXPECTED


def test_the_kernels_install_it(tmp_path):
    code = """
        import json
        import numpy as np
        from numba.core.runtime import nrtdynmod
        from autograd.kernels import _runtime_cache, rotary
        routed = nrtdynmod.compile_nrt_functions is _runtime_cache._compile_nrt_functions
        print(json.dumps({"routed": routed}))
    """
    assert run(code, tmp_path) == {"routed": True}
