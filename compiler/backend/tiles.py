"""Lowering one accelerator layer: the scheduled loop nest over tiles, virtual threads, buffer regions.

Every layer kind (:mod:`~weft.compiler.backend.conv` for convolutions and dense layers,
:mod:`~weft.compiler.backend.alu` for pooling and element-wise layers) declares its computation as a
:class:`~weft.compiler.backend.te.Compute` over axes ``n, oB, so, oh, ow`` (batch blocks, output channel
blocks, GEMM output blocks inside a channel block, output rows and columns) plus its reduction axes. The
schedule splits ``n``, ``oB``, ``oh``, ``ow`` (and ``iB``) into tile loops (``.o``) and tile bodies
(``.i``); the outer loops enumerate *tasks*, one output tile each, which alternate between virtual threads.
A task runs a few *stages* (loads and the body's GEMM/ALU work; several when a convolution's input
channels are split), then its epilogue on the ALU and the stores of its output tile.

Each thread owns ``1/vthreads`` of the inp, wgt and acc buffers; its acc slice holds, in order, the output
tile, the residual tile (layers with a residual input), the per-channel vectors of the epilogue, a
spare row for one-row reductions, and (pooling) the input window. Tiles already in a thread's slice are
not loaded again (weights of the same output channels, inputs of the same pixels).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from weft.compiler.backend import alu
from weft.compiler.backend.dma import Transfer, box_transfers, merge
from weft.compiler.backend.program import Insn, Stream
from weft.compiler.backend.schedule import LayerGeom, Schedule, usage
from weft.compiler.backend.te import Box, Compute, Kernel, Nest, split, tile_box
from weft.compiler.backend.vthread import interleave
from weft.isa.constants import AluOp, MemId, Opcode, Unit
from weft.isa.encoding import UOP_DTYPE

if TYPE_CHECKING:
    from weft.config import AcceleratorConfig
    from weft.core.epilogue import Step

__all__ = ["DEFAULT_OPTIONS", "RESIDUAL_LOADS", "WEIGHT_PIECE", "Addresses", "Lowering", "Regions", "piece_note"]

#: A lowering's options (the code generator times other values per layer, :func:`~weft.compiler.backend.
#: codegen.lower_layer`): ``hold_epilogue`` (a tile's epilogue beside the other thread's next stage, else
#: with its own), ``epilogue_own_stage`` (with two tiles a thread: beside the same thread's next task),
#: ``weight_pieces`` (the first weights in this many loads, a GEMM each), ``tile_slots`` (output tiles a
#: thread), ``residual_alu`` (a residual the GEMM could add is copied, scaled, and added by the ALU),
#: ``stage_weights`` (each reduction step's weights in rows of their own, resident from task to task),
#: ``last_pieces`` (the last stage's weights of each thread in this many loads, a GEMM each),
#: ``interleave_first`` (weights every task shares, loaded in pieces: the two threads' first tasks take
#: each piece in turn), ``residual_first`` (a residual the GEMM copies loaded before weights in pieces),
#: ``stage_inputs`` (one pixel tile: each reduction step's input window once, for both threads),
#: ``epilogue_pieces`` (1: the program's last epilogue and store in the pieces of its last GEMMs; 2: each
#: thread's last).
DEFAULT_OPTIONS: dict[str, Any] = {"hold_epilogue": True, "epilogue_own_stage": False, "weight_pieces": 1,
                                   "tile_slots": 1, "residual_alu": False, "stage_weights": True,
                                   "last_pieces": 1, "interleave_first": False,
                                   "residual_first": False, "stage_inputs": False,
                                   "epilogue_pieces": 0}


@dataclass(frozen=True)
class Addresses:
    """DRAM rows of the layer's tensors, each in the row size of the memory that moves it: the input in
    inp rows (GEMM) or out rows (ALU layers, loaded as acc_narrow), the output and residual in out rows,
    weights in wgt rows, epilogue vectors in acc rows; `identity`: the wgt row of an identity matrix, for
    a residual copied in by the GEMM (:func:`~weft.compiler.backend.schedule.copies_by_gemm`)."""

    inp: int
    out: int
    residual: int | None = None
    wgt: int | None = None
    vec: int | None = None
    identity: int | None = None


@dataclass(frozen=True)
class Regions:
    """First rows of one thread's buffer slices."""

    inp: int
    wgt: int
    tile: int
    res: int
    vec: int
    spare: int
    win: int
    #: A fused max-pool's pooled rows (schedule.pool_slots of them, each a row of the tile's channel blocks).
    pool: int = 0


