"""Neural-network kernels: convolution and dense layers with fused epilogues, pooling, softmax, matmul.

The convolution is the one that matters for speed. Its definition is the textbook one on blocked layouts
(input (N, C/bi, H, W, bi), weights pre-packed (O/bo, C/bi, KH, KW, bi, bo), output (N, O/bo, OH, OW, bo))
and its schedule builds the register-blocked micro-kernel::

    parallel for (n, oc.o, oh):                 # fused: enough iterations for every thread
      for ow.o:
        acc[ocb][r][bo] = 0                      # ocb * r SIMD registers
        for ic.o, kh, kw, ic.i:                  # the reduction
          for r (unrolled), ocb (unrolled):      # r broadcasts of one input channel,
            acc[ocb][r][:] += x[...] * w[...]    # ocb vector loads of weights: r * ocb FMAs
        y = act(acc + bias (+ residual))         # the epilogue, once per output element

Tile sizes come from the target: ``bo`` is the SIMD width in floats, and ``r * ocb`` accumulators plus
``ocb`` weight registers stay well inside the register file. :func:`conv_tiles` is the heuristic choice;
a :class:`ConvSchedule` (tiles, the order of the reduction loops, which loops run outermost) is what host
tuning (:mod:`weft.compiler.tune.host`) measures instead, per :class:`ConvWorkload`.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from weft.compiler.llvm.elementwise import Operand, read, schedule_elementwise
from weft.compiler.llvm.expr import Buffer, Expr, Var, cast, exp, maximum, minimum, select
from weft.compiler.llvm.layout import Layout
from weft.compiler.llvm.target import Target
from weft.compiler.llvm.te import Kernel, compute, reduce_axis, reduce_max, reduce_sum

__all__ = [
    "OUTER_ORDERS", "REDUCE_LOOPS", "ConvSchedule", "ConvSpec", "ConvWorkload", "conv_kernel", "conv_tiles",
    "dense_kernel", "global_pool_kernel", "matmul_kernel", "outer_order", "pack_conv_weights", "pack_dense_weights",
    "padded_rows", "pool_kernel", "reduce_orders", "register_tiles", "softmax_kernel", "tile_score",
]

Epilogue = Callable[[Expr, list[Expr]], Expr]


@dataclass(frozen=True)
class ConvSpec:
    """A 2-D convolution on blocked layouts.

    The input buffer is (n, cin/bi, h, w, bi); output pixel (oh, ow) reads input rows from
    ``oh * stride + offset[0]`` (columns likewise), so the input either was padded by a pad kernel
    (offset 0) or carries a zero halo at least as wide as the pads (offset = halo - pad). `out` fixes the
    output size when the input is larger than the pads make it (a halo beyond the pads), and `out_halo`
    writes the output inside a zero border of that width for the padded convolutions that read it.
    """

    n: int
    cin: int
    h: int  # input buffer height and width: padded, or with its halo
    w: int
    cout: int
    kh: int
    kw: int
    stride: tuple[int, int]
    bi: int  # input channel block (1: a plain NCHW input)
    bo: int  # output channel block
    offset: tuple[int, int] = (0, 0)
    out: tuple[int, int] | None = None
    out_halo: int = 0

    @property
    def out_hw(self) -> tuple[int, int]:
        if self.out is not None:
            return self.out
        return ((self.h - self.kh) // self.stride[0] + 1, (self.w - self.kw) // self.stride[1] + 1)

    @property
    def flops(self) -> int:
        oh, ow = self.out_hw
        return 2 * self.n * self.cout * oh * ow * self.cin * self.kh * self.kw


def pack_conv_weights(w: np.ndarray, bi: int, bo: int) -> np.ndarray:
    """(O, C, KH, KW) float weights -> (O/bo, C/bi, KH, KW, bi, bo), the order the micro-kernel reads."""
    o, c, kh, kw = w.shape
    return np.ascontiguousarray(
        w.reshape(o // bo, bo, c // bi, bi, kh, kw).transpose(0, 2, 4, 5, 3, 1), dtype=np.float32)


#: What the tile model assumes of the core's FMA unit: two pipelined FMA pipes of 4 cycles' latency. Every x86
#: core with FMA since Haswell and Zen 1 has this shape (Zen 2: latency 5, Skylake-X: 4); so have the wide ARM
#: cores. The register file, which does differ, comes from the target.
FMA_PIPES, FMA_LATENCY = 2, 4
#: Cycles a reduction step spends on each vector load of weights and each broadcast of an input value beyond
#: its FMAs: fitted to the micro-kernel's measured times on Zen 4 (AVX2; 1x1 and 3x3 convolutions, tiles
#: 2x4, 4x2, 8x1, 14x1 and 4x3 within 2% of the model). The loads do not hide behind the FMAs: a weight vector
#: costs more than a broadcast, so 4x2 beats 2x4 by 6 to 11% and 14x1 (15 loads) is slower than 4x2.
WEIGHT_LOAD_CYCLES, BROADCAST_CYCLES = 0.7, 0.42


def tile_score(r: int, ocb: int) -> float:
    """The modelled share of the FMA peak a tile of r output pixels by ocb channel blocks reaches.

    One step of the reduction (one input channel) does r * ocb FMAs, which cannot finish before the FMA
    latency (each accumulator's FMAs depend on each other), and loads ocb weight vectors and r broadcasts
    (:data:`WEIGHT_LOAD_CYCLES`, :data:`BROADCAST_CYCLES`): 1x4 (4 accumulators: latency-bound) reaches half
    of what 4x2 does, and 12 accumulators (4x3, 6x2) spread the loads over more FMAs than 8 do."""
    fmas = r * ocb
    cycles = max(fmas / FMA_PIPES, FMA_LATENCY) + WEIGHT_LOAD_CYCLES * ocb + BROADCAST_CYCLES * r
    return fmas / FMA_PIPES / cycles


def register_tiles(rows: int, blocks: int, target: Target) -> tuple[int, int]:
    """(r, ocb) of a register-blocked product: r of `rows` (output pixels, matrix rows) by ocb of `blocks`
    vector blocks of output channels; the best :func:`tile_score` of the tiles that fit the target.

    The ``r * ocb`` accumulators, ``ocb`` weight vectors and the broadcast must fit the register file: 4x3
    fills AVX2's 16 exactly and runs 7 to 9% faster than 4x2 (measured on 1x1 and 3x3 convolutions); one
    more (7x2, 5x3) spills, and runs at half the speed. r divides `rows` and ocb `blocks`, so that no tile
    needs a guard.
    """
    regs = target.vector_registers  # (bounds both loops: a matrix may have thousands of rows)
    fits = [(r, ocb) for ocb in range(1, min(blocks, regs) + 1) if blocks % ocb == 0
            for r in range(1, min(rows, regs) + 1) if rows % r == 0 and r * ocb + ocb + 1 <= regs]
    return max(fits, key=lambda t: tile_score(*t), default=(1, 1))


def padded_rows(rows: int, blocks: int, target: Target) -> int:
    """`rows` (a product's matrix rows: pixels, Winograd tiles) rounded up to the multiple of a register
    tile's height whose :func:`register_tiles` tile has the best :func:`tile_score`, each padding row
    costing its share of the work (a product over padded rows needs no guard on its last tile)."""

    def score(padded: int) -> float:
        return tile_score(*register_tiles(padded, blocks, target)) * rows / padded

    return max(sorted({-(-rows // r) * r for r in range(1, target.vector_registers + 1)}), key=score)


def conv_tiles(spec: ConvSpec, target: Target) -> tuple[int, int]:
    """(r, ocb): output pixels per tile along W, and output channel blocks per tile
    (:func:`register_tiles`)."""
    return register_tiles(spec.out_hw[1], spec.cout // spec.bo, target)


#: the reduction loops outside the innermost input-channel loop (rc.i), in the default order
REDUCE_LOOPS = ("rco", "rkh", "rkw")
#: which loops run outside the micro-kernel, outermost first ("|" ends the parallel, fused loops):
#: "co": n, oc.o, oh | ow.o   (a thread keeps one block of weights hot over many rows)
#: "oh": n, oh, oc.o | ow.o   (a row of input stays hot over every block of output channels)
#: "ow": n, oh | ow.o, oc.o   (one input tile stays hot over every block of output channels)
OUTER_ORDERS = ("co", "oh", "ow")


@dataclass(frozen=True)
class ConvSchedule:
    """How a convolution's micro-kernel is blocked and its loops ordered (see the module docstring).

    `r` output pixels along W times `ocb` output channel blocks accumulate in registers; `order` is the
    order of the reduction loops outside rc.i (outermost first); `outer` one of :data:`OUTER_ORDERS`.
    Every schedule computes the same sums, in another order: results differ only by float rounding.
    """

    r: int
    ocb: int
    order: tuple[str, ...] = REDUCE_LOOPS
    outer: str = "co"

    def __post_init__(self) -> None:
        if self.r < 1 or self.ocb < 1:
            raise ValueError(f"conv schedule: r and ocb must be positive, got r={self.r}, ocb={self.ocb}")
        if sorted(self.order) != sorted(REDUCE_LOOPS):
            raise ValueError(f"conv schedule: order must be a permutation of {','.join(REDUCE_LOOPS)}, got "
                             f"{','.join(self.order)}")
        if self.outer not in OUTER_ORDERS:
            raise ValueError(f"conv schedule: outer must be one of {', '.join(OUTER_ORDERS)}, got '{self.outer}'")

    def registers(self) -> int:
        """Vector registers the micro-kernel keeps live: r * ocb accumulators and ocb weight vectors."""
        return self.r * self.ocb + self.ocb

    def illegal_for(self, spec: ConvSpec, target: Target) -> str | None:
        """Why this schedule is not one tuning may pick for `spec` on `target` (None: it is)."""
        _, ow = spec.out_hw
        blocks = spec.cout // spec.bo
        if ow % self.r:
            return f"r={self.r} does not divide the output width {ow}"
        if blocks % self.ocb:
            return f"ocb={self.ocb} does not divide the {blocks} output channel blocks"
        if self.registers() > target.vector_registers:
            return f"r*ocb + ocb = {self.registers()} registers, the target has {target.vector_registers}"
        return None

    def to_dict(self) -> dict[str, Any]:
        return {"r": self.r, "ocb": self.ocb, "order": ",".join(self.order), "outer": self.outer}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ConvSchedule:
        if not isinstance(data, Mapping):
            raise ValueError(f"a conv schedule is a mapping, got {data!r}")
        unknown = sorted(set(data) - {"r", "ocb", "order", "outer"})
        if unknown or "r" not in data or "ocb" not in data:
            raise ValueError(f"not a conv schedule: {dict(data)} (fields: r, ocb, order, outer)")
        r, ocb = data["r"], data["ocb"]
        if not (isinstance(r, int) and isinstance(ocb, int)) or isinstance(r, bool) or isinstance(ocb, bool):
            raise ValueError(f"conv schedule: r and ocb must be integers, got {dict(data)}")
        order = data.get("order", ",".join(REDUCE_LOOPS))
        if not isinstance(order, str):
            raise ValueError(f"conv schedule: order must be a string like 'rco,rkh,rkw', got {order!r}")
        return cls(r, ocb, tuple(order.split(",")), str(data.get("outer", "co")))

    @classmethod
    def default(cls, spec: ConvSpec, target: Target) -> ConvSchedule:
        """The heuristic's choice: :func:`conv_tiles`, the default reduction order, and :func:`outer_order`."""
        return cls(*conv_tiles(spec, target), outer=outer_order(spec))


def outer_order(spec: ConvSpec) -> str:
    """"oh" (threads split the rows) where a layer's activations outweigh its weights, else "co" (threads
    split the output channels, each keeping its weights hot over every row).

    The parallel-for hands each thread one contiguous range, so layers that all split by rows leave each
    thread the rows its core wrote in the layer before (depthwise and elementwise kernels split by rows
    too); a layer whose weights dominate is better split by channels, each core streaming half of them.
    Measured on an AVX-512 Xeon at 2 threads: MobileNetV2 -4%, DenseNet-121 -4%, ResNet-50 -4%, one thread
    unchanged."""
    oh, ow = spec.out_hw
    weights = spec.cin * spec.cout * spec.kh * spec.kw
    activations = spec.n * (spec.cin * spec.h * spec.w + spec.cout * oh * ow)
    return "oh" if activations > weights else "co"


def reduce_orders(spec: ConvSpec) -> list[tuple[str, ...]]:
    """The orders of :data:`REDUCE_LOOPS` that differ for `spec`: loops of one iteration go anywhere, so
    only the first order (in permutation order) of each arrangement of the longer loops is kept."""
    extents = {"rco": spec.cin // spec.bi, "rkh": spec.kh, "rkw": spec.kw}
    seen, out = set(), []
    for order in itertools.permutations(REDUCE_LOOPS):
        real = tuple(a for a in order if extents[a] > 1)
        if real not in seen:
            seen.add(real)
            out.append(order)
    return out


@dataclass(frozen=True)
class ConvWorkload:
    """What one convolution kernel computes, without the node's name: the spec and its fused epilogue
    (activation, clip bounds, and the layout of a residual it adds; None: no residual). Layers of the
    same shape share a workload, and so a tuning record (:attr:`key`)."""

    spec: ConvSpec
    act: str = "none"
    clip: tuple[float | None, float | None] | None = None
    residual: Layout | None = None

    def __post_init__(self) -> None:
        if self.clip is not None:
            lo, hi = self.clip
            object.__setattr__(self, "clip", (None if lo is None else float(lo), None if hi is None else float(hi)))

    @property
    def key(self) -> str:
        fields = {"kind": "conv", **asdict(self.spec), "act": self.act,
                  "clip": list(self.clip) if self.clip is not None else None,
                  "residual": [self.residual.block, self.residual.halo] if self.residual is not None else None}
        return json.dumps(fields, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_key(cls, key: str) -> ConvWorkload:
        """The workload of a :attr:`key` (ValueError when `key` is not one)."""
        try:
            fields = json.loads(key)
            if not isinstance(fields, dict) or fields.pop("kind", None) != "conv":
                raise ValueError("not a conv workload")
            act, clip, res = fields.pop("act"), fields.pop("clip"), fields.pop("residual")
            for name in ("stride", "offset", "out"):
                if fields.get(name) is not None:
                    fields[name] = tuple(fields[name])
            spec = ConvSpec(**fields)
            return cls(spec, act, tuple(clip) if clip is not None else None,  # type: ignore[arg-type]
                       Layout(*res) if res is not None else None)
        except (json.JSONDecodeError, TypeError, KeyError, AttributeError, ValueError) as err:
            raise ValueError(f"not a conv workload key: {key[:120]} ({err})") from None

    def kernel(self, target: Target, schedule: ConvSchedule | None = None, name: str = "conv") -> Kernel:
        residual = None
        if self.residual is not None:
            s = self.spec
            shape = (s.n, s.cout, *s.out_hw)
            residual = Operand(Buffer("residual", self.residual.physical(shape)), shape, self.residual)
        return conv_kernel(name, self.spec, target, act=self.act, clip=self.clip, residual=residual,
                           tiles=schedule)


def conv_epilogue(bias: Buffer, residual: Operand | None, out_shape: tuple[int, ...], out_layout: Layout,
                  act: str, clip: tuple | None) -> Callable[..., Expr]:
    """A blocked convolution's epilogue on its accumulator at (n, channel block, oh, ow, lane): + bias,
    + the residual read in the output's layout, then the activation."""

    def epilogue(acc: Expr, n: Var, cb: Var, oh: Var, ow: Var, c: Var) -> Expr:
        y = acc + bias[cb, c]
        if residual is not None:
            phys = [n, cb, oh, ow, c]
            y = y + read(residual, out_shape, out_layout, phys, out_layout.logical_index(phys))
        return activation(y, act, clip)

    return epilogue


def conv_kernel(name: str, spec: ConvSpec, target: Target, *, act: str = "none", clip: tuple | None = None,
                residual: Operand | None = None, tiles: tuple[int, int] | ConvSchedule | None = None,
                groups: int = 1) -> Kernel:
    """Convolution + bias (+ residual) (+ ReLU or clip), blocked layouts. Parameters: x, w (packed), bias
    (O/bo, bo), [residual], y. `tiles`: (r, ocb) or a whole :class:`ConvSchedule` (default: the
    heuristic's, :func:`conv_tiles`).

    With `groups` > 1 (ONNX's grouped convolution) output channel block co reads only the input blocks
    of its group, and the weights are those of one group, (O/bo, C/groups/bi, KH, KW, bi, bo): the blocks
    must divide the channels of a group."""
    s = spec
    oh_, ow_ = s.out_hw
    cg, og = s.cin // groups, s.cout // groups
    if s.cin % groups or s.cout % groups or cg % s.bi or og % s.bo:
        raise ValueError(f"'{name}': blocks {s.bi}/{s.bo} do not divide the {cg}/{og} channels of each of the "
                         f"{groups} groups")
    x = Buffer("x", (s.n, s.cin // s.bi, s.h, s.w, s.bi))
    w = Buffer("w", (s.cout // s.bo, cg // s.bi, s.kh, s.kw, s.bi, s.bo))
    b = Buffer("bias", (s.cout // s.bo, s.bo))
    rco = reduce_axis(cg // s.bi, "rc.o")
    rkh = reduce_axis(s.kh, "rkh")
    rkw = reduce_axis(s.kw, "rkw")
    rci = reduce_axis(s.bi, "rc.i")
    sh, sw = s.stride
    dy, dx = s.offset
    out_layout = Layout(s.bo)

    def body(n: Var, co: Var, oh: Var, ow: Var, c: Var):
        block = rco if groups == 1 else co // (og // s.bo) * (cg // s.bi) + rco  # the first block of co's group
        return reduce_sum(x[n, block, oh * sh + (rkh + dy), ow * sw + (rkw + dx), rci] * w[co, rco, rkh, rkw, rci, c],
                          [rco, rkh, rkw, rci])

    epilogue = conv_epilogue(b, residual, (s.n, s.cout, oh_, ow_), out_layout, act, clip)

    domain = (s.n, s.cout // s.bo, oh_, ow_, s.bo)
    if s.out_halo:
        halo = Layout(s.bo, s.out_halo)
        y = compute("y", domain, body, epilogue=epilogue, buffer_shape=halo.physical((s.n, s.cout, oh_, ow_)),
                    store=lambda idx: halo.at(*idx))
    else:
        y = compute("y", domain, body, epilogue=epilogue)
    if tiles is None:
        tiles = ConvSchedule.default(s, target)
    elif not isinstance(tiles, ConvSchedule):
        tiles = ConvSchedule(*tiles)
    n, co, oh, ow, c = y.axes
    owo, owi = y.split(ow, tiles.r)
    coo, coi = y.split(co, tiles.ocb)
    reduction = [{"rco": rco, "rkh": rkh, "rkw": rkw}[a] for a in tiles.order]
    outside = {"co": (n, coo, oh, owo), "oh": (n, oh, coo, owo), "ow": (n, oh, owo, coo)}[tiles.outer]
    y.reorder(*outside, *reduction, rci, owi, coi, c)
    y.cache_write()
    y.vectorize(c)
    y.unroll(owi)
    y.unroll(coi)
    outer = y.fuse(*outside[:2 if tiles.outer == "ow" else 3])
    y.parallel(outer)
    inputs = [x, w, b] + ([residual.buffer] if residual is not None else [])
    return Kernel(name, inputs, [y.out], [y])


def activation(y: Expr, act: str, clip: tuple | None = None) -> Expr:
    if act == "relu":
        return maximum(y, 0.0)
    if act == "clip":
        lo, hi = clip if clip is not None else (None, None)
        if lo is not None:
            y = maximum(y, float(lo))
        if hi is not None:
            y = minimum(y, float(hi))
        return y
    if act != "none":
        raise ValueError(f"unknown activation '{act}'")
    return y


def pack_dense_weights(w: np.ndarray, bo: int) -> np.ndarray:
    """(O, K) weights -> (O/bo, K, bo)."""
    o, k = w.shape
    return np.ascontiguousarray(w.reshape(o // bo, bo, k).transpose(0, 2, 1), dtype=np.float32)


def dense_kernel(name: str, n: int, k: int, o: int, bo: int, target: Target, *, act: str = "none",
                 clip: tuple | None = None, residual: bool = False, rows: int | None = None,
                 ocb: int | None = None) -> Kernel:
    """``y = act(x @ w.T + bias (+ residual))`` on plain (N, K) -> (N, O) tensors; weights packed
    (O/bo, K, bo), bias (O/bo, bo). Tiles of `rows` x `ocb` vectors accumulate in registers."""
    x = Buffer("x", (n, k))
    w = Buffer("w", (o // bo, k, bo))
    b = Buffer("bias", (o // bo, bo))
    res = Buffer("residual", (n, o // bo, bo)) if residual else None
    rk = reduce_axis(k, "rk")

    def epilogue(acc: Expr, i: Var, oo: Var, oi: Var) -> Expr:
        y = acc + b[oo, oi]
        if res is not None:
            y = y + res[i, oo, oi]
        return activation(y, act, clip)

    y = compute("y", (n, o // bo, bo), lambda i, oo, oi: reduce_sum(x[i, rk] * w[oo, rk, oi], [rk]),
                epilogue=epilogue)
    best_rows, best_ocb = register_tiles(n, o // bo, target)
    rows, ocb = rows or best_rows, ocb or best_ocb
    i, oo, oi = y.axes
    io, ii = y.split(i, rows)
    ooo, ooi = y.split(oo, ocb)
    y.reorder(ooo, io, rk, ii, ooi, oi)
    y.cache_write()
    y.vectorize(oi)
    y.unroll(ii)
    y.unroll(ooi)
    outer = y.fuse(ooo, io)
    if n * o * k >= 1 << 18:
        y.parallel(outer)
    inputs = [x, w, b] + ([res] if res is not None else [])
    return Kernel(name, inputs, [y.out], [y])


def matmul_kernel(name: str, batch: int, m: int, k: int, n: int, target: Target) -> Kernel:
    """``c = a @ b`` for two runtime tensors (batch, M, K) x (batch, K, N): a first stage packs b into
    (batch, N/bn, K, bn) panels, the second is the register-tiled product."""
    lanes = target.lanes(4)
    bn = lanes if n % lanes == 0 else 1
    a = Buffer("a", (batch, m, k))
    bb = Buffer("b", (batch, k, n))
    packed = compute("b_packed", (batch, n // bn, k, bn), lambda z, jo, kk, ji: bb[z, kk, jo * bn + ji])
    schedule_elementwise(packed, target)
    rk = reduce_axis(k, "rk")
    c = compute("c", (batch, m, n // bn, bn),
                lambda z, i, jo, ji: reduce_sum(a[z, i, rk] * packed.out[z, jo, rk, ji], [rk]))
    rows, ocb = register_tiles(m, n // bn if bn > 1 else 1, target)  # (scalar columns: one at a time)
    z, i, jo, ji = c.axes
    io, ii = c.split(i, rows)
    joo, joi = c.split(jo, ocb)
    c.reorder(z, joo, io, rk, ii, joi, ji)
    c.cache_write()
    if bn > 1:
        c.vectorize(ji)
    c.unroll(ii)
    c.unroll(joi)
    outer = c.fuse(z, joo, io)
    if batch * m * n * k >= 1 << 18:
        c.parallel(outer)
    return Kernel(name, [a, bb], [c.out], [packed, c])


def pool_kernel(name: str, src: Operand, kind: str, kernel: tuple[int, int], strides: tuple[int, int],
                pads: tuple[int, int, int, int], out_hw: tuple[int, int], target: Target, *,
                count_include_pad: bool = False, out_halo: int = 0) -> Kernel:
    """Max or average pooling on a plain or blocked NCHW tensor, pads and ceil mode included.

    Windows are clamped to the input; the average divides by the number of cells inside the input (or
    inside the padded input with `count_include_pad`), never counting the cells ceil mode adds. A blocked
    output may be written inside a zero border (`out_halo`) for the padded convolutions that read it."""
    n_, c_, h_, w_ = src.shape
    layout = src.layout
    kh, kw = kernel
    (sh, sw), (pt, pl, pb, pr) = strides, pads
    rh, rw = reduce_axis(kh, "rkh"), reduce_axis(kw, "rkw")
    out_shape = (n_, c_, *out_hw)
    # every window holds a cell of the input: a clamped tap then repeats a cell of its own window, which
    # leaves a max unchanged (no select per tap)
    windows_touch_input = all(pad < k and (out - 1) * st - pad <= size - 1
                              for pad, k, out, st, size in ((pt, kh, out_hw[0], sh, h_), (pl, kw, out_hw[1], sw, w_)))

    def body(*phys: Var):
        logical = layout.logical_index(phys)
        n, c, oh, ow = logical
        ih, iw = oh * sh + rh - pt, ow * sw + rw - pl
        inside = ih.ge(0).logical_and(ih.lt(h_)).logical_and(iw.ge(0)).logical_and(iw.lt(w_))
        ihc, iwc = minimum(maximum(ih, 0), h_ - 1), minimum(maximum(iw, 0), w_ - 1)
        if layout.blocked:
            xv = src.buffer[layout.at(phys[0], phys[1], ihc, iwc, phys[4])]
        else:
            xv = src.buffer[n, c, ihc, iwc]
        if kind == "max":
            return reduce_max(xv if windows_touch_input else select(inside, xv, float("-inf")), [rh, rw])
        return reduce_sum(select(inside, xv, 0.0), [rh, rw])

    def epilogue(acc: Expr, *phys: Var) -> Expr:
        if kind == "max":
            return acc
        _, _, oh, ow = layout.logical_index(phys)
        lo_h, lo_w = (-pt, -pl) if count_include_pad else (0, 0)
        hi_h, hi_w = (h_ + pb, w_ + pr) if count_include_pad else (h_, w_)
        h0, w0 = oh * sh - pt, ow * sw - pl
        count_h = minimum(h0 + kh, hi_h) - maximum(h0, lo_h)
        count_w = minimum(w0 + kw, hi_w) - maximum(w0, lo_w)
        return acc / cast("f32", count_h * count_w)

    if out_halo:
        halo = Layout(layout.block, out_halo)
        y = compute("y", layout.domain(out_shape), body, epilogue=epilogue, dtype="f32",
                    buffer_shape=halo.physical(out_shape), store=lambda idx: halo.at(*idx))
    else:
        y = compute("y", layout.domain(out_shape), body, epilogue=epilogue, dtype="f32")
    _schedule_pool(y, layout, target)
    return Kernel(name, [src.buffer], [y.out], [y])


def _schedule_pool(y, layout: Layout, target: Target) -> None:
    spatial = [a for a in y.leaves if not a.reduce]
    red = [a for a in y.leaves if a.reduce]
    y.cache_write()  # the window's running max or sum in registers
    if layout.blocked:
        *outer, c = spatial
        y.reorder(*outer, *red, c)
        if c.extent > 1:
            y.vectorize(c)
        fused = y.fuse(*outer)
        if y.out.size >= 1 << 14:
            y.parallel(fused)
    else:
        fused = y.fuse(*spatial)
        if y.out.size >= 1 << 14:
            y.parallel(fused)


def global_pool_kernel(name: str, src: Operand, target: Target, kind: str = "avg") -> Kernel:
    """GlobalAveragePool (`kind` "avg": the mean over H and W) or GlobalMaxPool ("max"), keeping the
    layout ((N, C/b, 1, 1, b) when blocked)."""
    n_, c_, h_, w_ = src.shape
    layout = src.layout
    rh, rw = reduce_axis(h_, "rh"), reduce_axis(w_, "rw")
    count = float(h_ * w_)

    def body(*phys: Var):  # float64 sums divided by the count: numpy's mean(dtype=float64)
        if layout.blocked:
            xv = src.buffer[layout.at(phys[0], phys[1], rh, rw, phys[4])]
        else:
            xv = src.buffer[phys[0], phys[1], rh, rw]
        return reduce_max(xv, [rh, rw]) if kind == "max" else reduce_sum(cast("f64", xv), [rh, rw])

    def epilogue(acc: Expr, *phys: Var) -> Expr:
        return acc if kind == "max" else cast("f32", acc / count)

    y = compute("y", layout.domain((n_, c_, 1, 1)), body, epilogue=epilogue, dtype="f32")
    _schedule_pool(y, layout, target)
    return Kernel(name, [src.buffer], [y.out], [y])


def softmax_kernel(name: str, shape: tuple[int, ...], axis: int, target: Target) -> Kernel:
    """Softmax along `axis` of a plain tensor: row max, sum of exp(x - max), then exp(x - max) / sum.
    The tensor is viewed as (outer, axis, inner)."""
    axis %= len(shape)
    outer = int(np.prod(shape[:axis], dtype=np.int64))
    mid = shape[axis]
    inner = int(np.prod(shape[axis + 1:], dtype=np.int64))
    x = Buffer("x", (outer, mid, inner))
    r1, r2 = reduce_axis(mid, "r1"), reduce_axis(mid, "r2")
    mx = compute("row_max", (outer, inner), lambda i, j: reduce_max(x[i, r1, j], [r1]))
    total = compute("row_sum", (outer, inner), lambda i, j: reduce_sum(exp(x[i, r2, j] - mx[i, j]), [r2]))
    y = compute("y", (outer, mid, inner), lambda i, k, j: exp(x[i, k, j] - mx[i, j]) / total[i, j])
    for st in (mx, total):
        i, j, r = st.leaves
        st.reorder(i, r, j)
        if j.extent > 1:
            st.vectorize(j)
        if st.out.size * mid >= 1 << 16:
            st.parallel(i)
    schedule_elementwise(y, target)
    return Kernel(name, [x], [y.out], [mx, total, y])
