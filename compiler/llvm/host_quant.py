"""Host kernels for the integer layers of quantized graphs, bit-exact with the reference interpreter.

The semantics are :mod:`weft.core.qkernels`: activations in the accelerator's packed layout
``(N/b, C/B, H, W, b, B)`` (padding computed like real data, or zero where the reference packs a logical
tensor), exact integer sums wrapped to ``acc_width`` bits, epilogues in ALU arithmetic
(:mod:`weft.core.epilogue`: wrapping add and multiply, the SHR operand read as the ALU reads it,
signed min/max) and saturating narrowing to ``out_width``. All of it runs in 32-bit integers: wrapping
modulo 2**32 and then to ``acc_width`` equals wrapping the exact sum, for every width up to 32.
``quantize`` divides in float64 and rounds half to even, as numpy does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from weft.compiler.llvm.elementwise import schedule_elementwise
from weft.compiler.llvm.expr import (
    Buffer,
    Call,
    Expr,
    Var,
    cast,
    const,
    dtype_of_numpy,
    maximum,
    minimum,
    row_major_strides,
    select,
)
from weft.compiler.llvm.host_float import constant_tensor
from weft.compiler.llvm.hostplan import Planner, Tensor
from weft.compiler.llvm.layout import PLAIN
from weft.compiler.llvm.target import Target
from weft.compiler.llvm.te import Kernel, Stage, compute, reduce_axis, reduce_max, reduce_sum
from weft.core.errors import UnsupportedError
from weft.core.ir import Node, Value, numpy_dtype
from weft.core.layout import unpack_weights
from weft.core.walker import widths_of
from weft.isa.arith import rq_fields, rq_layout

__all__ = ["QUANT_HANDLERS", "QUANT_OPS"]


@dataclass(frozen=True)
class View:
    """An integer tensor as a kernel reads it: its buffer, logical shape, and packing (None: plain)."""

    buffer: Buffer
    logical: tuple[int, ...]
    tile: tuple[int, int] | None  # (batch, block) of the packed layout

    @property
    def logical4(self) -> tuple[int, int, int, int]:
        s = self.logical
        return (s[0], s[1], 1, 1) if len(s) == 2 else s  # type: ignore[return-value]

    def at(self, idx: Sequence[Expr]) -> Expr:
        """Element at logical (N, C, H, W) indices (2-D tensors: H = W = 0)."""
        if self.tile is None:
            return self.buffer[tuple(idx[: len(self.logical)])]
        b, blk = self.tile
        n, c, h, w = idx
        return self.buffer[n // b, c // blk, h, w, n % b, c % blk]

    def logical_of(self, phys: Sequence[Var]) -> list[Expr]:
        if self.tile is None:
            return list(phys) + [const(0)] * (4 - len(phys))
        b, blk = self.tile
        nb, cb, h, w, bb, cc = phys
        return [nb * b + bb, cb * blk + cc, h, w]

    def inside(self, idx: Sequence[Expr]) -> Expr | None:
        """True where `idx` is a real element (not batch or channel padding)."""
        if self.tile is None:
            return None
        n, c = idx[0], idx[1]
        conds = []
        if self.buffer.shape[0] * self.tile[0] > self.logical4[0]:
            conds.append(n.lt(self.logical4[0]))
        if self.buffer.shape[1] * self.tile[1] > self.logical4[1]:
            conds.append(c.lt(self.logical4[1]))
        if not conds:
            return None
        return conds[0] if len(conds) == 1 else conds[0].logical_and(conds[1])


def _view(p: Planner, name: str, node: Node, buf_name: str) -> tuple[Tensor, View]:
    t = p.get(name, None, node)
    v = p.g.values[name]
    return t, _make_view(buf_name, v, t)


def _make_view(buf_name: str, v: Value, t: Tensor) -> View:
    dtype = dtype_of_numpy(numpy_dtype(v.dtype))
    if v.packed:
        shape = tuple(v.shape)  # type: ignore[arg-type]
        return View(Buffer(buf_name, shape, dtype), tuple(v.logical), (shape[4], shape[5]))  # type: ignore[arg-type]
    return View(Buffer(buf_name, t.physical, dtype), tuple(v.shape or ()), None)  # type: ignore[arg-type]


def _out(p: Planner, node: Node, k: int = 0) -> tuple[Tensor, View]:
    v = p.g.values[node.outputs[k]]
    dtype = dtype_of_numpy(numpy_dtype(v.dtype))
    if v.packed:
        t = p.new(node.outputs[k], tuple(v.logical), PLAIN, dtype)  # type: ignore[arg-type]
        t.storage = tuple(v.shape)  # type: ignore[arg-type]
    else:
        t = p.new(node.outputs[k], tuple(v.shape or ()), PLAIN, dtype)
    return t, _make_view("y", v, t)


# ---- epilogues ---------------------------------------------------------------------------------------------


class Epilogue:
    """An ALU step list as expressions over an i32 accumulator; vector operands become kernel inputs."""

    def __init__(self, steps: Sequence[tuple[str, Any]], acc_width: int, prefix: str = "v"):
        if acc_width > 32:
            raise ValueError(f"accumulators of {acc_width} bits do not fit the host's 32-bit arithmetic")
        self.acc_width = acc_width
        self.buffers: list[Buffer] = []
        self.arrays: list[np.ndarray] = []
        self.steps = self._prepare(steps, prefix)

    def _prepare(self, steps: Sequence[tuple[str, Any]], prefix: str) -> list[tuple[str, Any]]:
        out = []
        for kind, operand in steps:
            if kind == "residual":
                out.append((kind, self._prepare(operand, prefix)))
            elif kind == "rq_vec":
                out.append((kind, self._rq_buffers(operand, prefix)))
            elif isinstance(operand, np.ndarray):
                buf = Buffer(f"{prefix}{len(self.buffers)}", (operand.shape[0],), "i32")
                self.buffers.append(buf)
                self.arrays.append(np.ascontiguousarray(operand.astype(np.int32)))
                out.append((kind, buf))
            else:
                out.append((kind, int(operand)))
        return out

    def _rq_buffers(self, packed: np.ndarray, prefix: str) -> tuple[Buffer, Buffer, Buffer, Buffer]:
        """RQ's per-channel fields as buffers: multiplier (i64), rounding constant (i64), shift (i64) and the
        lower clamp (i32: 0 with ReLU, else the accumulator's least). Shifts past the product's width give
        0, as multiplier 0 and shift 0 do."""
        m, s, relu = rq_fields(packed, self.acc_width)
        mul_bits, _ = rq_layout(self.acc_width)
        vanish = s >= self.acc_width + mul_bits
        m, s = np.where(vanish, 0, m), np.where(vanish, 0, s)
        fields = [(m, "i64"), ((np.int64(1) << s) >> 1, "i64"), (s, "i64"),
                  (np.where(relu != 0, 0, -(1 << (self.acc_width - 1))), "i32")]
        bufs = []
        for values, dtype in fields:
            buf = Buffer(f"{prefix}{len(self.buffers)}", (values.shape[0],), dtype)
            self.buffers.append(buf)
            self.arrays.append(np.ascontiguousarray(values.astype(np.int64 if dtype == "i64" else np.int32)))
            bufs.append(buf)
        return tuple(bufs)  # type: ignore[return-value]

    def wrap(self, x: Expr) -> Expr:
        if self.acc_width >= 32:
            return x
        k = 32 - self.acc_width
        return (x << k) >> k

    def apply(self, acc: Expr, channel: Expr, residual: Callable[[], Expr] | None = None,
              steps: list[tuple[str, Any]] | None = None) -> Expr:
        for kind, operand in self.steps if steps is None else steps:
            if kind == "residual":
                if residual is None:
                    raise ValueError("a residual step needs the residual input")
                acc = self.wrap(acc + self.apply(residual(), channel, None, operand))
                continue
            if kind == "rq_vec":
                m, rounding, amount, least = (b[channel] for b in operand)
                exact = cast("i64", acc) * m + rounding  # |acc * m| < 2**48: exact in i64
                acc = maximum(self.wrap(cast("i32", exact >> amount)), least)
                continue
            v = operand[channel] if isinstance(operand, Buffer) else const(operand, "i32")
            if kind in ("add_imm", "add_vec"):
                acc = self.wrap(acc + v)
            elif kind in ("mul_imm", "mul_vec"):
                acc = self.wrap(acc * v)
            elif kind == "shr_imm":
                acc = self._shift(acc, int(operand))
            elif kind in ("max_imm", "max_vec"):
                acc = maximum(acc, v)
            elif kind in ("min_imm", "min_vec"):
                acc = minimum(acc, v)
            else:
                raise ValueError(f"unknown epilogue step '{kind}'")
        return acc

    def _shift(self, acc: Expr, imm: int) -> Expr:
        """SHR as the ALU reads its operand: the low log2(acc_width)+1 bits, signed (negative: left)."""
        bits = self.acc_width.bit_length()
        mask, sign = (1 << bits) - 1, 1 << (bits - 1)
        amount = ((imm & mask) ^ sign) - sign
        if amount >= 0:
            return acc >> min(amount, 31)
        return self.wrap(acc << min(-amount, 31))


def narrow(acc: Expr, out_width: int, dtype: str) -> Expr:
    lo, hi = -(1 << (out_width - 1)), (1 << (out_width - 1)) - 1
    return cast(dtype, minimum(maximum(acc, lo), hi))


def _i32(e: Expr) -> Expr:
    return cast("i32", e)


def _schedule_int(stage: Stage, target: Target) -> None:
    """Channels of a block as SIMD lanes; the rest fused and parallel when large."""
    spatial = [a for a in stage.leaves if not a.reduce]
    red = [a for a in stage.leaves if a.reduce]
    if red:
        *outer, c = spatial
        stage.reorder(*outer, *red, c)
        stage.cache_write()
        if c.extent > 1:
            stage.vectorize(c)
        fused = stage.fuse(*outer) if len(outer) > 1 else outer[0]
        if stage.out.size * max(1, np.prod([a.extent for a in red])) >= 1 << 16:
            stage.parallel(fused)
    else:
        schedule_elementwise(stage, target)


# ---- kernels ------------------------------------------------------------------------------------------------


def _qconv2d(p: Planner, node: Node) -> None:
    widths = widths_of(p.g)
    x_t, x = _view(p, node.inputs[0], node, "x")
    w = np.asarray(p.g.constants[node.inputs[1]])
    weights = unpack_weights(w) if w.ndim == 6 else w  # (O, I, kh, kw), padded when packed
    _, i_pad, kh, kw = weights.shape
    y_t, y = _out(p, node)
    if x.tile is None or y.tile is None:
        raise UnsupportedError("qconv2d reads and writes packed activations", node=node.name, op=node.op)
    if x.tile[0] != y.tile[0] or x.buffer.shape[1] * x.tile[1] != i_pad:
        raise UnsupportedError(f"input {list(x.buffer.shape)} does not match weights {list(weights.shape)}",
                               node=node.name, op=node.op)
    wt = np.ascontiguousarray(weights.transpose(2, 3, 1, 0))  # (kh, kw, I, O): output channels contiguous
    wbuf = Buffer("w", wt.shape, dtype_of_numpy(wt.dtype))
    sh, sw = node.attrs["strides"]
    pt, pl = node.attrs["pads"][0], node.attrs["pads"][1]
    h_, w_ = x.logical4[2], x.logical4[3]
    epi = Epilogue(node.attrs["epilogue"], widths.acc)
    res = None
    args = [x_t]
    if len(node.inputs) > 2 and node.inputs[2]:
        r_t, res = _view(p, node.inputs[2], node, "r")
        args.append(r_t)
    rkh, rkw, ri = reduce_axis(kh, "rkh"), reduce_axis(kw, "rkw"), reduce_axis(i_pad, "ri")
    blk_in = x.tile[1]

    def body(nb: Var, cb: Var, oh: Var, ow: Var, bb: Var, cc: Var):
        ih, iw = oh * sh + rkh - pt, ow * sw + rkw - pl
        inside = ih.ge(0).logical_and(ih.lt(h_)).logical_and(iw.ge(0)).logical_and(iw.lt(w_))
        xv = x.buffer[nb, ri // blk_in, minimum(maximum(ih, 0), h_ - 1), minimum(maximum(iw, 0), w_ - 1), bb,
                      ri % blk_in]
        o = cb * y.tile[1] + cc  # type: ignore[index]
        return reduce_sum(select(inside, _i32(xv), 0) * _i32(wbuf[rkh, rkw, ri, o]), [rkh, rkw, ri])

    def epilogue(acc: Expr, nb: Var, cb: Var, oh: Var, ow: Var, bb: Var, cc: Var) -> Expr:
        o = cb * y.tile[1] + cc  # type: ignore[index]
        load = (lambda: _i32(res.buffer[nb, cb, oh, ow, bb, cc])) if res is not None else None
        return narrow(epi.apply(epi.wrap(acc), o, load), widths.out, y.buffer.dtype)

    stage = compute("y", y.buffer.shape, body, epilogue=epilogue, dtype=y.buffer.dtype)
    _schedule_int(stage, p.target)
    inputs = [x.buffer, wbuf] + ([res.buffer] if res is not None else []) + epi.buffers
    consts = [constant_tensor(p, node, "w", wt)] + [constant_tensor(p, node, b.name, a)
                                                     for b, a in zip(epi.buffers, epi.arrays, strict=True)]
    kernel = Kernel("qconv2d", inputs, [stage.out], [stage])
    p.step(node.name, kernel, [x_t, consts[0], *args[1:], *consts[1:], y_t])


def _qpool(p: Planner, node: Node) -> None:
    widths = widths_of(p.g)
    x_t, x = _view(p, node.inputs[0], node, "x")
    y_t, y = _out(p, node)
    if x.tile is None or y.tile is None:
        raise UnsupportedError("integer pooling reads and writes packed activations", node=node.name, op=node.op)
    kh, kw = node.attrs["kernel"]
    sh, sw = node.attrs["strides"]
    pt, pl = node.attrs["pads"][0], node.attrs["pads"][1]
    h_, w_ = x.logical4[2], x.logical4[3]
    rh, rw = reduce_axis(kh, "rkh"), reduce_axis(kw, "rkw")
    is_max = node.op == "qmaxpool"
    fill = -(1 << (widths.out - 1))
    epi = None if is_max else Epilogue(node.attrs["epilogue"], widths.acc)

    def body(nb: Var, cb: Var, oh: Var, ow: Var, bb: Var, cc: Var):
        ih, iw = oh * sh + rh - pt, ow * sw + rw - pl
        inside = ih.ge(0).logical_and(ih.lt(h_)).logical_and(iw.ge(0)).logical_and(iw.lt(w_))
        xv = _i32(x.buffer[nb, cb, minimum(maximum(ih, 0), h_ - 1), minimum(maximum(iw, 0), w_ - 1), bb, cc])
        if is_max:  # pads hold the lowest output value: they never win over a real element
            return reduce_max(select(inside, xv, fill), [rh, rw], init=fill)
        return reduce_sum(select(inside, xv, 0), [rh, rw])

    def epilogue(acc: Expr, nb: Var, cb: Var, oh: Var, ow: Var, bb: Var, cc: Var) -> Expr:
        if epi is None:
            return cast(y.buffer.dtype, acc)
        return narrow(epi.apply(epi.wrap(acc), cb * y.tile[1] + cc), widths.out, y.buffer.dtype)  # type: ignore[index]

    stage = compute("y", y.buffer.shape, body, epilogue=epilogue, dtype=y.buffer.dtype)
    _schedule_int(stage, p.target)
    bufs = epi.buffers if epi is not None else []
    arrays = epi.arrays if epi is not None else []
    kernel = Kernel(node.op, [x.buffer, *bufs], [stage.out], [stage])
    consts = [constant_tensor(p, node, b.name, a) for b, a in zip(bufs, arrays, strict=True)]
    p.step(node.name, kernel, [x_t, *consts, y_t])


def _qalu(p: Planner, node: Node) -> None:
    widths = widths_of(p.g)
    x_t, x = _view(p, node.inputs[0], node, "x")
    y_t, y = _out(p, node)
    res_t, res = (None, None)
    if len(node.inputs) > 1 and node.inputs[1]:
        res_t, res = _view(p, node.inputs[1], node, "r")
    epi = Epilogue(node.attrs["epilogue"], widths.acc)
    if x.tile is None or y.tile is None or x.buffer.shape != y.buffer.shape:
        raise UnsupportedError("qalu reads and writes packed activations of one shape", node=node.name, op=node.op)

    def body(*phys: Var) -> Expr:
        channel = phys[1] * y.tile[1] + phys[5]  # type: ignore[index]
        load = (lambda: _i32(res.buffer[tuple(phys)])) if res is not None else None
        return narrow(epi.apply(_i32(x.buffer[tuple(phys)]), channel, load), widths.out, y.buffer.dtype)

    stage = compute("y", y.buffer.shape, body, dtype=y.buffer.dtype)
    _schedule_int(stage, p.target)
    ins = [x.buffer] + ([res.buffer] if res is not None else []) + epi.buffers
    args = [x_t] + ([res_t] if res_t is not None else [])
    consts = [constant_tensor(p, node, b.name, a) for b, a in zip(epi.buffers, epi.arrays, strict=True)]
    p.step(node.name, Kernel("qalu", ins, [stage.out], [stage]), [*args, *consts, y_t])


def _packed_out(p: Planner, node: Node, value_at: Callable[[list[Expr]], Expr]) -> tuple[Stage, Tensor]:
    """A stage writing node's output from ``value_at(logical index)``; packing padding is zero."""
    y_t, y = _out(p, node)

    def body(*phys: Var) -> Expr:
        idx = y.logical_of(phys)
        v = value_at(idx)
        ok = y.inside(idx)
        return v if ok is None else select(ok, v, const(0, v.dtype))

    stage = compute("y", y.buffer.shape, body, dtype=y.buffer.dtype)
    _schedule_int(stage, p.target)
    return stage, y_t


def _quantize(p: Planner, node: Node) -> None:
    src = p.get(node.inputs[0], PLAIN, node)
    shape4 = _shape4(src.shape)
    xbuf = Buffer("x", src.physical, src.dtype)
    bits = node.attrs["bits"]
    scale = float(node.attrs["scale"])
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    out_dtype = dtype_of_numpy(numpy_dtype(p.g.values[node.outputs[0]].dtype))

    def value(idx: list[Expr]) -> Expr:
        n, c, h, w = [minimum(i, d - 1) for i, d in zip(idx, shape4, strict=True)]  # padding reads stay inside
        xv = xbuf[(n, c, h, w)[: len(src.shape)]]
        q = Call("rint", [cast("f64", xv) / scale])  # numpy: float64 division, round half to even
        return cast(out_dtype, cast("i32", minimum(maximum(q, float(lo)), float(hi))))

    stage, y_t = _packed_out(p, node, value)
    p.step(node.name, Kernel("quantize", [xbuf], [stage.out], [stage]), [src, y_t])


def _shape4(shape: tuple[int, ...]) -> tuple[int, ...]:
    if len(shape) == 2:
        return (shape[0], shape[1], 1, 1)
    if len(shape) == 4:
        return shape
    raise UnsupportedError(f"quantized tensors are NCHW or NK, got shape {list(shape)}")


def _dequantize(p: Planner, node: Node) -> None:
    x_t, x = _view(p, node.inputs[0], node, "x")
    scale = float(np.float32(node.attrs["scale"]))
    logical = x.logical
    y = p.new(node.outputs[0], logical, PLAIN)

    def body(*axes: Var) -> Expr:
        idx = list(axes) + [const(0)] * (4 - len(axes))
        return cast("f32", x.at(idx)) * scale

    stage = compute("y", logical, body, dtype="f32")
    schedule_elementwise(stage, p.target)
    p.step(node.name, Kernel("dequantize", [x.buffer], [stage.out], [stage]), [x_t, y])


def _qconcat(p: Planner, node: Node) -> None:
    parts = [_view(p, name, node, f"x{k}") for k, name in enumerate(node.inputs)]
    axis = node.attrs["axis"] % len(parts[0][1].logical)
    offsets, total = [], 0
    for _, v in parts:
        offsets.append(total)
        total += v.logical[axis]

    def value(idx: list[Expr]) -> Expr:
        i = idx[axis]
        result: Expr | None = None
        for (_, v), off in reversed(list(zip(parts, offsets, strict=True))):
            j = list(idx)
            j[axis] = minimum(maximum(i - off, 0), v.logical[axis] - 1)
            j = [minimum(a, d - 1) for a, d in zip(j, v.logical4, strict=True)]
            x = v.at(j)
            result = x if result is None else select(i.lt(off + v.logical[axis]), x, result)
        return result  # type: ignore[return-value]

    stage, y_t = _packed_out(p, node, value)
    p.step(node.name, Kernel("qconcat", [v.buffer for _, v in parts], [stage.out], [stage]),
           [*(t for t, _ in parts), y_t])


def _qreshape(p: Planner, node: Node) -> None:
    x_t, x = _view(p, node.inputs[0], node, "x")
    out_logical = tuple(p.g.values[node.outputs[0]].logical_shape or ())
    in_strides = row_major_strides(x.logical)
    out_strides = row_major_strides(out_logical)
    total = int(np.prod(x.logical))

    def value(idx: list[Expr]) -> Expr:
        flat: Expr = const(0)
        for i, d, s in zip(idx, out_logical, out_strides, strict=False):
            flat = flat + minimum(i, d - 1) * s
        flat = minimum(flat, total - 1)
        src = [(flat // s) % d for d, s in zip(x.logical, in_strides, strict=True)]
        return x.at(src + [const(0)] * (4 - len(src)))

    stage, y_t = _packed_out(p, node, value)
    p.step(node.name, Kernel("qreshape", [x.buffer], [stage.out], [stage]), [x_t, y_t])


def _qpad(p: Planner, node: Node) -> None:
    x_t, x = _view(p, node.inputs[0], node, "x")
    pads = node.attrs["pads"]
    rank = len(x.logical)
    fill = int(node.attrs["value"])

    def value(idx: list[Expr]) -> Expr:
        inside, src = None, []
        for d in range(rank):
            j = idx[d] - pads[d]
            ok = j.ge(0).logical_and(j.lt(x.logical[d]))
            inside = ok if inside is None else inside.logical_and(ok)
            src.append(minimum(maximum(j, 0), x.logical[d] - 1))
        v = x.at(src + [const(0)] * (4 - rank))
        return select(inside, v, const(fill, v.dtype))  # type: ignore[arg-type]

    stage, y_t = _packed_out(p, node, value)
    p.step(node.name, Kernel("qpad", [x.buffer], [stage.out], [stage]), [x_t, y_t])


def _qim2col(p: Planner, node: Node) -> None:
    x_t, x = _view(p, node.inputs[0], node, "x")
    kh, kw = node.attrs["kernel"]
    sh, sw = node.attrs["strides"]
    pt, pl = node.attrs["pads"][0], node.attrs["pads"][1]
    _, c_, h_, w_ = x.logical4
    constants = node.attrs.get("constants", ())

    def value(idx: list[Expr]) -> Expr:
        n, k, oh, ow = idx
        tap, c = minimum(k // c_, kh * kw - 1), k % c_  # k = (dy * kw + dx) * C + c, then the constants
        ih, iw = oh * sh + tap // kw - pt, ow * sw + tap % kw - pl
        inside = ih.ge(0).logical_and(ih.lt(h_)).logical_and(iw.ge(0)).logical_and(iw.lt(w_))
        v = x.at([minimum(n, x.logical4[0] - 1), minimum(c, c_ - 1), minimum(maximum(ih, 0), h_ - 1),
                  minimum(maximum(iw, 0), w_ - 1)])
        v = select(inside, v, const(0, v.dtype))  # type: ignore[arg-type]
        for j, constant in enumerate(constants):
            v = select(k.eq(kh * kw * c_ + j), const(constant, v.dtype), v)  # type: ignore[arg-type]
        return v

    stage, y_t = _packed_out(p, node, value)
    p.step(node.name, Kernel("qim2col", [x.buffer], [stage.out], [stage]), [x_t, y_t])


QUANT_HANDLERS: dict[str, Callable[[Planner, Node], None]] = {
    "qconv2d": _qconv2d, "qmaxpool": _qpool, "qavgpool": _qpool, "qalu": _qalu, "quantize": _quantize,
    "dequantize": _dequantize, "qconcat": _qconcat, "qreshape": _qreshape, "qpad": _qpad,
    "qim2col": _qim2col,
}
QUANT_OPS = frozenset(QUANT_HANDLERS)
