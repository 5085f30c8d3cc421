"""Convolutions and dense layers on the GEMM core.

The compute, in rows (see :mod:`weft.compiler.backend.te`; a dense layer is a convolution whose kernel
covers its 1x1 or flattened image)::

    out[n, oB, oh, ow, so] += inp[n, iB, oh*sh + ky - pt, ow*sw + kx - pl, si]
                              * wgt[oB*ro + so, iB*ri + si, ky, kx]

with ``n`` batch blocks, ``oB``/``iB`` channel blocks of the packed layout and ``so``/``si`` the GEMM
blocks inside one (``ro = block / block_out``, ``ri = block / block_in``). The element loops inside each
row are the GEMM intrinsic itself. After the schedule's splits, one stage of a task loads the input
window of its tile (the DMA pads the borders, asymmetric pads included) and the weights of its channel
tiles, and runs the tile body as a single GEMM instruction: the folder puts the two largest axes into the
instruction's loops and enumerates the rest as micro-ops with a spatial axis innermost. A grouped
convolution adds an outer super-group axis ``gS``: each output block reduces over its super-group's input
blocks only (:mod:`weft.compiler.groups`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from functools import cached_property

import numpy as np

from weft.compiler.backend import alu
from weft.compiler.backend.dma import box_transfers, merge
from weft.compiler.backend.program import Insn, Stream
from weft.compiler.backend.schedule import every_other_row, pool_slots, shared_tiles
from weft.compiler.backend.te import Access as A
from weft.compiler.backend.te import Axis, Box, Compute, Kernel, Nest, tile_box
from weft.compiler.backend.te import var as v
from weft.compiler.backend.tiles import RESIDUAL_LOADS, WEIGHT_PIECE, Lowering, piece_note
from weft.isa.constants import AluOp, MemId, Unit
from weft.isa.encoding import UOP_DTYPE

__all__ = ["ConvLowering"]


def _reduction_part(nest: Nest, part: str) -> Nest:
    """The executions of a tile body whose one multi-valued reduction axis is at its first value ("first"),
    or at the others ("rest")."""
    (axis,) = [a for a in nest.axes if a.reduce and a.extent > 1]
    return nest.restrict({axis.name: (0, 1) if part == "first" else (1, axis.extent)})


class ConvLowering(Lowering):
    kind = "conv"

    def declare(self) -> Compute:
        g = self.g
        top, left = g.pads[0], g.pads[1]
        # A grouped convolution's super-group gS reads input blocks gS*icb + iB and writes output blocks
        # gS*ocb + oB; its weights are stacked along the output axis (see weft.compiler.groups).
        grouped = g.groups > 1
        gs = (Axis("gS", g.groups),) if grouped else ()
        o_blk = v("gS") * g.ocb + v("oB") if grouped else v("oB")
        i_blk = v("gS") * g.icb + v("iB") if grouped else v("iB")
        # every_other_row: the input is the view of its every sh-th row (ho rows; its load strides over the rest)
        sh, h = (1, g.ho) if every_other_row(g) else (g.sh, g.h)
        axes = (*gs, Axis("n", g.nb), Axis("oB", g.ocb), Axis("so", g.ro), Axis("oh", g.ho), Axis("ow", g.wo),
                Axis("iB", g.icb, True), Axis("si", g.ri, True), Axis("ky", g.kh, True), Axis("kx", g.kw, True))
        accesses = {
            "out": A("out", (v("n"), o_blk, v("oh"), v("ow"), v("so"))),
            "inp": A("inp", (v("n"), i_blk, v("oh") * sh + v("ky") - top, v("ow") * g.sw + v("kx") - left,
                             v("si"))),
            "wgt": A("wgt", (o_blk * g.ro + v("so"), v("iB") * g.ri + v("si"), v("ky"), v("kx"))),
        }
        ocb = g.ocb * g.groups
        shapes = {"out": (g.nb, ocb, g.ho, g.wo, g.ro), "inp": (g.nb, g.icb * g.groups, h, g.w, g.ri),
                  "wgt": (ocb * g.ro, g.icb * g.ri, g.kh, g.kw)}
        return Compute(self.name, axes, accesses, shapes)

    @cached_property
    def inp_strides(self) -> tuple[int, ...] | None:
        """DRAM rows per step of the input view's dimensions (None: the dense input)."""
        g = self.g
        if not every_other_row(g):
            return None
        return (g.icb * g.groups * g.h * g.w * g.ri, g.h * g.w * g.ri, g.sh * g.w * g.ri, g.ri, 1)

    def reduce_axes(self) -> list[str]:
        return ["iB.i", "si", self.ky, "kx"]

    @cached_property
    def boxes(self) -> tuple[Box, Box]:
        """The input window and the weights one stage loads."""
        return tile_box(self.compute, "inp", self.inner), tile_box(self.compute, "wgt", self.inner)

    def validate(self) -> None:
        c, v = self.config, self.s.vthreads
        inp_box, wgt_box = self.boxes
        extra = 1 if self.copies_by_gemm else 0  # the residual tile (inp) and the identity matrix (wgt)
        for what, rows, limit in (("input window", inp_box.rows + extra * self.tile_rows, c.inp_rows // v),
                                  ("weight tile", wgt_box.rows + extra, c.wgt_rows // v)):
            if rows > limit:
                raise ValueError(f"layer '{self.name}': the {what} needs {rows} rows, a thread has {limit}")
        g, s = self.g, self.s
        if g.pool and (s.tile_n != 1 or s.tile_h != 1 or s.tile_w != g.wo or self.slots != 1 or v > 2
                       or g.residual or g.groups > 1 or (s.order != "oc_outer" and s.tile_oc != g.ocb)):
            raise ValueError(f"layer '{self.name}': a fused max-pool takes tiles of one whole output row, in "
                             "order, one tile a thread, no residual")

    def pool_rows(self) -> int:
        if not self.g.pool:
            return 0
        return pool_slots(self.g, self.s) * self.g.pooled_hw[1] * self.s.tile_oc * self.g.ro

    @cached_property
    def weight_slots(self) -> int:
        """Weight tiles a thread holds at once: one, or one per reduction step of a task where they all fit
        its slice (with the identity matrix after them). Each step's weights then have rows of their own
        and stay resident from task to task while the output-channel tile is the same, instead of being
        loaded again at every step (a 7x7 first layer whose input row does not fit at once, split into two
        steps, read its 10 KiB of weights again for every output row)."""
        g, s = self.g, self.s
        steps = self.stages()
        pixel_tiles = (g.nb // s.tile_n) * (g.ho // s.tile_h) * (g.wo // s.tile_w)
        if not self.options["stage_weights"] or steps < 2 or any(shared_tiles(g, s)) or s.order != "oc_outer" \
                or pixel_tiles <= s.vthreads:
            return 1  # (no thread runs two tasks with the same weights in a row)
        _, wgt_box = self.boxes
        extra = 1 if self.copies_by_gemm else 0
        return steps if steps * wgt_box.rows + extra <= self.config.wgt_rows // s.vthreads else 1

    @cached_property
    def stage_inputs(self) -> bool:
        """Option ``stage_inputs``: where every task has the same pixels (one pixel tile, so both threads'
        tasks read the same input windows step by step) in several reduction steps, each step's window is
        loaded once, into the slice of thread ``step % 2``, and both threads read it, instead of each loading
        it into its own (ResNet's layer4 shortcut read its input twice, and is bound by its DRAM bytes)."""
        return bool(self.options["stage_inputs"]) and self.stage_inputs_apply

    @cached_property
    def stage_inputs_apply(self) -> bool:
        """Whether option ``stage_inputs`` changes this layer's program."""
        g, s = self.g, self.s
        pixel_tiles = (g.nb // s.tile_n) * (g.ho // s.tile_h) * (g.wo // s.tile_w)
        return self.v == 2 and pixel_tiles == 1 and self.stages() > 1 and s.order == "oc_outer" \
            and g.groups == 1 and not g.pool

    def weight_row(self, stage: int) -> int:
        """The first row, from the thread's weight slice, of the weights of reduction step `stage`."""
        return (stage % self.weight_slots) * self.boxes[1].rows

    def identity_row(self, thread: int) -> int:
        """The weight row of the identity matrix (residual copies), after the thread's weight tiles."""
        return self.regions(thread).wgt + self.weight_slots * self.boxes[1].rows

    def emit_stage(self, stream: Stream, point: dict[str, int], stage: int, thread: int) -> None:
        mark = len(stream.insns)
        self._emit_stage(stream, point, stage, thread)
        if self.options["residual_first"]:
            _residual_before_pieces(stream.insns, mark)

    def _emit_stage(self, stream: Stream, point: dict[str, int], stage: int, thread: int) -> None:
        r = self.regions(thread)
        inp_box, wgt_box = self.boxes
        # A tile every task reads (shared_tiles) lives once, in thread 0's slice, and is loaded once.
        share_inp, share_wgt = shared_tiles(self.g, self.s)
        at_i, at_w = (0 if share_inp else thread), (0 if share_wgt else thread)
        if self.stage_inputs:  # (each step's window once, in the threads' slices by turns)
            at_i = stage % self.v
        inp_at, wgt_at = self.regions(at_i).inp, self.regions(at_w).wgt + self.weight_row(stage)
        wgt_key = "wgt" if self.weight_slots == 1 else f"wgt{stage}"
        slot_key: tuple = () if self.weight_slots == 1 else ("weights", stage % self.weight_slots)
        self.load_box(stream, "inp", MemId.INP, self.addrs.inp, inp_box, point, inp_at, at_i, "input window",
                      strides=self.inp_strides)
        assert self.addrs.wgt is not None
        pieces = self.weight_pieces(wgt_box, point, at_w, wgt_key)
        for lo, hi in pieces:
            self.load_box(stream, wgt_key, MemId.WGT, self.addrs.wgt, wgt_box, point, wgt_at, at_w,
                          "weights" + piece_note(lo, hi), reuse=False, part=(lo * self.g.ro, hi * self.g.ro))
        if not pieces:
            self.load_box(stream, wgt_key, MemId.WGT, self.addrs.wgt, wgt_box, point, wgt_at, at_w, "weights")
        if stage == 0:
            args = (stream, self.compute.shapes["out"], self.addrs.residual, self.out_box.origin_at(point),
                    self.out_box.extent, r.inp + inp_box.rows)
            if self.residual_by_gemm:
                # Loaded before the task's GEMMs, so the load hides behind them; the epilogue's GEMM adds it.
                self.load_for_copy(*args, self.identity_row(thread), thread, RESIDUAL_LOADS[0])
            elif self.g.residual and self.copies_by_gemm and not self.residual_alu:
                # Before the task's GEMMs rather than in the epilogue: the loads that later overwrite the
                # residual's rows then wait on the task's last GEMM, one token for both (each thread's
                # outstanding tokens stay within the queue depth).
                self.copy_in(*args, r.res, self.identity_row(thread), thread, RESIDUAL_LOADS[0])
            if self.bias_start is not None:
                self.load_vectors(stream, point, thread)
                alu.start_from(stream, self.bias_start, self.out_tile(thread), r.vec, self.kernel, thread)
            elif not self.first_step_overwrites:  # else the body's first step overwrites the tile, below
                self.reset(stream, thread)
            if self.residual_alu:
                # After the tile's start: the copy is the GEMM pipe's first work of the stage, before which the
                # other thread's epilogue goes (Lowering.lower), so that epilogue runs beside it on the ALU.
                self.copy_in(*args, r.res, self.identity_row(thread), thread, RESIDUAL_LOADS[0])

        def nest() -> Nest:
            axes = tuple(a for a in self.compute.axes if a.name in self.inner)
            return Nest(axes, self.out_box.sram(r.tile), inp_box.sram(inp_at), wgt_box.sram(wgt_at))

        # (option interleave_first: the second thread's first GEMMs in the pieces of the weights it shares
        # with the first thread's first task, which Lowering.lower interleaves)
        pieces = pieces or self.shared_pieces(stage, thread)
        if self.final_stage and self.options["epilogue_pieces"]:
            # (the thread's last GEMMs in pieces, loaded so or not, for the epilogue's pieces to follow)
            pieces = pieces or self.piece_bounds(int(self.options["last_pieces"]))
            self.final_bounds[thread] = pieces
        if pieces:  # a GEMM per piece of the weights, each waiting for its own load only
            for lo, hi in pieces:
                def part_nest(lo: int = lo, hi: int = hi) -> Nest:
                    return nest().restrict({"oB.i": (lo, hi)})

                self.emit_body(stream, part_nest, stage, thread, (*slot_key, "inp", at_i, "blocks", lo, hi),
                               piece_note(lo, hi))
            return
        self.emit_body(stream, nest, stage, thread, (*slot_key, "inp", at_i))

    def emit_body(self, stream: Stream, nest: Callable[[], Nest], stage: int, thread: int, key: tuple = (),
                  note: str = "") -> None:
        """The tile body's GEMMs: the first reduction step overwriting the tile, then the rest, where the
        tile starts from it; else the body (:meth:`body`); `key` names its kernels (a piece of the tile)."""
        if stage == 0 and self.first_step_overwrites:
            first, rest = (self.kernel((part, thread, *key), lambda part=part: alu.fold_body(
                _reduction_part(nest(), part), self.config)) for part in ("first", "rest"))
            stream.gemm(first, overwrite=True, note=f"convolution tile, first step{note}")
            stream.gemm(rest, note=f"convolution tile{note}")
            return
        self.body(stream, nest, thread, lambda k: stream.gemm(k, note=f"convolution tile{note}"), key)

    def weight_pieces(self, wgt_box: Box, point: dict[str, int], at: int, key: str = "wgt") -> list[tuple[int, int]]:
        """The program's first weights, in pieces of output blocks ``[lo, hi)`` of the tile (option
        ``weight_pieces``), each loaded by its own DMA and multiplied by its own GEMM, so that the first GEMM
        waits for its piece instead of the whole tile: every later stage's loads hide behind the GEMMs before
        them, the first one's do not; and each thread's last weights (option ``last_pieces``), after which
        only the last piece's GEMM remains. Empty where the weights come whole: another piece count, a tile
        of one output block, pieces of one row (their reduction is no single instruction), weights a thread
        holds already, a grouped convolution."""
        first = not any(r.get(key) is not None for r in self.resident)
        # (option last_pieces: a thread's last weights too, where they are loaded: the GEMMs after the last
        # load then wait for its last piece only)
        last = self.final_stage and self.resident[at].get(key) != wgt_box.origin_at(point)
        option = "weight_pieces" if first else "last_pieces" if last else ""
        pieces = self.piece_bounds(int(self.options[option]) if option else 1)
        if first:
            self.first_pieces = pieces
        return pieces

    def piece_bounds(self, count: int) -> list[tuple[int, int]]:
        """The tile's output blocks in `count` pieces ``[lo, hi)``, where its GEMMs can be so split (none
        for one piece, a tile of one output block, pieces of one row, whose reduction is no single
        instruction, or a grouped convolution)."""
        count = min(count, self.s.tile_oc)
        if (count < 2 or self.tile_rows < 2 * self.s.tile_oc or self.g.groups > 1
                or dict(self.boxes[1].inner[0].coef).get("oB.i") != self.g.ro):
            return []
        return list(itertools.pairwise(self.s.tile_oc * k // count for k in range(count + 1)))

    def shared_pieces(self, stage: int, thread: int) -> list[tuple[int, int]]:
        """The first thread's first pieces of weights, for another thread's first task, which reads the same
        weights (shared_tiles), where option ``interleave_first`` asks for it; else none."""
        if not self.options["interleave_first"] or stage or not thread or self.tasks_begun[thread] != 1 \
                or not shared_tiles(self.g, self.s)[1]:
            return []
        return self.first_pieces

    @cached_property
    def first_step_overwrites(self) -> bool:
        """A tile without a bias to start from starts from its first reduction step, written by a GEMM that
        overwrites, instead of from a reset: where one reduction axis has several values (the rest are one
        more GEMM instruction) and the tile has more than one row."""
        if self.single or self.bias_start is not None:
            return False
        several = [a for a in self.compute.axes if a.name in self.inner and a.reduce and a.extent > 1]
        return len(several) == 1

    @cached_property
    def bias_start(self) -> tuple | None:
        """The bias a tile starts from instead of zero (not for a one-row tile, whose spare row the
        reduction also sums into)."""
        return None if self.single else alu.bias_start(self.steps)

    def epilogue_steps(self) -> tuple[tuple, int]:
        steps = tuple(self.steps)
        if self.residual_alu:  # the copy's identity matrix carries the residual's scale already
            steps = tuple(("residual", ()) if kind == "residual" else (kind, op) for kind, op in steps)
        if self.bias_start is None:
            return steps, 0
        return steps[1:], (1 if self.bias_start[0] == "add_vec" else 0)

    def residual_gemm(self, h: int) -> Callable[[Stream, alu.Tile], None] | None:
        if not self.residual_by_gemm:
            return None
        r = self.regions(h)
        inp_box = self.boxes[0]

        def add(stream: Stream, target: alu.Tile) -> None:
            self.copy_gemm(stream, r.inp + inp_box.rows, target.base, self.identity_row(h), target.rows, h,
                           "add the residual (scaled identity)")

        return add

    def finish_body(self, stream: Stream, h: int) -> None:
        self.combine(stream, h, AluOp.ADD)

    # ---- a fused max-pool --------------------------------------------------------------------------------
    def lower(self) -> Stream:
        #: (n, output-channel tile, row) -> (thread, slot) of each pooled row a thread keeps
        self._pooled: dict[tuple[int, int, int], tuple[int, int]] = {}
        self._pool_count = [0] * self.v
        #: Each thread's last weight pieces, by thread (option epilogue_pieces)
        self.final_bounds: dict[int, list[tuple[int, int]]] = {}
        #: The first weights' pieces (option interleave_first)
        self.first_pieces: list[tuple[int, int]] = []
        return super().lower()

    def emit_epilogue(self, stream: Stream, point: dict[str, int], h: int) -> None:
        """The epilogue; with a fused max-pool, the tile (one output row) is not stored but pooled: its
        windows' columns into one of the thread's pooled rows, then each output row of the pool whose
        window ends here from the pooled rows of its window (the thread's own and the other's latest),
        which is stored. The pooling runs beside the other thread's next GEMM (the epilogue's tail)."""
        if self.from_last < int(self.options["epilogue_pieces"]) and self._epilogue_in_pieces(h):
            self._epilogue_by_pieces(stream, point, h)
            return
        if not self.g.pool:
            super().emit_epilogue(stream, point, h)
            return
        g, s, r = self.g, self.s, self.regions(h)
        self.finish_body(stream, h)
        self.load_vectors(stream, point, h)
        tile = self.out_tile(h)
        steps, first_vector = self.epilogue_steps()
        alu.epilogue(stream, steps, tile, tile.at(r.res), r.vec, s.tile_oc * g.ro, self.kernel, h, None,
                     first_vector)
        self.epilogue_tail = len(stream.insns)
        self._pool_row(stream, point, h)

    def _epilogue_in_pieces(self, h: int) -> bool:
        """Option ``epilogue_pieces``, for the program's last epilogue (1) or each thread's (2): where the
        thread's last GEMMs come in pieces (of its last weights, option ``last_pieces``, or of the tile), each
        piece's epilogue and store go after the piece's GEMM, so that the stores begin before the last GEMM
        ends (one tile of one image, no residual or pool, an epilogue each thread holds for the other's
        stage)."""
        g, s = self.g, self.s
        return bool(self.options["epilogue_pieces"]) and bool(self.final_bounds.get(h)) and s.tile_n == 1 \
            and not g.residual and not g.pool and not self.own_stage and not (self.single and self.alternated)

    def _epilogue_by_pieces(self, stream: Stream, point: dict[str, int], h: int) -> None:
        self.finish_body(stream, h)
        self.load_vectors(stream, point, h)
        for lo, hi in self.final_bounds[h]:
            self.epilogue_pieces.append((len(stream.insns), piece_note(lo, hi)))
            self.epilogue_blocks(stream, point, h, (lo, hi))

    def _slot_rows(self) -> int:
        return self.g.pooled_hw[1] * self.s.tile_oc * self.g.ro

    def _pooled_at(self, thread: int, slot: int) -> int:
        return self._regions[thread][0].pool + slot * self._slot_rows()

    def _pool_row(self, stream: Stream, point: dict[str, int], h: int) -> None:
        g, s = self.g, self.s
        k, st, pad = g.pool
        hp, wp = g.pooled_hw
        ro, toc = g.ro, s.tile_oc
        n, oc_tile, row = point["n.o"], point["oB.o"], point["oh.o"]
        slots = pool_slots(g, s)
        slot = self._pool_count[h] % slots
        self._pool_count[h] += 1
        dst, src = self._pooled_at(h, slot), self.regions(h).tile
        # Columns: pooled column c is the max of tile columns st*c - pad + j, j < k, those inside the row. The
        # first pass (j = pad: column st*c, inside for every c) moves, the others take the max.
        for j in (pad, *[j for j in range(k) if j != pad]):
            c0, c1 = max(0, -(-(pad - j) // st)), min(wp, (g.wo - 1 + pad - j) // st + 1)
            if c1 <= c0:
                continue
            key = ("pool_cols", h, slot, j)

            def build(c0: int = c0, c1: int = c1, j: int = j) -> Kernel:
                uops = np.zeros(ro, dtype=UOP_DTYPE)
                uops["dst"] = dst + c0 * ro + np.arange(ro)
                uops["src"] = src + (st * c0 - pad + j) * ro + np.arange(ro)
                return Kernel(uops, c1 - c0, toc, (ro, wp * ro), (st * ro, g.wo * ro), (0, 0))

            stream.alu(AluOp.MOV if j == pad else AluOp.MAX, self.kernel(key, build),
                       note=f"pool the columns of output row {row}")
        self._pooled[(n, oc_tile, row)] = (h, slot)
        # Rows: each pooled row whose window ends at this row (or in the bottom padding after it).
        for out_row in range(hp):
            lo, last = max(0, st * out_row - pad), min(g.ho - 1, st * out_row - pad + k - 1)
            if last != row:
                continue
            window = [self._pooled[(n, oc_tile, x)] for x in range(lo, row)]
            own = [at for at in window if at[0] == h]
            into = own[0] if own else (h, (slot + 1) % slots)  # a row of ours the later windows do not need
            # (into holds an own row of the window already, or this row after the MOV below)
            sources = [at for at in window if at != into] + ([(h, slot)] if own else [])
            sources.sort(key=lambda at: at[0] != h)  # the other thread's row last: it cannot run beside
            rows = self._slot_rows()
            target = self._pooled_at(*into)
            if not own:
                stream.alu(AluOp.MOV, alu.rows_kernel(target, rows, self._pooled_at(h, slot)),
                           note=f"pool output row {out_row}")
            for at in sources:
                stream.alu(AluOp.MAX, alu.rows_kernel(target, rows, self._pooled_at(*at)),
                           note=f"pool output row {out_row}")
            shape = (g.nb, g.ocb * g.groups, hp, wp, ro)
            moves = box_transfers(self.config, MemId.OUT, shape, self.addrs.out, (n, oc_tile * toc, out_row, 0, 0),
                                  (1, toc, 1, wp, ro), target)
            for t in merge(self.config, moves):
                stream.transfer(t, note="store the pooled output row")

    def load_residual(self, stream: Stream, point: dict[str, int], h: int) -> None:
        if not self.copies_by_gemm:  # else the task's first stage loaded it
            super().load_residual(stream, point, h)


def _residual_before_pieces(insns: list[Insn], start: int) -> None:
    """Move the residual's loads of the stage from `start` (and the identity matrix that copies it) ahead
    of its weights loaded in pieces (in place): the residual's copy is the stage's first GEMM, which else
    waited for every piece instead of the pieces' GEMMs each for its own (ResNet's layer1 conv2 began 8 k
    cycles late). They write rows of their own, which nothing between reads."""
    loads = [k for k in range(start, len(insns)) if insns[k].unit == Unit.LOAD]
    pieces = [k for k in loads if insns[k].note.startswith(WEIGHT_PIECE)]
    if not pieces:
        return
    late = [k for k in loads if k > pieces[0] and insns[k].note in RESIDUAL_LOADS]
    moved = [insns[k] for k in late]
    for k in reversed(late):
        del insns[k]
    insns[pieces[0]:pieces[0]] = moved
