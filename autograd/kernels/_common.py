"""Argument checks and the serial/parallel kernel builder shared by the kernels.

Importing this module never imports Numba; building the first `Kernel` does.
"""

import os
import threading
import types
from contextlib import contextmanager

import numpy as np

FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def float_array(a, kernel, name, dtype=None):
    """`a` as a C-contiguous float32/float64 array; `dtype` casts a companion array to the first."""
    a = np.asarray(a, dtype=dtype, order="C")  # not ascontiguousarray: it makes 0-d arrays 1-d
    if a.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{kernel}: {name} must be float32 or float64, got {a.dtype}")
    return a


def int_array(a, kernel, name):
    """`a` as a C-contiguous int64 array; any other dtype is an error, not a silent cast."""
    a = np.asarray(a)
    if not np.issubdtype(a.dtype, np.integer):
        raise ValueError(f"{kernel}: {name} must be an integer array, got {a.dtype}")
    return np.asarray(a, dtype=np.int64, order="C")


def last_axis(x, kernel, name="x"):
    """Check that `x` has a last axis to reduce over; return the (rows, C) view."""
    if x.ndim < 1:
        raise ValueError(f"{kernel}: {name} must have at least 1 dimension, got shape {x.shape}")
    return x.reshape(int(np.prod(x.shape[:-1])), x.shape[-1])  # not -1: C may be 0


def same_shape(a, b, kernel, names):
    if a.shape != b.shape:
        raise ValueError(
            f"{kernel}: {names[0]} {a.shape} and {names[1]} {b.shape} must have the same shape"
        )


# Numba fastmath flags for the kernels: only "reassoc", which lets LLVM split a long sum into
# vector lanes (2-5x faster reductions; the rounding differs from a left-to-right sum by a few
# ulp, and it is still the same on every run). No "nnan"/"ninf": -inf is how masks are written.
FASTMATH = {"reassoc"}


# Below this many inner-loop iterations a kernel runs its serial build on the calling thread.
# Waking Numba's sleeping workers (see start_threads) costs ~50 us per call, so the parallel build
# only wins from ~2^17 values (softmax forward on a quiet 2-core machine: 66 us serial vs 108 us
# parallel at 2^16, 252 vs 199 us at 2^18). Table in docs/kernels.md ("Serial or parallel");
# tests lower or raise it to force one build.
PARALLEL_MIN_WORK = 1 << 17


class _ThisThread(threading.local):
    # set by the threads of a batch-sharded compiled step (autograd/compile/shard.py)
    serial = False


THIS_THREAD = _ThisThread()


@contextmanager
def serially():
    """The kernels called on this thread inside the block run their serial builds: no Numba
    thread is started or woken (a batch-sharded step's threads; a model's load, which must not
    start Numba's workers before a decode step asks them to poll, see start_threads)."""
    before = THIS_THREAD.serial
    THIS_THREAD.serial = True
    try:
        yield
    finally:
        THIS_THREAD.serial = before


class Kernel:
    """One loop compiled twice: `parallel` (prange spread over Numba's threads) and `serial`.

    Use as a decorator on a function written with `prange`; the serial build runs prange as a plain
    range. Call as ``kernel(work, *args)``, where `work` is roughly the number of inner-loop
    iterations; it picks the build by comparing `work` with PARALLEL_MIN_WORK (read at call time).
    Numba is imported here, on first use, so that importing this module stays Numba-free.
    """

    def __init__(self, fn, fastmath=FASTMATH):
        import numba  # here, not at the top: see the module docstring

        from ._runtime_cache import install

        install()  # before any kernel runs: Numba's runtime module from disk, not compiled

        # A renamed copy of the function: Numba's on-disk cache files are named after the
        # qualified name and do not record the parallel flag, so two builds of one function
        # would load each other's machine code.
        serial = types.FunctionType(
            fn.__code__, fn.__globals__, fn.__name__ + "_serial", fn.__defaults__, fn.__closure__
        )
        serial.__qualname__ = fn.__qualname__ + "_serial"
        self.__doc__ = fn.__doc__
        # error_model="numpy": a division by zero gives inf/NaN as in numpy, instead of a Python
        # ZeroDivisionError check per division, a branch that stops LLVM from vectorising the
        # loop (the GELU forward ran 6x slower with it). nogil: threads of a batch-sharded step
        # run kernels side by side.
        options = {"cache": True, "fastmath": fastmath, "error_model": "numpy", "nogil": True}
        self.parallel = numba.njit(parallel=True, **options)(fn)
        self.serial = numba.njit(parallel=False, **options)(serial)

    def __call__(self, work, *args):
        if work < PARALLEL_MIN_WORK or THIS_THREAD.serial:
            return self.serial(*args)
        start_threads()
        return self.parallel(*args)


