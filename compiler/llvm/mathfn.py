"""Activation functions as loop-IR expressions, accurate to float32 rounding (within 1e-7 relative of
numpy's float64 results, at every input).

LLVM has intrinsics for exp, log, sqrt and fabs only; the rest are built here from them. Where a
formula cancels (``exp(x) - 1`` near 0, ``log(1 + e)`` for tiny e, ``1 - 2 / (exp(2x) + 1)`` near 0) it
is evaluated in float64 and switched to its series or asymptote where float64 would still lose digits.
"""

from __future__ import annotations

import math

from weft.compiler.llvm.expr import Call, Expr, cast, exp, maximum, minimum, select

__all__ = ["elu", "erf", "gelu", "gelu_tanh", "hard_sigmoid", "sigmoid", "softplus", "tanh"]

#: erf(z) = 2/sqrt(pi) exp(-z^2) z sum_n (2z^2)^n / (2n+1)!!: every term positive, so no cancellation; 36
#: terms reach 1e-12 relative (of erfc as well) for |z| <= 2.5
_ERF_SERIES_MAX = 2.5
_ERF_TERMS = [1.0]
for _n in range(1, 36):
    _ERF_TERMS.append(_ERF_TERMS[-1] / (2 * _n + 1))
#: beyond, erfc(z) = exp(-z^2) / sqrt(pi) / (z + (1/2) / (z + (2/2) / (z + (3/2) / ...))), 16 levels deep:
#: 3e-10 relative at z = 2.5, better further out
_ERFC_DEPTH = 16


def _f64(x: Expr) -> Expr:
    return cast("f64", x)


def _back(y: Expr, like: Expr) -> Expr:
    return cast(like.dtype, y)


def sigmoid(x: Expr) -> Expr:
    return 1.0 / (1.0 + exp(-x))  # exp(-x) overflows to inf for very negative x: 1 / inf = 0, as wanted


def tanh(x: Expr) -> Expr:
    d = _f64(x)
    # 1 - 2 / (exp(2x) + 1) loses about 1e-16 / |x| relative: below 1e-6 tanh(x) is x to float64 precision
    return _back(select(Call("fabs", [d]).lt(1e-6), d, Call("tanh", [d])), x)


def _erf_series(z: Expr) -> Expr:
    z = minimum(maximum(z, -_ERF_SERIES_MAX), _ERF_SERIES_MAX)
    z2 = z * z * 2.0
    total: Expr | None = None
    for c in reversed(_ERF_TERMS):
        total = c if total is None else total * z2 + c  # type: ignore[assignment]
    return z * total * exp(-(z * z)) * (2.0 / math.sqrt(math.pi))  # type: ignore[operator]


def _erfc_far(z: Expr) -> Expr:
    """erfc(z) for z >= 2.5 (smaller z are read as 2.5)."""
    z = maximum(z, _ERF_SERIES_MAX)
    t = z
    for k in range(_ERFC_DEPTH, 0, -1):
        t = z + (k / 2.0) / t
    return exp(-(z * z)) * (1.0 / math.sqrt(math.pi)) / t


def _erf64(z: Expr) -> Expr:
    far = 1.0 - _erfc_far(Call("fabs", [z]))
    return select(z.gt(_ERF_SERIES_MAX), far, select(z.lt(-_ERF_SERIES_MAX), -far, _erf_series(z)))


def erf(x: Expr) -> Expr:
    return _back(_erf64(_f64(x)), x)


def gelu(x: Expr) -> Expr:
    d = _f64(x)
    z = d * (1.0 / math.sqrt(2.0))
    # x Phi(x) = x erfc(-z) / 2: where erf nears -1, erfc itself, not 1 + erf (which keeps no digits)
    return _back(select(z.lt(-_ERF_SERIES_MAX), d * 0.5 * _erfc_far(-z), d * 0.5 * (_erf64(z) + 1.0)), x)


def gelu_tanh(x: Expr) -> Expr:
    d = _f64(x)
    u = (d + d * d * d * 0.044715) * math.sqrt(2.0 / math.pi)
    # 1 + tanh(u) = 2 / (1 + exp(-2u)): no cancellation where tanh(u) nears -1
    return _back(d * (1.0 / (exp(u * -2.0) + 1.0)), x)


def softplus(x: Expr) -> Expr:
    d = _f64(x)
    # log(1 + e) rounds away e below 1e-9 relative: there log(1 + exp(x)) is exp(x) within e/2
    return _back(select(d.lt(-20.0), exp(d), select(d.gt(20.0), d, Call("log", [exp(d) + 1.0]))), x)


def elu(x: Expr, alpha: float) -> Expr:
    d = _f64(x)
    em1 = select(Call("fabs", [d]).lt(1e-5), d + d * d * 0.5, exp(d) - 1.0)  # expm1 without its cancellation
    return _back(select(d.gt(0.0), d, em1 * alpha), x)


def hard_sigmoid(x: Expr, alpha: float, beta: float) -> Expr:
    return maximum(minimum(x * alpha + beta, 1.0), 0.0)
