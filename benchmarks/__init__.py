"""glassgrad's benchmark runner: `python -m benchmarks` (or the `glassgrad-bench` script).

Suites: ops (each op forward + backward), kernels (Numba vs numpy reference, compile and
cached-load times), train (one full training step per GPT config) and generate (decode step with
and without the KV cache by context length). Every figure is compared with the numpy reference
path and, when torch is installed (optional), PyTorch eager CPU on the same threads and shapes.
See benchmarks.runner.run_benchmarks for the programmatic entry and docs/benchmarks.md for
the results on the reference machine.
"""

import models  # noqa: E402, F401  (models checks nn and autograd)
from autograd import check_packages  # noqa: E402

check_packages(
    "nn", "models", "benchmarks"
)  # a folder of the same name must not shadow glassgrad's
