"""The ISA's integer arithmetic, shared by the simulators, the compiler and the runtime (numpy only).

Bit-packed rows, how SRAM tiles look in DRAM: element ``j`` of a row occupies bits ``[j*w, (j+1)*w)`` of
the row, little-endian, as signed two's complement (so int4 weights sit two to a byte, low nibble first).
Byte-wide and wider elements are plain little-endian integers, which numpy views without copying.

Two's complement wrap-around at the accumulator width, the ALU ops (SHR's signed shift amount included)
and the row indices a GEMM/ALU loop visits, as the ISA spec's ``loop``, ``alu`` and ``gemm`` semantics
define them.
"""

from __future__ import annotations

import numpy as np

from weft.isa.constants import AluOp

__all__ = ["F32_EXACT", "F64_EXACT", "alu_op", "exact_dtype", "float_dtype_for", "int_dtype", "loop_indices", "pack",
           "requantize", "rq_fields", "rq_layout", "rq_pack", "shift", "unpack", "wrap"]

_WIDE = {8: np.dtype(np.int8), 16: np.dtype("<i2"), 32: np.dtype("<i4")}


def int_dtype(width: int) -> np.dtype:
    """The narrowest numpy signed integer dtype that holds `width`-bit values."""
    for bits, dtype in _WIDE.items():
        if width <= bits:
            return dtype
    raise ValueError(f"no integer dtype for {width}-bit values")


def unpack(raw: np.ndarray, width: int) -> np.ndarray:
    """Bytes (..., nbytes) to signed `width`-bit integers (..., nbytes * 8 // width)."""
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    if width in _WIDE:
        return raw.view(_WIDE[width])
    per = 8 // width
    mask, sign = (1 << width) - 1, 1 << (width - 1)
    shifts = (np.arange(per, dtype=np.uint8) * width).astype(np.uint8)
    fields = ((raw[..., None] >> shifts) & mask).astype(np.int8)
    return ((fields ^ sign) - sign).reshape(*raw.shape[:-1], raw.shape[-1] * per)


