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

#: erf(x) = 2/sqrt(pi) exp(-x^2) x sum_n (2x^2)^n / (2n+1)!!: every term positive, so no cancellation;
#: 49 terms reach float64 rounding for |x| <= 4, and beyond 4, erf is 1 within 1.6e-8
_ERF_CLAMP = 4.0
_ERF_TERMS = [1.0]
for _n in range(1, 49):
    _ERF_TERMS.append(_ERF_TERMS[-1] / (2 * _n + 1))


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


def _erf64(d: Expr) -> Expr:
    d = minimum(maximum(d, -_ERF_CLAMP), _ERF_CLAMP)
    z = d * d
    z2 = z * 2.0
    total: Expr | None = None
    for c in reversed(_ERF_TERMS):
        total = c if total is None else total * z2 + c  # type: ignore[assignment]
    return d * total * exp(-z) * (2.0 / math.sqrt(math.pi))  # type: ignore[operator]


def erf(x: Expr) -> Expr:
    return _back(_erf64(_f64(x)), x)


def gelu(x: Expr) -> Expr:
    d = _f64(x)
    # x Phi(x); below the series' range 1 + erf only keeps the clamp's error: there Phi(x) is its asymptotic
    # series phi(x) / |x| (1 - 1/x^2 + 3/x^4 - ...), whose 12 terms leave 3e-7 relative at the switch
    inv = 1.0 / (d * d)
    tail: Expr | None = None
    for n in reversed(range(12)):
        c = float((-1) ** n * math.prod(range(1, 2 * n, 2)))
        tail = c if tail is None else tail * inv + c  # type: ignore[assignment]
    far = -exp(d * d * -0.5) * (1.0 / math.sqrt(2.0 * math.pi)) * tail  # type: ignore[operator]
    near = d * 0.5 * (_erf64(d * (1.0 / math.sqrt(2.0))) + 1.0)
    return _back(select(d.lt(-_ERF_CLAMP * math.sqrt(2.0)), far, near), x)


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