# OpenMP runtimes that, once loaded by another library (PyTorch brings its own libgomp.so.1),
# would run Numba's parallel loops with that library's settings, not ours (see start_threads).
_OPENMP_RUNTIMES = ("libgomp.so.1", "libiomp5.so", "libomp.so")


def openmp_already_loaded() -> bool:
    """Whether an OpenMP runtime is already in this process (dlopen with RTLD_NOLOAD loads
    nothing: it only finds a library that is loaded)."""
    import ctypes

    for name in _OPENMP_RUNTIMES:
        try:
            ctypes.CDLL(name, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        except OSError:
            continue
        return True
    return False


# How long a "spin" worker keeps polling before it sleeps: libgomp's GOMP_SPINCOUNT, in rounds
# of its pause loop (10000: ~0.2 ms of CPU after each loop on the Xeons here).
SPIN_ROUNDS = 10000
_STARTED = {}  # {"wait": how the running workers wait}, once start_threads has run
_START_LOCK = threading.Lock()


def start_threads(wait: str = "sleep") -> str:
    """Start Numba's worker threads; `wait` says what they do between parallel loops. Returns the
    policy in force: the first call in a process decides, later calls change nothing.

    - "sleep" (the default: training, and anything else): the workers sleep at once.
    - "spin": the workers poll for a short while (SPIN_ROUNDS) before they sleep. For decoding
      (DecodeStep asks for it): a token runs ~200 short parallel loops back to back (the
      quantized matrix-vector products), each of which waits ~50 us for sleeping workers to
      wake; polling workers start at once (SmolLM2-135M in Q8_0, 2 threads: 24.5 -> 15.0 ms a
      token). llama.cpp's threads poll the same way between ops.

    The first parallel kernel call does this; call it yourself before anything else starts
    Numba's threads, e.g. numba.set_num_threads(n), which launches them with libgomp's default
    (spinning for long) policy.

    Numba's default "omp" threading layer loads libgomp, whose workers by default spin after each
    parallel loop, waiting for the next. When other processes keep the cores busy, that spinning
    competes with the threads doing the work: a (1024, 384) LayerNorm forward took 8.0 ms instead
    of 0.22 ms (2 threads, load average 3.5). Passive workers sleep at once. libgomp reads
    OMP_WAIT_POLICY and GOMP_SPINCOUNT once, when it is loaded, which numba.get_num_threads()
    does here; the variables are removed again afterwards, so OpenMP runtimes loaded later keep
    their defaults.

    If an OpenMP runtime is already loaded (torch was imported first), that runtime was set up
    without our policy and Numba's loops would end up spinning on it (the tiny training
    step went 22.6 -> 66.8 ms): then Numba's own "workqueue" layer is used instead, whose workers
    always sleep. An explicit NUMBA_THREADING_LAYER or OMP_WAIT_POLICY is left alone.
    """
    if wait not in ("sleep", "spin"):
        raise ValueError(f"start_threads: wait must be 'sleep' or 'spin', got {wait!r}")
    if "wait" in _STARTED:
        return _STARTED["wait"]
    import numba  # here, not at the top: see the module docstring

    with _START_LOCK:  # two threads of a sharded step may get here at once
        if "wait" in _STARTED:
            return _STARTED["wait"]
        if "NUMBA_THREADING_LAYER" not in os.environ and openmp_already_loaded():
            numba.config.THREADING_LAYER = "workqueue"
            wait = "sleep"  # workqueue's workers always sleep
        if "OMP_WAIT_POLICY" in os.environ:
            numba.get_num_threads()
            _STARTED["wait"] = "as OMP_WAIT_POLICY says"
            return _STARTED["wait"]
        policy = {"sleep": {"OMP_WAIT_POLICY": "PASSIVE"}}.get(
            wait, {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": str(SPIN_ROUNDS)}
        )
        saved = {name: os.environ.get(name) for name in policy}
        os.environ.update(policy)
        try:
            numba.get_num_threads()  # launches the threading layer
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
        _STARTED["wait"] = wait
        return wait
