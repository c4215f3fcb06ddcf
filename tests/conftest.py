"""Shared test setup: hypothesis profiles and a clean global state around every test.

Profiles (select with HYPOTHESIS_PROFILE): "ci" (what `make test` and CI run: derandomized, so a red
CI run always means a real bug and reruns identically), "dev" (the default: the same size, random),
"thorough" (many more examples, to run on demand). No deadlines anywhere: the first call of a Numba
kernel compiles it, which would trip a per-example deadline.
"""

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

import autograd
from autograd import kernels

_common = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True)
settings.register_profile("ci", max_examples=25, derandomize=True, **_common)
settings.register_profile("dev", max_examples=25, **_common)
settings.register_profile("thorough", max_examples=400, **_common)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


@pytest.fixture(autouse=True)
def _restore_global_state():
    """Tests may switch the default dtype or kernel backend; never let that leak into the next."""
    dtype, backend = autograd.get_default_dtype(), kernels.get_backend()
    yield
    autograd.set_default_dtype(dtype)
    kernels.set_backend(backend)


@pytest.fixture
def float64():
    """Make float64 the default dtype for this test (central differences need it)."""
    autograd.set_default_dtype(np.float64)
    yield


@pytest.fixture(params=["numba", "numpy"])
def backend(request):
    """Run a test once with the Numba kernels and once with the numpy references."""
    kernels.set_backend(request.param)
    return request.param


# Modules whose command-line tests run a training command with its default --out (runs/...).
_DEFAULT_OUT_MODULES = {"test_encoder", "test_seq2seq"}


@pytest.fixture(autouse=True)
def _default_out_in_tmp(request, monkeypatch):
    """Run those tests in a temporary directory: a run's files never land in the checkout."""
    if request.module.__name__.rpartition(".")[2] in _DEFAULT_OUT_MODULES:
        monkeypatch.chdir(request.getfixturevalue("tmp_path"))


def pytest_terminal_summary(terminalreporter):
    """Say which BLAS kernel this run used: the suite must pass on every one (make test-blas)."""
    terminalreporter.write_line(_blas_kernel())


def _blas_kernel() -> str:
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return "BLAS: threadpoolctl not installed"
    blas = [
        f"{lib.get('internal_api')} {lib.get('version')} kernel {lib.get('architecture')}, "
        f"{lib.get('num_threads')} threads"
        for lib in threadpool_info()
        if lib.get("user_api") == "blas"
    ]
    coretype = os.environ.get("OPENBLAS_CORETYPE", "unset")
    return f"BLAS: {'; '.join(blas) or 'none found'} (OPENBLAS_CORETYPE {coretype})"
