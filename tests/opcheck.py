"""The one helper every op test uses: forward vs numpy, backward vs central differences."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

import autograd
from autograd import Tensor

MAX_REL_ERROR = 1e-6  # the property suite's bar for |analytic - numeric| / max(1, |values|)


def check_op(
    op: Callable[..., Tensor],
    reference: Callable[..., np.ndarray] | None,
    arrays: Sequence[np.ndarray],
    differentiable: Sequence[bool] | None = None,
    forward_rtol: float = 1e-10,
    eps: float | None = None,
) -> None:
    """Check `op` (Tensors -> Tensor) on float64 copies of `arrays`.

    Forward: equal to `reference` (the same maths written with plain numpy) within forward_rtol.
    Backward: every input marked differentiable is gradchecked against central differences and
    the worst relative error must be <= MAX_REL_ERROR. The default step grows with the inputs'
    magnitude, 1e-6 * max(1, |x|)^(1/3), balancing rounding error in L (which grows with |x|)
    against truncation error (which grows with the step): at |x| ~ 1e3 the step is 1e-5.
    """
    autograd.set_default_dtype(np.float64)
    differentiable = differentiable or [True] * len(arrays)
    inputs = [
        Tensor(np.array(a, dtype=np.float64), requires_grad=d) if d else a
        for a, d in zip(arrays, differentiable, strict=True)
    ]
    out = op(*inputs)
    assert out.dtype == np.float64, f"float64 in, {out.dtype} out"
    if reference is not None:
        expected = reference(*[np.array(a, dtype=np.float64) for a in arrays])
        np.testing.assert_allclose(out.data, expected, rtol=forward_rtol, atol=forward_rtol)
    tensors = [t for t in inputs if isinstance(t, Tensor)]
    if eps is None:
        finite = [np.abs(t.data[np.isfinite(t.data)]) for t in tensors]
        magnitude = max([1.0] + [float(f.max()) for f in finite if f.size])
        eps = 1e-6 * magnitude ** (1 / 3)

    def op_of_tensors(*ts):
        it = iter(ts)
        return op(*[next(it) if isinstance(x, Tensor) else x for x in inputs])

    result = autograd.gradcheck(
        op_of_tensors, tensors, eps=eps, atol=np.inf, rtol=np.inf, raise_exception=False
    )
    assert result.max_rel_error <= MAX_REL_ERROR, str(result)
