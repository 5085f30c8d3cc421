"""Layer epilogues as integer ALU programs: their meaning, their exact execution, their bounds.

An epilogue is a tuple of steps, each ``(kind, operand)``, applied in order to the accumulator of every
output element in the accelerator's ALU arithmetic: two's complement, wrapping at ``acc_width`` bits.

=============  =======================================================================================
kind           meaning (``acc`` per element, ``c`` its channel)
=============  =======================================================================================
``add_imm``    acc = wrap(acc + imm)
``mul_imm``    acc = wrap(acc * imm)
``shr_imm``    acc = acc >> imm (arithmetic; 0 <= imm < acc_width)
``max_imm``    acc = max(acc, imm)
``min_imm``    acc = min(acc, imm)
``add_vec``    acc = wrap(acc + vec[c])     and likewise ``mul_vec``, ``max_vec``, ``min_vec``
``rq_vec``     acc = relu?(wrap((acc * m[c] + 2**(s[c]-1)) >> s[c])): the ALU's RQ, one pass; vec[c] packs
               m, s and the ReLU flag (:func:`weft.isa.arith.rq_pack`), the product is exact
``residual``   r = sign-extended residual input; r = run(operand steps, r); acc = wrap(acc + r)
=============  =======================================================================================

Immediates fit the ALU instruction's signed ``imm`` field; vectors hold one acc_width integer per
(padded) output channel and are loaded by the back end as accumulator rows. After the last step the
layer's output is the saturating narrowing ``clip(acc, -2**(out_width-1), 2**(out_width-1)-1)``, as the
accelerator writes ``out[dst]``.

:func:`bounds` propagates per-channel intervals through the steps and raises :class:`EpilogueOverflow`
when a step could leave the accumulator range, which is how the quantizer proves its requantization
never wraps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from weft.isa.arith import requantize, rq_fields, shift, wrap

__all__ = [
    "KINDS", "EpilogueOverflow", "Step", "bounds", "check_steps", "narrow", "pad_steps", "run_steps",
]

Step = tuple[str, Any]
#: The ALU operation behind each step kind.
KINDS = {
    "add_imm": "ADD", "mul_imm": "MUL", "shr_imm": "SHR", "max_imm": "MAX", "min_imm": "MIN",
    "add_vec": "ADD", "mul_vec": "MUL", "max_vec": "MAX", "min_vec": "MIN", "residual": "ADD",
    "rq_vec": "RQ",
}


class EpilogueOverflow(ArithmeticError):
    """An epilogue step whose result may leave the accumulator range."""


def _operand(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return value.astype(np.int64)  # broadcasts along the last (channel) axis
    return int(value)


def run_steps(acc: np.ndarray, steps: Sequence[Step], acc_width: int, residual: np.ndarray | None = None
              ) -> np.ndarray:
    """Apply `steps` to int64 accumulators with channels on the last axis; exact ALU semantics."""
    acc = acc.astype(np.int64, copy=True)
    for kind, operand in steps:
        if kind == "residual":
            if residual is None:
                raise ValueError("a residual step needs the residual input")
            acc = wrap(acc + run_steps(residual, operand, acc_width), acc_width)
            continue
        v = _operand(operand)
        op = KINDS[kind]
        if op == "ADD":
            acc = wrap(acc + v, acc_width)
        elif op == "MUL":
            acc = wrap(acc * v, acc_width)
        elif op == "SHR":
            acc = shift(acc, v, acc_width)
        elif op == "RQ":
            acc = requantize(acc, v, acc_width)
        elif op == "MAX":
            acc = np.maximum(acc, v)
        else:
            acc = np.minimum(acc, v)
    return acc


def narrow(acc: np.ndarray, out_width: int) -> np.ndarray:
    """The saturating narrowing the accelerator applies when it writes an output row."""
    lo, hi = -(1 << (out_width - 1)), (1 << (out_width - 1)) - 1
    return np.clip(acc, lo, hi).astype(np.int8 if out_width <= 8 else np.int16 if out_width <= 16 else np.int32)


def bounds(steps: Sequence[Step], lo: np.ndarray, hi: np.ndarray, acc_width: int,
           residual: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel [lo, hi] of the accumulator after `steps`, given it on entry (int64 arrays or
    scalars). Raises EpilogueOverflow naming the step if any intermediate may leave the acc range."""
    top = (1 << (acc_width - 1)) - 1
    bottom = -(1 << (acc_width - 1))
    lo, hi = np.asarray(lo, dtype=object), np.asarray(hi, dtype=object)  # Python ints: no int64 overflow
    for k, (kind, operand) in enumerate(steps):
        if kind == "residual":
            if residual is None:
                raise ValueError("a residual step needs the residual's bounds")
            rlo, rhi = bounds(operand, residual[0], residual[1], acc_width)
            lo, hi = lo + rlo, hi + rhi
        else:
            v = np.asarray(operand, dtype=object) if isinstance(operand, np.ndarray) else int(operand)
            op = KINDS[kind]
            if op == "ADD":
                lo, hi = lo + v, hi + v
            elif op == "MUL":
                a, b = lo * v, hi * v
                lo, hi = np.minimum(a, b), np.maximum(a, b)
            elif op == "SHR":
                lo, hi = lo >> v, hi >> v
            elif op == "RQ":
                lo, hi = _rq_bounds(lo, hi, operand, acc_width)
            elif op == "MAX":
                lo, hi = np.maximum(lo, v), np.maximum(hi, v)
            else:
                lo, hi = np.minimum(lo, v), np.minimum(hi, v)
        worst_lo, worst_hi = int(np.min(lo)), int(np.max(hi))
        if worst_lo < bottom or worst_hi > top:
            raise EpilogueOverflow(
                f"step {k} ({kind}) may reach [{worst_lo}, {worst_hi}], beyond the {acc_width}-bit accumulator"
            )
    return np.asarray(lo, dtype=np.int64), np.asarray(hi, dtype=np.int64)