#: What the instructions the lowering moves after emitting them say they do (Insn.note), one definition for
#: the emitters and the passes that find them: a piece of a tile's output blocks (its GEMM's note ends with
#: piece_note, its weights' load starts with WEIGHT_PIECE), a residual tile's loads and the identity matrix
#: that copies it.
PIECE = ", output blocks "
WEIGHT_PIECE = "weights" + PIECE
RESIDUAL_LOADS = ("residual tile", "identity matrix")


def piece_note(lo: int, hi: int) -> str:
    return f"{PIECE}{lo}-{hi - 1}"


def _before_gemms(stage: list[Insn], epilogue: list[Insn], tail: int | None = None) -> list[Insn]:
    """The other thread's `stage` with `epilogue` before its first GEMM (after it when it has none); the
    epilogue's instructions from `tail` on go after the stage's last GEMM, to run beside it (the GEMM
    after them issues only once the last of them has: beside the longest of the stage's GEMMs, where
    the tile's first reduction step has a short one of its own)."""
    gemms = [k for k, x in enumerate(stage) if x.fields.get("opcode") == Opcode.GEMM]
    cut = gemms[0] if gemms else len(stage)
    if tail is None or not gemms:
        return [*stage[:cut], *epilogue, *stage[cut:]]
    last = gemms[-1] + 1
    return [*stage[:cut], *epilogue[:tail], *stage[cut:last], *epilogue[tail:], *stage[last:]]


def _piece_by_piece(first: list[Insn], second: list[Insn]) -> list[Insn] | None:
    """The two threads' first stages, each its start then one GEMM per piece of weights they share, as one
    stage taking the pieces in turn: both starts (the second thread's input load right after the first
    piece's load, the later pieces after it), then the first piece's GEMM of each thread, then the second's,
    and so on. Each piece's load then hides behind both threads' GEMMs of the piece before it, instead of
    the first thread's alone. None where the stages have another shape."""
    parts = []
    for stage in (first, second):
        gemms = [k for k, x in enumerate(stage) if x.fields.get("opcode") == Opcode.GEMM]
        if not gemms or gemms[-1] != len(stage) - 1 or gemms != list(range(gemms[0], len(stage))):
            return None
        parts.append((stage[:gemms[0]], stage[gemms[0]:]))
    (start_a, gemms_a), (start_b, gemms_b) = parts
    if len(gemms_a) != len(gemms_b) or len(gemms_a) < 2:
        return None
    loads_a = [x for x in start_a if x.unit == Unit.LOAD]
    pieces = [k for k, x in enumerate(loads_a) if x.note.startswith(WEIGHT_PIECE)]
    if len(pieces) != len(gemms_a):
        return None
    head = pieces[0] + 1
    return [*loads_a[:head], *(x for x in start_b if x.unit == Unit.LOAD), *loads_a[head:],
            *(x for x in start_a if x.unit != Unit.LOAD), *(x for x in start_b if x.unit != Unit.LOAD),
            *(x for pair in zip(gemms_a, gemms_b, strict=True) for x in pair)]


def _after_pieces(insns: list[Insn], start: int, pieces: list[tuple[int, str]]) -> None:
    """Move the epilogue from `start` (in place), in pieces each from its index in `pieces` (the first from
    `start`), after the last GEMM whose note ends with the piece's suffix: a piece's epilogue and store then
    run after its own GEMM, the store beside the next piece's GEMM, instead of all after the last one."""
    bounds = [start, *(at for at, _ in pieces[1:]), len(insns)]
    segments = [insns[a:b] for a, b in itertools.pairwise(bounds)]
    del insns[start:]
    for segment, (_, suffix) in zip(reversed(segments), reversed(pieces), strict=True):
        at = max(k for k, x in enumerate(insns) if x.fields.get("opcode") == Opcode.GEMM and x.note.endswith(suffix))
        insns[at + 1:at + 1] = segment


