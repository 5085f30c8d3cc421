"""Pooling and element-wise layers on the tensor ALU.

Pooling, in rows of the accumulator (the input is loaded as sign-extended ``acc_narrow`` rows)::

    out[n, oB, oh, ow, so] = max or sum over ky, kx of win[n, oB, oh*sh + ky - pt, ow*sw + kx - pl, so]

Each task loads the input window of its tile, zeroes the output tile and runs the body as one ALU
instruction (MAX or ADD over shifted windows), then the epilogue (average pooling: the requantization).
Where the window comes in through the load unit and needs no offset (:func:`pool_reads_inp`), the ALU
reads it straight from the inp rows instead: the tile starts as the window's first tap (MOV) and pools
the others, one execution a cycle, with no accumulator copy of the window.

Max-pooling pads must never win, but the DMA pads with zeros. When the input is proven non-negative (the
layer that makes it ends in a ReLU-like clamp) and every window holds a real element, zeros cannot win.
Otherwise the tile runs in an offset domain, exactly: the window's real rows get ``+2**(w-1)`` (so every
value is >= 0 and the padding's 0 stands for the smallest int), and the result gets ``-2**(w-1)`` back.

Element-wise layers (residual adds, channel affines, clamps) load their input tile straight into the
output tile and run the epilogue.
"""

from __future__ import annotations

from functools import cached_property

from weft.compiler.backend import alu
from weft.compiler.backend.dma import box_transfers, merge
from weft.compiler.backend.program import Stream
from weft.compiler.backend.schedule import pool_reads_inp, pools_offset, separable, windows_all_real
from weft.compiler.backend.te import Access as A
from weft.compiler.backend.te import Axis, Box, Compute, Expr, Kernel, Nest, fold, tile_box
from weft.compiler.backend.te import var as v
from weft.compiler.backend.tiles import Lowering
from weft.isa.constants import AluOp, MemId

__all__ = ["EltwiseLowering", "PoolLowering", "windows_all_real"]