def pack(values: np.ndarray, width: int) -> np.ndarray:
    """Signed integers (..., n) to bytes (..., n * width // 8); values must already fit `width` bits."""
    values = np.asarray(values)
    if width in _WIDE:
        return np.ascontiguousarray(values.astype(_WIDE[width])).view(np.uint8)
    per = 8 // width
    if values.shape[-1] % per:
        raise ValueError(f"{values.shape[-1]} elements of {width} bits do not fill whole bytes")
    fields = (values.astype(np.int16) & ((1 << width) - 1)).astype(np.uint8)
    fields = fields.reshape(*values.shape[:-1], values.shape[-1] // per, per)
    shifts = (np.arange(per, dtype=np.uint8) * width).astype(np.uint8)
    return np.bitwise_or.reduce(fields << shifts, axis=-1).astype(np.uint8)


def wrap(values: np.ndarray, width: int) -> np.ndarray:
    """int64 values reduced modulo 2**width into the signed `width`-bit range (two's complement wrap)."""
    if width in _WIDE:
        return values.astype(_WIDE[width]).astype(np.int64)
    half = 1 << (width - 1)
    return ((values + half) & ((1 << width) - 1)) - half


def loop_indices(base: np.ndarray, n_out: int, n_in: int, f_out: int, f_in: int) -> np.ndarray:
    """Row index of every execution, in execution order: ``base[k] + i*f_out + j*f_in`` for i, j, k."""
    offsets = (np.arange(n_out, dtype=np.int64)[:, None] * f_out
               + np.arange(n_in, dtype=np.int64)[None, :] * f_in).reshape(-1)
    return (offsets[:, None] + base[None, :]).reshape(-1)


def shift(values: np.ndarray, amount: np.ndarray | int, acc_width: int) -> np.ndarray:
    """SHR: arithmetic right shift by the operand's low log2(acc_width)+1 bits read as signed; a negative
    amount shifts left (wrapping at acc_width)."""
    bits = acc_width.bit_length()  # log2(acc_width) + 1
    mask, sign = (1 << bits) - 1, 1 << (bits - 1)
    amount = ((np.asarray(amount, dtype=np.int64) & mask) ^ sign) - sign
    right = values >> np.maximum(amount, 0)
    left = wrap(values << np.maximum(-amount, 0), acc_width)
    return np.where(amount >= 0, right, left)


def rq_layout(acc_width: int) -> tuple[int, int]:
    """RQ's operand fields: (multiplier bits, shift bits). The multiplier is the operand's low
    ``acc_width // 2 + 2`` bits, signed (18 for 32-bit accumulators: a DSP48's narrow port); the shift the next
    ``log2(acc_width) + 1`` bits, unsigned; the bit after them asks for ReLU."""
    return acc_width // 2 + 2, acc_width.bit_length()


def rq_fields(b: np.ndarray | int, acc_width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """RQ's operand unpacked: (signed multiplier, shift, relu flag), int64 arrays."""
    mul_bits, shift_bits = rq_layout(acc_width)
    b = np.asarray(b, dtype=np.int64)
    sign = 1 << (mul_bits - 1)
    m = ((b & ((1 << mul_bits) - 1)) ^ sign) - sign
    s = (b >> mul_bits) & ((1 << shift_bits) - 1)
    relu = (b >> (mul_bits + shift_bits)) & 1
    return m, s, relu


def rq_pack(m: np.ndarray | int, s: np.ndarray | int, relu: np.ndarray | int | bool, acc_width: int) -> np.ndarray:
    """RQ operands (int64) from per-channel multipliers, shifts and ReLU flags; raises ValueError when a field
    does not fit."""
    mul_bits, shift_bits = rq_layout(acc_width)
    m, s, relu = (np.asarray(v, dtype=np.int64) for v in (m, s, relu))
    if np.any(m < -(1 << (mul_bits - 1))) or np.any(m >= 1 << (mul_bits - 1)):
        raise ValueError(f"an RQ multiplier outside {mul_bits} signed bits")
    if np.any(s < 0) or np.any(s >= 1 << shift_bits):
        raise ValueError(f"an RQ shift outside [0, {(1 << shift_bits) - 1}]")
    packed = (m & ((1 << mul_bits) - 1)) | (s << mul_bits) | ((relu != 0).astype(np.int64) << (mul_bits + shift_bits))
    return wrap(packed, acc_width)  # at 16 bits the ReLU flag is the sign bit


def requantize(a: np.ndarray, b: np.ndarray | int, acc_width: int) -> np.ndarray:
    """RQ: ``(a * m + 2**(s-1)) >> s`` (round half up, the product exact), wrapped at acc_width, then
    ``max(., 0)`` where the operand's ReLU bit is set (:func:`rq_fields` unpacks m, s and the flag).
    |a * m| < 2**48 and the rounding constant < 2**62, so int64 holds every intermediate."""
    m, s, relu = rq_fields(b, acc_width)
    rounding = np.where(s > 0, np.left_shift(1, np.maximum(s - 1, 0)), 0)
    out = wrap((np.asarray(a, dtype=np.int64) * m + rounding) >> s, acc_width)
    return np.where(relu != 0, np.maximum(out, 0), out)


def alu_op(op: int, a: np.ndarray, b: np.ndarray | int, acc_width: int) -> np.ndarray:
    """One ALU op (AluOp) on int64 accumulator values `a` and operands `b`, wrapped at acc_width."""
    if op == AluOp.RQ:
        return requantize(a, b, acc_width)
    if op == AluOp.MOV:
        return np.broadcast_to(np.asarray(b, dtype=np.int64), np.shape(a)).copy()
    if op == AluOp.MIN:
        return np.minimum(a, b)
    if op == AluOp.MAX:
        return np.maximum(a, b)
    if op == AluOp.ADD:
        return wrap(a + b, acc_width)
    if op == AluOp.SHR:
        return shift(a, b, acc_width)
    return wrap(a * b, acc_width)  # MUL: |a|, |b| < 2^31, so the int64 product is exact


#: Integers up to these magnitudes (and every partial sum of them) are exact in float32 / float64.
F32_EXACT = 1 << 24
F64_EXACT = 1 << 53


def exact_dtype(bound: int) -> np.dtype | None:
    """The float dtype in which integer sums of magnitude up to `bound` are exact, or None."""
    if bound <= F32_EXACT:
        return np.dtype(np.float32)
    if bound <= F64_EXACT:
        return np.dtype(np.float64)
    return None


def float_dtype_for(terms: int, inp_width: int, wgt_width: int) -> np.dtype | None:
    """The float dtype in which a sum of `terms` products is exact, or None if neither is."""
    return exact_dtype(terms << (inp_width + wgt_width - 2))  # |(-2^(a-1)) * (-2^(b-1))| per term
