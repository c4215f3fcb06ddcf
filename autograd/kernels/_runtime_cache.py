"""Numba's runtime module, cached on disk beside the kernels' own machine code.

Every kernel calls a few functions of Numba's runtime (NRT: reference counts, the data pointer of
an array's memory), which Numba builds as a small LLVM module and compiles through LLVM's
optimiser and code generator once per process, even when every kernel's machine code comes from
its cache (`cache=True`). Those two passes map ~20 MB of LLVM's code pages into the process, for a
few hundred bytes of output: decoding SmolLM2-135M (Q4_1, 128 tokens) peaked at 253 MB with the
compile and 233 MB with the module read from this cache (docs/benchmarks.md), and the process's
first kernel call is that compile's time faster.

`install()` makes Numba read that module's machine code from a file, which the first process
writes, with the same serialization Numba uses for a cached kernel (object code, plus the
bitcode that later compiles link against). The file is named after what the machine code depends
on (Numba's and llvmlite's versions, the target triple, the CPU and its features), so another
version or machine compiles and writes its own. Anything unreadable is compiled as before; a
cache that cannot be written only costs the saving.
"""

import hashlib
import os
import pickle
import tempfile

import llvmlite
import numba
from numba.core.runtime import nrt, nrtdynmod

_KERNELS_DIR = os.path.dirname(os.path.abspath(__file__))
STATE = {"last": None}  # how the runtime module was made: "compiled" or "loaded" (tests read it)


def _key(codegen) -> str:
    """What the machine code depends on: Numba, llvmlite, and the target (triple, CPU, features)."""
    return repr((numba.__version__, llvmlite.__version__, codegen.magic_tuple()))


def cache_path(codegen) -> str:
    """The file for this Numba, llvmlite and CPU: in NUMBA_CACHE_DIR if set, else in the
    kernels' __pycache__, where Numba keeps their machine code too."""
    digest = hashlib.sha256(_key(codegen).encode()).hexdigest()[:16]
    folder = numba.config.CACHE_DIR or os.path.join(_KERNELS_DIR, "__pycache__")
    return os.path.join(folder, f"numba_runtime-{digest}.nrt")


def _load(codegen, path: str):
    with open(path, "rb") as f:
        key, state = pickle.load(f)
    if key != _key(codegen):
        raise ValueError(f"{path} was written for {key}")
    return codegen.unserialize_library(state)


def _compile_and_save(ctx, path: str):
    ir_module, library = nrtdynmod.create_nrt_module(ctx)
    library.enable_object_caching()  # keep the object code, so that it can be written out
    library.add_ir_module(ir_module)
    library.finalize()
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            pickle.dump((_key(ctx.codegen()), library.serialize_using_object_code()), f)
        os.replace(tmp, path)  # whole or not at all, also with two processes writing at once
    except OSError:
        pass  # a read-only install: compiled, as Numba does, every time
    return library


def _compile_nrt_functions(ctx):
    """Stands in for nrtdynmod.compile_nrt_functions (called once, by rtsys.initialize)."""
    codegen = ctx.codegen()
    path = cache_path(codegen)
    if os.path.exists(path):
        try:
            library = _load(codegen, path)
            STATE["last"] = "loaded"
            return library
        except Exception:  # noqa: BLE001 - a truncated or foreign file: compile and replace it
            pass
    STATE["last"] = "compiled"
    return _compile_and_save(ctx, path)


def install() -> None:
    """Route Numba's runtime compile through the cache; a no-op once the runtime is set up (the
    compile has happened) or when Numba runs without JIT."""
    if nrt.rtsys._init or numba.config.DISABLE_JIT:
        return
    nrtdynmod.compile_nrt_functions = _compile_nrt_functions
