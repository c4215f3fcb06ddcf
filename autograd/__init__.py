"""glassgrad's engine: a reverse-mode autodiff Tensor over numpy.

>>> import numpy as np
>>> from autograd import Tensor
>>> x = Tensor(np.ones((2, 3)), requires_grad=True)
>>> y = (x * 2 + 1).sum()
>>> y.backward()
>>> x.grad
array([[2., 2., 2.],
       [2., 2., 2.]], dtype=float32)
"""

from autograd.anomaly import AnomalyError, detect_anomaly
from autograd.compile import TraceError, compile
from autograd.gradcheck import GradcheckError, GradcheckResult, gradcheck, gradgradcheck
from autograd.higher_order import grad, hessian, hvp, jvp, vjp
from autograd.ops import concat, stack, where
from autograd.origin import check_packages
from autograd.tensor import (
    Function,
    Tensor,
    enable_grad,
    get_default_dtype,
    is_grad_enabled,
    no_grad,
    set_default_dtype,
    unbroadcast,
)
from autograd.viz import trace  # noqa: F401  (registers the tracer of backward(trace=True))

__all__ = [
    "AnomalyError",
    "Function",
    "GradcheckError",
    "GradcheckResult",
    "Tensor",
    "TraceError",
    "check_packages",
    "compile",
    "concat",
    "detect_anomaly",
    "enable_grad",
    "get_default_dtype",
    "grad",
    "gradcheck",
    "gradgradcheck",
    "hessian",
    "hvp",
    "is_grad_enabled",
    "jvp",
    "no_grad",
    "set_default_dtype",
    "stack",
    "unbroadcast",
    "vjp",
    "where",
]