def _rq_bounds(lo: Any, hi: Any, packed: np.ndarray, acc_width: int) -> tuple[np.ndarray, np.ndarray]:
    """RQ on per-channel intervals, before the wrap (which :func:`bounds` then checks against): the
    rounded shift of a product is monotonic in it, so the ends map to the ends."""
    m, s, relu = (np.asarray(v, dtype=object) for v in rq_fields(packed, acc_width))
    a, b = lo * m, hi * m
    rounding = np.asarray([(1 << int(k)) >> 1 for k in np.ravel(s)], dtype=object).reshape(np.shape(s))
    shifts = s.astype(object)
    new_lo = (np.minimum(a, b) + rounding) // (2 ** shifts)
    new_hi = (np.maximum(a, b) + rounding) // (2 ** shifts)
    relu = relu.astype(bool)
    return np.where(relu, np.maximum(new_lo, 0), new_lo), np.where(relu, np.maximum(new_hi, 0), new_hi)


def check_steps(steps: Sequence[Step], channels: int, acc_width: int, imm_range: tuple[int, int]) -> None:
    """Raise ValueError unless `steps` is a well-formed epilogue for `channels` output channels."""
    acc_lo, acc_hi = -(1 << (acc_width - 1)), (1 << (acc_width - 1)) - 1
    if not isinstance(steps, tuple):
        raise ValueError(f"an epilogue is a tuple of steps, got {type(steps).__name__}")
    for k, step in enumerate(steps):
        if not (isinstance(step, tuple) and len(step) == 2 and step[0] in KINDS):
            raise ValueError(f"step {k} is not a (kind, operand) pair with kind in {sorted(KINDS)}: {step!r}")
        kind, operand = step
        if kind == "residual":
            check_steps(operand, channels, acc_width, imm_range)
        elif kind.endswith("_imm"):
            if not isinstance(operand, int):
                raise ValueError(f"step {k} ({kind}) needs an integer immediate, got {operand!r}")
            lo, hi = (0, acc_width - 1) if kind == "shr_imm" else imm_range
            if not lo <= operand <= hi:
                raise ValueError(f"step {k} ({kind}) immediate {operand} is outside [{lo}, {hi}]")
        else:
            if not isinstance(operand, np.ndarray) or operand.shape != (channels,) \
                    or not np.issubdtype(operand.dtype, np.integer):
                shape = getattr(operand, "shape", None)
                raise ValueError(f"step {k} ({kind}) needs an integer vector of {channels} channels, got {shape}")
            if operand.size and (int(operand.min()) < acc_lo or int(operand.max()) > acc_hi):
                raise ValueError(f"step {k} ({kind}) has values outside the {acc_width}-bit accumulator range")


def pad_steps(steps: Sequence[Step], length: int) -> tuple[Step, ...]:
    """The steps with every vector zero-padded to `length` channels (padded channels stay zero)."""
    out: list[Step] = []
    for kind, operand in steps:
        if kind == "residual":
            out.append((kind, pad_steps(operand, length)))
        elif isinstance(operand, np.ndarray):
            padded = np.zeros(length, dtype=operand.dtype)
            padded[: operand.shape[0]] = operand
            out.append((kind, padded))
        else:
            out.append((kind, operand))
    return tuple(out)