class Lowering:
    """Common machinery; subclasses define :meth:`declare`, :meth:`reduce_axes` and :meth:`emit_stage`."""

    kind = "layer"

    def __init__(self, name: str, geom: LayerGeom, sched: Schedule, config: AcceleratorConfig,
                 addrs: Addresses, steps: tuple[Step, ...], options: dict[str, Any] | None = None):
        self.name, self.g, self.s, self.config, self.addrs = name, geom, sched, config, addrs
        self.steps = steps
        unknown = sorted(set(options or {}) - set(DEFAULT_OPTIONS))
        if unknown:
            raise TypeError(f"unknown lowering option '{unknown[0]}' (known: {', '.join(DEFAULT_OPTIONS)})")
        self.options = {**DEFAULT_OPTIONS, **(options or {})}
        self.vectors = alu.vectors_of(steps)
        g, s = geom, sched
        c = self.declare()
        for axis, factor in (("n", s.tile_n), ("oB", s.tile_oc), ("oh", s.tile_h), ("ow", s.tile_w)):
            c = split(c, axis, factor)
        self.stage_axes: tuple[str, ...] = ()
        self.ky = "ky"
        if g.kind == "conv":
            c = split(c, "iB", s.tile_ic)
            self.stage_axes = ("iB.o",)
            if s.tile_kh is not None and s.tile_kh < g.kh:
                c = split(c, "ky", s.tile_kh)
                self.stage_axes = ("iB.o", "ky.o")
                self.ky = "ky.i"
        self.compute: Compute = c
        self.inner = ["n.i", "oB.i", "so", "oh.i", "ow.i", *self.reduce_axes()]
        pix = ["n.o", "oh.o", "ow.o"]
        oc = ["gS", "oB.o"] if g.groups > 1 else ["oB.o"]  # a grouped convolution's super-group, then its tile
        self.task_axes = [*oc, *pix] if s.order == "oc_outer" else [*pix, *oc]
        self.out_box: Box = tile_box(c, "out", self.inner)
        self.tile_rows = self.out_box.rows
        self.single = self.tile_rows == 1
        self.v = s.vthreads
        self.copies_by_gemm = usage(geom, sched, config).copies
        #: A residual the GEMM can add with the scaled identity: option ``residual_alu`` has the task's first
        #: stage copy it, scaled, into its own rows and the epilogue's ALU add it (beside the other thread's
        #: GEMMs, where the GEMM waits for the RQ before the residual GEMM); else the epilogue's GEMM adds it
        #: from inp rows (no accumulator rows of its own).
        scalable = bool(geom.residual_gemm and self.copies_by_gemm)
        self.residual_alu = scalable and bool(self.options["residual_alu"])
        self.residual_by_gemm = scalable and not self.residual_alu
        #: Output tiles per thread (option ``tile_slots``): with two, a thread's tasks alternate between two
        #: tiles, so the start of its next tile need not wait for the store of the last one.
        self.slots = int(self.options["tile_slots"])
        #: Option ``epilogue_own_stage``, where it applies (two threads, two tiles, no residual the epilogue
        #: reads from the thread's inp rows, which the next task's start loads again): a tile's epilogue goes
        #: after the start of the thread's next task, and each tile has its own residual, vector and spare
        #: rows (the next task's start loads its own).
        self.own_stage = bool(self.options["epilogue_own_stage"]) and self.v > 1 and self.slots > 1 \
            and not self.residual_by_gemm
        #: Whether every task has the same output channels: a thread's tiles then share its vector rows
        #: (loaded once, by the compute unit, which runs nothing beside a load).
        self.one_oc_tile = geom.groups == 1 and sched.tile_oc >= geom.ocb
        self._regions = [[self._layout(h, slot) for slot in range(self.slots)] for h in range(self.v)]
        self._slot = [0] * self.v
        self._kernels: dict[tuple, Kernel] = {}
        self.alternated = False
        self.validate()

    # ---- to be defined by layer kinds -------------------------------------------------------------------
    def declare(self) -> Compute:
        raise NotImplementedError

    def reduce_axes(self) -> list[str]:
        return []

    def window_rows(self) -> int:
        return 0

    def pool_rows(self) -> int:
        """Accumulator rows a thread keeps for a fused max-pool (after the tile's own)."""
        return 0

    def validate(self) -> None:
        """Raise ValueError when the schedule's tiles do not fit a thread's slices (beyond acc, checked
        by the region layout)."""

    def emit_stage(self, stream: Stream, point: dict[str, int], stage: int, thread: int) -> None:
        """Emit reduction step number `stage` of the task at `point` (which holds the step's axes too)."""
        raise NotImplementedError

    # ---- regions -----------------------------------------------------------------------------------------
    def _layout(self, h: int, slot: int = 0) -> Regions:
        c, v = self.config, self.s.vthreads
        acc0 = h * (c.acc_rows // v)
        tile = acc0
        res = tile + self.tile_rows
        vec = res + (self.tile_rows if self.g.residual and not self.residual_by_gemm else 0)
        spare = vec + len(self.vectors) * self.s.tile_oc * self.g.ro
        win = spare + (1 if self.single else 0)
        pool = win + self.window_rows()
        end = pool + self.pool_rows()
        if slot and self.own_stage:  # another tile with rows of its own for everything
            size = end - acc0
            shared_vec = vec
            tile, res, vec, spare, win, end = (x + slot * size for x in (tile, res, vec, spare, win, end))
            vec = shared_vec if self.one_oc_tile else vec
        elif slot:  # another tile after the rest of the slice, which both tiles share
            tile, end = end + (slot - 1) * self.tile_rows, end + slot * self.tile_rows
        limit = acc0 + c.acc_rows // v
        if end > limit:
            raise ValueError(f"layer '{self.name}': the tile needs {end - acc0} accumulator rows, the thread has "
                             f"{c.acc_rows // v}")
        return Regions(h * (c.inp_rows // v), h * (c.wgt_rows // v), tile, res, vec, spare, win, pool)

    def regions(self, h: int) -> Regions:
        """Thread `h`'s slices, with the output tile of its current task."""
        return self._regions[h][self._slot[h]]

    def out_tile(self, h: int) -> alu.Tile:
        s, g = self.s, self.g
        return alu.Tile(self.regions(h).tile, s.tile_n, s.tile_oc, s.tile_h * s.tile_w, g.ro)

    # ---- the task loop -------------------------------------------------------------------------------
    def tasks(self) -> list[dict[str, int]]:
        extents = {a.name: a.extent for a in self.compute.axes}
        grid = np.indices([extents[a] for a in self.task_axes]).reshape(len(self.task_axes), -1).T
        return [dict(zip(self.task_axes, map(int, p), strict=True)) for p in grid]

    def stage_points(self) -> list[dict[str, int]]:
        """The reduction steps of a task, in order (one, empty, for layers without a split reduction)."""
        if not self.stage_axes:
            return [{}]
        extents = {a.name: a.extent for a in self.compute.axes}
        grid = np.indices([extents[a] for a in self.stage_axes]).reshape(len(self.stage_axes), -1).T
        return [dict(zip(self.stage_axes, map(int, p), strict=True)) for p in grid]

    def stages(self) -> int:
        return len(self.stage_points())

    def lower(self) -> Stream:
        """The layer's program (without its micro-op loads and FINISH, which the code generator adds)."""
        stream = Stream(self.config)
        self.resident: list[dict[str, Any]] = [{} for _ in range(self.v)]
        self._slot = [0] * self.v
        #: Set by emit_epilogue: the stream index from which its instructions may run beside the other
        #: thread's first GEMM after it (None: all before it).
        self.epilogue_tail: int | None = None
        #: Whether the stage being emitted is its thread's last (option last_pieces).
        self.final_stage = False
        started = [False] * self.v
        #: Tasks each thread has begun (the one being emitted included).
        self.tasks_begun = [0] * self.v
        first_mark = 0  # where the first thread's first stage begins
        # A task's last stage and its epilogue are one item of the round robin: the other thread's next stage
        # then runs between a tile's epilogue (its store) and the next write to the tile's rows, which waits
        # for that store (was: the two threads' epilogues back to back, so the next tile waited on the store).
        per_thread: list[list[list[tuple]]] = [[] for _ in range(self.v)]
        steps = self.stage_points()
        tasks = self.tasks()
        for k, point in enumerate(tasks):
            h = k % self.v
            final = k >= len(tasks) - self.v  # the thread's last task
            items = [[("stage", {**point, **step}, j, h, final and j == len(steps) - 1)]
                     for j, step in enumerate(steps)]
            items[-1].append(("epilogue", point, k, h, False))  # (an epilogue's third field: its task's index)
            per_thread[h] += items
        # The compute unit runs a GEMM beside an ALU instruction (and the converse) when they work on
        # different halves of the accumulator (spec "beside", vthread.mark_beside), as the two threads' tiles
        # do: a tile's epilogue goes after the start of the other thread's next stage (its loads and the start
        # of its tile: everything before its first GEMM), so that the stage's GEMMs follow the epilogue
        # directly and run beside it, and its start beside our GEMMs. (Where the stores bound the layer, the
        # next tile's start waits for the store before it, and the other thread's epilogue behind that start
        # in the ALU pipe waits too: option hold_epilogue=False keeps each epilogue with its stage.) An epilogue of
        # several ALU instructions, or one with a GEMM (a residual's), holds the other thread's GEMMs until its
        # last one issues (the issue is in order): with two output tiles a thread, option epilogue_own_stage
        # puts it after the start of the same thread's next task instead (its tile's start in the other slot,
        # beside the other thread's GEMMs like the epilogue), before that task's first GEMM.
        held: list[Insn] = []  # an epilogue waiting for the other thread's next stage
        held_by = -1
        held_tail: int | None = None  # where its tail starts (emit_epilogue's epilogue_tail)
        held_own: dict[int, list[Insn]] = {}  # (epilogue_own_stage) by thread
        for item in interleave(per_thread):
            for what, point, j, h, final in item:
                self.final_stage = final
                if what == "stage":
                    if j == 0:  # a new task of thread h: its tile is the next slot
                        self._slot[h] = (self._slot[h] + started[h]) % self.slots
                        started[h] = True
                        self.tasks_begun[h] += 1
                    if held and held_by == h:  # (the same thread's next stage overwrites the tile: after it)
                        stream.insns += held
                        held = []
                    mark = len(stream.insns)
                    first_mark = mark if (h, j, self.tasks_begun[h]) == (0, 0, 1) else first_mark
                    self.emit_stage(stream, point, j, h)
                    if (h, j, self.tasks_begun[h]) == (1, 0, 1) and self.options["interleave_first"]:
                        both = _piece_by_piece(stream.insns[first_mark:mark], stream.insns[mark:])
                        if both is not None:
                            stream.insns[first_mark:] = both
                            mark = len(stream.insns) - 1  # (an epilogue held goes before the last GEMM)
                    if j == 0 and h in held_own:
                        stream.insns[mark:] = _before_gemms(stream.insns[mark:], held_own.pop(h))
                    if held:
                        stream.insns[mark:] = _before_gemms(stream.insns[mark:], held, held_tail)
                        held = []
                else:
                    start = len(stream.insns)
                    self.epilogue_tail = None
                    self.epilogue_pieces: list[tuple[int, str]] = []
                    #: How many of the program's last tasks this epilogue's is among (option epilogue_pieces).
                    self.from_last = len(tasks) - 1 - j
                    self.emit_epilogue(stream, point, h)
                    if self.epilogue_pieces:
                        _after_pieces(stream.insns, start, self.epilogue_pieces)
                    elif self.own_stage:
                        held_own[h] = stream.insns[start:]
                        del stream.insns[start:]
                    elif self.v > 1 and self.options["hold_epilogue"]:
                        held, held_by = stream.insns[start:], h
                        held_tail = None if self.epilogue_tail is None else self.epilogue_tail - start
                        del stream.insns[start:]
        stream.insns += held
        for rest in held_own.values():  # the last tasks' (in the order they were emitted)
            stream.insns += rest
        return stream

    # ---- shared emitters -----------------------------------------------------------------------------
    def kernel(self, key: tuple, build: Any) -> Kernel:
        """The kernel `key` names, built once per choice of the threads' output tiles (its rows may be theirs)."""
        key = (*key, tuple(self._slot))
        if key not in self._kernels:
            self._kernels[key] = build()
        return self._kernels[key]

    def load_box(self, stream: Stream, key: str, mem: MemId, dram_base: int, box: Box, point: dict[str, int],
                 sram: int, thread: int, note: str, reuse: bool = True,
                 strides: tuple[int, ...] | None = None, part: tuple[int, int] | None = None) -> None:
        """Load a box unless the thread's slice already holds it (`reuse`); `strides`: of a strided view
        (:func:`~weft.compiler.backend.dma.box_transfers`); `part`: only the box's first-dimension indices
        ``[lo, hi)``, to where the whole box puts them."""
        origin = box.origin_at(point)
        if reuse and self.resident[thread].get(key) == origin:
            return
        self.resident[thread][key] = origin
        extent = box.extent
        if part is not None:
            lo, hi = part
            origin, extent = (origin[0] + lo, *origin[1:]), (hi - lo, *extent[1:])
            sram += lo * box.strides()[0]
        shape = self.compute.shapes[box.tensor]
        moves = merge(self.config, box_transfers(self.config, mem, shape, dram_base, origin, extent, sram,
                                                 strides))
        for t in moves:
            stream.transfer(t, note=note)

    def reset(self, stream: Stream, h: int) -> None:
        """Zero the output tile (and the spare row of a one-row reduction)."""
        r = self.regions(h)

        def build() -> Kernel:
            if self.single:  # the tile row and its spare row
                uops = np.zeros(2, dtype=UOP_DTYPE)
                uops["dst"] = (r.tile, r.spare)
                return Kernel(uops, 1, 1, (0, 0), (0, 0), (0, 0))
            return alu.rows_kernel(r.tile, self.tile_rows)

        stream.gemm(self.kernel(("reset", h), build), reset=True, note="reset the output tile")

    def body(self, stream: Stream, nest: Callable[[], Nest], h: int, emit: Callable[[Kernel], object],
             key: tuple = ()) -> None:
        """Emit a tile body (`nest` builds it when this thread has no kernel `key` for it yet): one folded
        instruction; for a one-row tile, executions alternating between the row and its spare row (folded
        in by :meth:`combine` once the reduction is complete)."""
        r = self.regions(h)
        if self.single:
            kernel = self.kernel(("body", h, *key), lambda: alu.alternate(nest(), r.spare))
            self.alternated = self.alternated or len(kernel.uops) > 1
        else:
            kernel = self.kernel(("body", h, *key), lambda: alu.fold_body(nest(), self.config))
        emit(kernel)

    def combine(self, stream: Stream, h: int, op: AluOp) -> None:
        """row op= spare row, after a one-row reduction that alternated between them."""
        if self.single and self.alternated:
            r = self.regions(h)
            stream.alu(op, self.kernel(("combine", h), lambda: alu.combine_kernel(r.tile, r.spare)),
                       note="fold the spare row into the output row")

    def finish_body(self, stream: Stream, h: int) -> None:
        """What completes a tile's body before its epilogue (layer kinds add to it)."""

    def copy_in(self, stream: Stream, shape: tuple[int, ...], dram: int | None, origin: tuple[int, ...],
                extent: tuple[int, ...], src: int, dst: int, ident: int, h: int, note: str) -> None:
        """Bring a box of int8 out rows into acc rows `dst..` the :func:`copies_by_gemm` way: the load unit
        puts it in inp rows `src..`, then a GEMM with the identity matrix (wgt row `ident`, loaded once per
        thread) that overwrites the rows copies it, exactly: each int8 times one, summed with zeros."""
        self.load_for_copy(stream, shape, dram, origin, extent, src, ident, h, note)
        self.copy_gemm(stream, src, dst, ident, int(np.prod(extent)), h, f"copy the {note}", overwrite=True)

    def load_for_copy(self, stream: Stream, shape: tuple[int, ...], dram: int | None, origin: tuple[int, ...],
                      extent: tuple[int, ...], src: int, ident: int, h: int, note: str) -> None:
        """The loads of :meth:`copy_in`: the identity matrix (once per thread) and the box into inp rows."""
        assert dram is not None and self.addrs.identity is not None
        if not self.resident[h].get("identity"):
            self.resident[h]["identity"] = True
            stream.transfer(Transfer(MemId.WGT, ident, self.addrs.identity, 1, 1, 1), note=RESIDUAL_LOADS[1])
        # An inp row is an out row (copies_by_gemm), so the box's DRAM rows count the same in both.
        for t in merge(self.config, box_transfers(self.config, MemId.INP, shape, dram, origin, extent, src)):
            stream.transfer(t, note=note)

    def copy_gemm(self, stream: Stream, src: int, dst: int, ident: int, rows: int, h: int, note: str,
                  overwrite: bool = False) -> None:
        """acc[dst + k] += inp[src + k] times the identity matrix (or the scaled one of
        :func:`~weft.compiler.backend.alu.residual_scale`), for k < rows; = with `overwrite`."""

        def copy() -> Kernel:
            uop = np.zeros(1, dtype=UOP_DTYPE)
            uop["dst"], uop["src"], uop["wgt"] = dst, src, ident
            return Kernel(uop, rows, 1, (1, 0), (1, 0), (0, 0))

        stream.gemm(self.kernel(("copy", h, dst, src, rows), copy), overwrite=overwrite, note=note)

    def epilogue_steps(self) -> tuple[tuple, int]:
        """The steps the epilogue runs and the index of their first vector (layer kinds may start a tile from
        the first step instead)."""
        return tuple(self.steps), 0

    def residual_gemm(self, h: int) -> Callable[[Stream, alu.Tile], None] | None:
        """How the epilogue adds a residual the GEMM multiplies in (None: the ALU adds it)."""
        return None

    def load_residual(self, stream: Stream, point: dict[str, int], h: int) -> None:
        """Bring the residual tile of the task at `point` into the thread's residual rows (sign-extended)."""
        assert self.addrs.residual is not None
        moves = box_transfers(self.config, MemId.ACC_NARROW, self.compute.shapes["out"], self.addrs.residual,
                              self.out_box.origin_at(point), self.out_box.extent, self.regions(h).res)
        for t in merge(self.config, moves):
            stream.transfer(t, note=RESIDUAL_LOADS[0])

    def load_vectors(self, stream: Stream, point: dict[str, int], h: int) -> None:
        """The epilogue's vectors for the output-channel tile of `point`, unless the thread holds them."""
        g, s, r = self.g, self.s, self.regions(h)
        first_block = point.get("gS", 0) * g.ocb + point["oB.o"] * s.tile_oc
        key = ("vec", self._slot[h] if self.own_stage and not self.one_oc_tile else 0)  # (each tile has its rows)
        if self.vectors and self.resident[h].get(key) != first_block:
            self.resident[h][key] = first_block
            assert self.addrs.vec is not None
            shape = (len(self.vectors), g.ocb * g.groups * g.ro)
            origin = (0, first_block * g.ro)
            for t in merge(self.config, box_transfers(self.config, MemId.ACC, shape, self.addrs.vec, origin,
                                                      (len(self.vectors), s.tile_oc * g.ro), r.vec)):
                stream.transfer(t, note="epilogue vectors")

    def emit_epilogue(self, stream: Stream, point: dict[str, int], h: int) -> None:
        self.finish_body(stream, h)
        self.load_vectors(stream, point, h)
        if self.g.residual:
            self.load_residual(stream, point, h)
        self.epilogue_blocks(stream, point, h, None, self.residual_gemm(h))

    def epilogue_blocks(self, stream: Stream, point: dict[str, int], h: int, blocks: tuple[int, int] | None = None,
                        residual_gemm: Callable[[Stream, alu.Tile], None] | None = None) -> None:
        """The epilogue's steps on thread `h`'s tile and its store: the whole tile, or its output blocks
        ``[lo, hi)`` (`blocks`; a tile of one image: the tile's rows are ``[n][oB][pixel][so]``)."""
        g, s, r = self.g, self.s, self.regions(h)
        tile = self.out_tile(h)
        origin, extent, first = self.out_box.origin_at(point), self.out_box.extent, 0
        if blocks is not None:
            lo, hi = blocks
            assert s.tile_n == 1
            first = lo * tile.pix * tile.ro  # the first row of block lo
            tile = alu.Tile(tile.base + first, 1, hi - lo, tile.pix, tile.ro)
            origin, extent = (origin[0], origin[1] + lo, *origin[2:]), (extent[0], hi - lo, *extent[2:])
        steps, first_vector = self.epilogue_steps()
        vec = r.vec + (blocks[0] * g.ro if blocks else 0)
        alu.epilogue(stream, steps, tile, tile.at(r.res + first), vec, s.tile_oc * g.ro, self.kernel, h,
                     residual_gemm, first_vector)
        moves = box_transfers(self.config, MemId.OUT, self.compute.shapes["out"], self.addrs.out, origin, extent,
                              r.tile + first)
        for t in merge(self.config, moves):
            stream.transfer(t, note="store the output tile")