class PoolLowering(Lowering):
    kind = "pool"

    def declare(self) -> Compute:
        g = self.g
        top, left = g.pads[0], g.pads[1]
        axes = (Axis("n", g.nb), Axis("oB", g.ocb), Axis("so", g.ro), Axis("oh", g.ho), Axis("ow", g.wo),
                Axis("ky", g.kh, True), Axis("kx", g.kw, True))
        accesses = {
            "out": A("out", (v("n"), v("oB"), v("oh"), v("ow"), v("so"))),
            "win": A("in", (v("n"), v("oB"), v("oh") * g.sh + v("ky") - top, v("ow") * g.sw + v("kx") - left,
                            v("so"))),
        }
        shapes = {"out": (g.nb, g.ocb, g.ho, g.wo, g.ro), "in": (g.nb, g.icb, g.h, g.w, g.ro)}
        return Compute(self.name, axes, accesses, shapes)

    def reduce_axes(self) -> list[str]:
        return ["ky", "kx"]

    @cached_property
    def win_box(self) -> Box:
        return tile_box(self.compute, "win", self.inner)

    def window_rows(self) -> int:
        return 0 if self.reads_inp else self.win_box.rows

    @cached_property
    def reads_inp(self) -> bool:
        """Whether the ALU pools straight from the inp rows the load unit filled (:func:`pool_reads_inp`)."""
        return self.copies_by_gemm and pool_reads_inp(self.g, self.s, self.config)

    @property
    def is_max(self) -> bool:
        return self.g.kind == "maxpool"

    @property
    def offset(self) -> int:
        """The shift into the domain where zero padding is the smallest value (0 when not needed)."""
        return 1 << (self.config.out_width - 1) if pools_offset(self.g) else 0

    def _valid_kernel(self, box: Box, origin: tuple[int, ...], base: int) -> Kernel | None:
        """The rows of the loaded window that hold input values (not padding), as one ALU kernel."""
        shape = self.compute.shapes["in"]
        lo = [max(0, -o) for o in origin]
        hi = [min(e, s - o) for o, e, s in zip(origin, box.extent, shape, strict=True)]
        counts = [h - lw for lw, h in zip(lo, hi, strict=True)]
        if min(counts) <= 0:
            return None
        names = ["n", "c", "y", "x", "s"]
        strides = box.strides()
        axes = tuple(Axis(nm, ct) for nm, ct in zip(names, counts, strict=True))
        start = base + sum(lw * st for lw, st in zip(lo, strides, strict=True))
        dst = Expr(tuple((nm, st) for nm, st in zip(names, strides, strict=True)), start)
        return fold(Nest(axes, dst), max_uops=self.config.uop_rows)

    def validate(self) -> None:
        c, v = self.config, self.s.vthreads
        if self.copies_by_gemm and self.win_box.rows > c.inp_rows // v:
            raise ValueError(f"layer '{self.name}': the input window needs {self.win_box.rows} inp rows, a thread "
                             f"has {c.inp_rows // v}")

    def emit_stage(self, stream: Stream, point: dict[str, int], stage: int, thread: int) -> None:
        r = self.regions(thread)
        box = self.win_box
        if self.reads_inp:
            self._pool_from_inp(stream, point, thread)
            return
        if self.copies_by_gemm:
            self.copy_in(stream, self.compute.shapes["in"], self.addrs.inp, box.origin_at(point), box.extent, r.inp,
                         r.win, r.wgt, thread, "input window")
        else:  # the offset changes the window in place: never reused
            self.load_box(stream, "win", MemId.ACC_NARROW, self.addrs.inp, box, point, r.win, thread,
                          "input window", reuse=False)
        if self.offset:
            origin = box.origin_at(point)
            k = self.kernel(("valid", thread, origin), lambda: self._valid_kernel(box, origin, r.win))
            if k is not None:
                alu.add_imm(stream, self.config, k, self.offset, "offset the window's real rows")
        split_rows = separable(self.g, self.s)
        if split_rows:
            self.reduce_window_rows(stream, thread)
        self.reset(stream, thread)

        def nest() -> Nest:
            # (separable: the rows are reduced into each window's first column, kx = 0)
            axes = tuple(a for a in self.compute.axes if a.name in self.inner and not (split_rows and a.name == "kx"))
            return Nest(axes, self.out_box.sram(r.tile), box.sram(r.win))

        op = AluOp.MAX if self.is_max else AluOp.ADD
        self.body(stream, nest, thread, lambda k: stream.alu(op, k, note="pool over the window"))

    def _pool_from_inp(self, stream: Stream, point: dict[str, int], h: int) -> None:
        """The window into inp rows, then the tile = its first tap (MOV), then op= every other tap: the
        first kernel row's other columns, then the other rows (each pass one ALU instruction reading inp)."""
        r, box, g = self.regions(h), self.win_box, self.g
        for t in merge(self.config, box_transfers(self.config, MemId.INP, self.compute.shapes["in"], self.addrs.inp,
                                                  box.origin_at(point), box.extent, r.inp)):
            stream.transfer(t, note="input window")
        axes = tuple(a for a in self.compute.axes if a.name in self.inner)
        whole = Nest(axes, self.out_box.sram(r.tile), box.sram(r.inp))
        op = AluOp.MAX if self.is_max else AluOp.ADD
        parts = ((AluOp.MOV, (0, 1), (0, 1), "the window's first tap"),
                 (op, (0, 1), (1, g.kw), "pool over the window's first row"),
                 (op, (1, g.kh), (0, g.kw), "pool over the window's other rows"))
        for alu_op, ky, kx, note in parts:
            if ky[1] > ky[0] and kx[1] > kx[0]:
                k = self.kernel(("taps", h, ky, kx), lambda ky=ky, kx=kx: alu.fold_body(
                    whole.restrict({"ky": ky, "kx": kx}), self.config))
                stream.alu(alu_op, k, note=note, src_inp=True)

    def reduce_window_rows(self, stream: Stream, h: int) -> None:
        """The max over each window's columns, in place into its first column: passes k = kw-2 .. 0 set
        column ``x*sw + k`` to the max of itself and column ``x*sw + k + 1`` (the first pass reads the column
        the next window shares before that window's last pass changes it)."""
        g, s, box, base = self.g, self.s, self.win_box, self.regions(h).win
        strides = box.strides()  # the window box: n, c, y, x, so
        axes = (Axis("n", s.tile_n), Axis("c", s.tile_oc), Axis("y", box.extent[2]), Axis("x", s.tile_w),
                Axis("so", g.ro))
        coef = (("n", strides[0]), ("c", strides[1]), ("y", strides[2]), ("x", g.sw * strides[3]), ("so", strides[4]))
        for k in range(g.kw - 2, -1, -1):
            def build(k: int = k) -> Kernel:
                dst = Expr(coef, base + k * strides[3])
                return fold(Nest(axes, dst, dst + strides[3]), max_uops=self.config.uop_rows)

            stream.alu(AluOp.MAX, self.kernel(("row max", h, k), build), note="pool over the window's columns")

    def finish_body(self, stream: Stream, h: int) -> None:
        self.combine(stream, h, AluOp.MAX if self.is_max else AluOp.ADD)
        if self.offset:
            r = self.regions(h)
            k = self.kernel(("rows", h, r.tile), lambda: alu.rows_kernel(r.tile, self.tile_rows))
            alu.add_imm(stream, self.config, k, -self.offset, "undo the offset")


class EltwiseLowering(Lowering):
    kind = "eltwise"

    def declare(self) -> Compute:
        g = self.g
        idx = (v("n"), v("oB"), v("oh"), v("ow"), v("so"))
        axes = (Axis("n", g.nb), Axis("oB", g.ocb), Axis("so", g.ro), Axis("oh", g.ho), Axis("ow", g.wo))
        shape = (g.nb, g.ocb, g.ho, g.wo, g.ro)
        return Compute(self.name, axes, {"out": A("out", idx), "x": A("in", idx)}, {"out": shape, "in": shape})

    def emit_stage(self, stream: Stream, point: dict[str, int], stage: int, thread: int) -> None:
        r = self.regions(thread)
        box = self.out_box  # the input tile has the output tile's shape and place
        self.load_box(stream, "x", MemId.ACC_NARROW, self.addrs.inp, box, point, r.tile, thread, "input tile",
                      reuse=False)  # the epilogue works in place
        if not self.steps:  # the out rows are written by ALU ops only: write them once
            k = self.kernel(("rows", thread, r.tile), lambda: alu.rows_kernel(r.tile, self.tile_rows))
            stream.alu(AluOp.ADD, k, imm=0, note="narrow the tile")
