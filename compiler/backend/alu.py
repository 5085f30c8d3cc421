"""Epilogues on the tensor ALU: each step of a layer's epilogue (:mod:`weft.core.epilogue`) becomes
one ALU instruction over the accumulator rows of an output tile.

* ``*_imm`` steps: the op with its immediate, one micro-op looping over every row of the tile;
* ``*_vec`` steps: the op with a per-channel vector as the source operand; vectors sit in acc rows (one
  per GEMM output block: the channel values repeated over the batch), loaded once per output-channel tile.
  An instruction takes one micro-op per vector row and loops over the pixels, so the compute unit reads
  each vector row once and holds it; a tile of more output blocks than it holds splits into several such
  instructions where that costs fewer cycles than rereading (:func:`vec_chunks`);
* ``residual``: the residual tile (loaded as sign-extended ``acc_narrow`` rows) runs its own steps, then
  is added to the output tile; or, where its steps are one ``mul_imm c`` that fits a weight
  (:func:`residual_scale`) and the layer copies by GEMM, a GEMM with ``c`` times the identity matrix adds
  it to the output tile straight from the inp rows it was loaded into: one pass instead of four.

The narrowing to ``out_width`` is what the accelerator does whenever it writes an accumulator row, so
after the last step the out rows hold the layer's output. Destinations are one-to-one on the tile's rows
and sources live in other regions, so no instruction here has the consecutive-execution hazard.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from weft.compiler.backend.schedule import vector_chunks
from weft.compiler.backend.te import Axis, Expr, Kernel, Nest, fold, split_single_row
from weft.core.epilogue import KINDS, EpilogueOverflow, bounds, run_steps
from weft.hw.structure import SRC_ROWS
from weft.isa.arith import wrap
from weft.isa.constants import AluOp
from weft.isa.encoding import UOP_DTYPE, layout_of

if TYPE_CHECKING:
    from weft.compiler.backend.program import Stream
    from weft.config import AcceleratorConfig
    from weft.core.epilogue import Step

__all__ = ["Tile", "add_imm", "alternate", "bias_start", "combine_kernel", "epilogue", "fold_body", "residual_scale",
           "rows_kernel", "simplify", "start_from", "vec_chunks", "vectors_of"]


@dataclass(frozen=True)
class Tile:
    """Accumulator rows of an output tile, ``[n][oB][pixel][so]`` from `base`."""

    base: int
    tn: int
    toc: int
    pix: int
    ro: int

    @property
    def rows(self) -> int:
        return self.tn * self.toc * self.pix * self.ro

    def at(self, base: int) -> Tile:
        return Tile(base, self.tn, self.toc, self.pix, self.ro)


def vectors_of(steps: Sequence[Step]) -> list[np.ndarray]:
    """The per-channel vectors of an epilogue, in the order the steps (and residual sub-steps) use them."""
    out: list[np.ndarray] = []
    for kind, operand in steps:
        if kind == "residual":
            out += vectors_of(operand)
        elif kind.endswith("_vec"):
            out.append(operand)
    return out


def residual_scale(steps: Sequence[Step], config: AcceleratorConfig) -> int | None:
    """``c`` where the epilogue's residual is multiplied by ``c`` alone and ``c`` fits a weight (so a GEMM with
    ``c`` times the identity can add it), else None."""
    top = (1 << (config.wgt_width - 1)) - 1
    for kind, operand in steps:
        if kind == "residual" and len(operand) == 1 and operand[0][0] == "mul_imm" \
                and -top <= int(operand[0][1]) <= top:
            return int(operand[0][1])
    return None


def simplify(steps: Sequence[Step], config: AcceleratorConfig) -> tuple[Step, ...]:
    """The same epilogue in fewer ALU passes, exactly: an ``add_imm c`` right after a residual step moves
    into the residual's own rounding add (``(y + d) >> s`` then ``+ c`` is ``(y + d + (c << s)) >> s``), which
    saves one pass over the tile. Additions wrap, so moving ``c`` across the residual's addition changes
    nothing; the rule only applies where neither the old nor the new residual steps can wrap on any
    ``out_width`` input (the residual is a narrowed tensor). A sum too wide for the instruction's immediate
    becomes an ``add_vec`` of the constant (still one pass) when the epilogue has vectors to size it by, and
    otherwise the residual's steps are refitted to immediates that include it (:func:`_refit`)."""
    imm = layout_of(config).formats["alu"].field("imm")
    top = 1 << (config.out_width - 1)
    channels = next((len(op) for _, op in steps if isinstance(op, np.ndarray)), None)
    out: list[Step] = []
    for kind, operand in steps:
        prev = out[-1] if out else None
        if kind == "add_imm" and prev is not None and prev[0] == "residual":
            merged = _absorb(tuple(prev[1]), int(operand), (imm.min, imm.max), channels, top, config.acc_width)
            if merged is None:
                merged = _refit(tuple(prev[1]), int(operand), (imm.min, imm.max), top, config.acc_width)
            if merged is not None:
                out[-1] = ("residual", merged)
                continue
        out.append((kind, operand))
    return tuple(out)


def _absorb(sub: tuple[Step, ...], c: int, imm: tuple[int, int], channels: int | None, top: int,
            acc_width: int) -> tuple[Step, ...] | None:
    """Residual sub-steps that end ``+ c`` later, by folding `c` into their last add (None: not exactly)."""
    shifted = len(sub) >= 2 and sub[-1][0] == "shr_imm" and sub[-2][0] == "add_imm"
    if not shifted and not (sub and sub[-1][0] == "add_imm"):
        return None
    k = len(sub) - (2 if shifted else 1)  # the add that takes c
    added = int(sub[k][1]) + (c << int(sub[-1][1]) if shifted else c)
    if imm[0] <= added <= imm[1]:
        step: Step = ("add_imm", added)
    elif channels is not None and abs(added) < 1 << (acc_width - 1):
        step = ("add_vec", np.full(channels, added, dtype=np.int64))
    else:
        return None
    new = (*sub[:k], step, *sub[k + 1:])
    try:
        for candidate in (sub, new):
            bounds(candidate, np.int64(-top), np.int64(top - 1), acc_width)
    except EpilogueOverflow:
        return None
    return new


#: The most residual values :func:`_refit` enumerates (int8's 256; its pairwise bounds grow as the square).
REFIT_VALUES = 1 << 10


def _refit(sub: tuple[Step, ...], c: int, imm: tuple[int, int], top: int, acc_width: int) -> tuple[Step, ...] | None:
    """Residual sub-steps ``mul_imm m, add_imm d, shr_imm s`` (each left out where m = 1, d = 0, s = 0), no
    more of them than `sub` has, that compute `sub` then ``+ c`` for every residual value; None if none do.

    Exact by enumeration: the residual is a narrowed ``out_width`` tensor, so `sub` only ever sees the
    ``2 * top`` values of ``[-top, top)``, and the result is compared with ``wrap(sub(r) + c)`` on each (with
    the ALU's wrapping semantics, :func:`~weft.core.epilogue.run_steps`). The pair add that follows wraps,
    so adding ``c`` inside the residual or after it is the same modulo ``2**acc_width``. A per-channel `sub`
    is refitted only where every channel computes the same function, and only for residuals of up to
    :data:`REFIT_VALUES` values (the chord bounds below take every pair: int16 would need 2**31 of them)."""
    if 2 * top > REFIT_VALUES:
        return None
    r = np.arange(-top, top, dtype=np.int64)
    channels = next((len(op) for _, op in sub if isinstance(op, np.ndarray)), 1)
    got = run_steps(np.repeat(r[:, None], channels, axis=1), sub, acc_width)
    if np.any(got != got[:, :1]):
        return None
    want = wrap(got[:, 0] + c, acc_width)
    first, second = np.triu_indices(r.size, 1)
    apart = r[second] - r[first]
    for shift in range(acc_width - 1):
        # m * r + d must land in [lo, hi] = [want << shift, (want << shift) + 2**shift) for every r. The slopes m
        # that some d allows are those between every pair's chords (Fourier-Motzkin on the two unknowns);
        # for each, the offsets d that do form an interval.
        lo, hi = want << shift, (want << shift) + (1 << shift) - 1
        if lo[top] > imm[1] or hi[top] < imm[0]:  # d itself, at r = 0
            continue
        least = max(int(np.max(-((hi[first] - lo[second]) // apart))), imm[0])
        most = min(int(np.min((hi[second] - lo[first]) // apart)), imm[1])
        if least > most:
            continue
        slopes = np.unique(np.r_[np.linspace(least, most, min(most - least + 1, 4096)).astype(np.int64),
                                 [1] if least <= 1 <= most else []]).astype(np.int64)
        d_lo = np.maximum(np.max(lo[None, :] - slopes[:, None] * r[None, :], axis=1), imm[0])
        d_hi = np.minimum(np.min(hi[None, :] - slopes[:, None] * r[None, :], axis=1), imm[1])
        d = np.clip(0, d_lo, d_hi)  # 0 where allowed: one step fewer
        ok = np.flatnonzero(d_lo <= d_hi)
        for k in ok[np.argsort((slopes[ok] != 1).astype(int) + (d[ok] != 0), kind="stable")]:
            m, add = int(slopes[k]), int(d[k])
            new = tuple(step for step, keep in ((("mul_imm", m), m != 1), (("add_imm", add), add != 0),
                                                (("shr_imm", shift), shift != 0)) if keep)
            if len(new) > len(sub) or not np.array_equal(run_steps(r, new, acc_width), want):
                continue
            try:
                bounds(new, np.int64(-top), np.int64(top - 1), acc_width)
            except EpilogueOverflow:
                continue
            return new
    return None


def _uop(dst: int, src: int = 0) -> np.ndarray:
    u = np.zeros(1, dtype=UOP_DTYPE)
    u["dst"], u["src"] = dst, src
    return u


def rows_kernel(dst: int, rows: int, src: int | None = None) -> Kernel:
    """One micro-op stepping through `rows` consecutive rows (and, with `src`, a source run beside)."""
    return Kernel(_uop(dst, dst if src is None else src), rows, 1, (1, 0), (1 if src is not None else 0, 0), (0, 0))


def _vec_kernel(tile: Tile, vec: int) -> Kernel:
    n, o, p, s = (Axis(k, e) for k, e in (("n", tile.tn), ("oB", tile.toc), ("p", tile.pix), ("so", tile.ro)))
    dst = Expr((("n", tile.toc * tile.pix * tile.ro), ("oB", tile.pix * tile.ro), ("p", tile.ro), ("so", 1)), tile.base)
    src = Expr((("oB", tile.ro), ("so", 1)), vec)
    return fold(Nest((n, o, p, s), dst, src))


def _held_kernel(tile: Tile, vec: int, first: int, count: int) -> Kernel:
    """Vector rows ``first..first+count`` (flat over ``oB, so``) applied to their tile rows: one micro-op per
    vector row, the loops over the batch and the pixels, which do not move src, so the compute unit keeps
    the vector rows in registers after the first sweep (:func:`~weft.hw.structure.holds_src_rows`)."""
    j = np.arange(first, first + count)
    uops = np.zeros(count, dtype=UOP_DTYPE)
    uops["dst"] = tile.base + (j // tile.ro) * tile.pix * tile.ro + j % tile.ro
    uops["src"] = vec + j
    return Kernel(uops, tile.tn, tile.pix, (tile.toc * tile.pix * tile.ro, tile.ro), (0, 0), (0, 0))


def vec_chunks(tile: Tile) -> list[tuple[int, int]]:
    """A vector step on `tile` as instructions of ``(first, count)`` vector rows (flat over ``oB, so``), or
    none for one folded instruction (:func:`~weft.compiler.backend.schedule.vector_chunks` decides)."""
    rows = tile.toc * tile.ro
    if not vector_chunks(rows, tile.tn * tile.pix):
        return []
    return [(first, min(SRC_ROWS, rows - first)) for first in range(0, rows, SRC_ROWS)]


def _vector_step(stream: Stream, op: AluOp, target: Tile, vec: int,
                 kernel: Callable[[tuple, Callable[[], Kernel]], Kernel], thread: int, note: str) -> None:
    """`op` with vector rows from `vec` as its operands, on every row of `target`."""
    for first, count in vec_chunks(target) or [(-1, 0)]:
        k = kernel(("vec", thread, target.base, target.rows, vec, first),
                   lambda first=first, count=count: _vec_kernel(target, vec) if first < 0
                   else _held_kernel(target, vec, first, count))
        stream.alu(op, k, note=note)


def bias_start(steps: Sequence[Step]) -> Step | None:
    """The epilogue's first step where it adds a bias (``add_vec`` or ``add_imm``): a tile may start from it
    (:func:`start_from`) instead of from zero, since additions wrap and so commute with the GEMM's."""
    return steps[0] if steps and steps[0][0] in ("add_vec", "add_imm") else None


def start_from(stream: Stream, step: Step, tile: Tile, vec_base: int,
               kernel: Callable[[tuple, Callable[[], Kernel]], Kernel], thread: int) -> None:
    """Set the tile's accumulators to the bias of :func:`bias_start` (vector 0 at `vec_base`, or the
    immediate): one MOV pass, where a reset and the epilogue's ADD take two."""
    kind, operand = step
    if kind == "add_imm":
        k = kernel(("rows", thread, tile.base, tile.rows), lambda: rows_kernel(tile.base, tile.rows))
        stream.alu(AluOp.MOV, k, imm=int(operand), note="start from the bias")
    else:
        _vector_step(stream, AluOp.MOV, tile, vec_base, kernel, thread, "start from the bias")


def epilogue(stream: Stream, steps: Sequence[Step], tile: Tile, res: Tile, vec_base: int, vec_rows: int,
             kernel: Callable[[tuple, Callable[[], Kernel]], Kernel], thread: int,
             residual_gemm: Callable[[Stream, Tile], None] | None = None, first_vector: int = 0) -> None:
    """Emit `steps` on `tile`; `res` holds the residual tile, vector k sits at ``vec_base + k*vec_rows`` (the
    steps' first vector is vector `first_vector`); `residual_gemm` adds a residual of :func:`residual_scale`
    with a GEMM instead."""
    counter = iter(range(first_vector, 1 << 30))

    def run(steps: Sequence[Step], target: Tile, nested: bool) -> None:
        for kind, operand in steps:
            if kind == "residual":
                if nested:
                    raise ValueError("a residual step inside a residual step has no accumulator region")
                if residual_gemm is not None:
                    residual_gemm(stream, target)
                    continue
                run(operand, res, True)
                stream.alu(AluOp.ADD, kernel(("pair", thread, target.base, target.rows, res.base),
                                             lambda: rows_kernel(target.base, target.rows, res.base)),
                           note="add the residual")
                continue
            op = AluOp[KINDS[kind]]
            if kind.endswith("_imm"):
                k = kernel(("rows", thread, target.base, target.rows), lambda: rows_kernel(target.base, target.rows))
                stream.alu(op, k, imm=int(operand), note=f"epilogue {kind} {int(operand)}")
            else:
                _vector_step(stream, op, target, vec_base + next(counter) * vec_rows, kernel, thread,
                             f"epilogue {kind}")

    run(steps, tile, False)


def add_imm(stream: Stream, config: AcceleratorConfig, kernel: Kernel, value: int, note: str) -> None:
    """acc += value, in as many ALU instructions as the signed immediate field needs."""
    imm = layout_of(config).formats["alu"].field("imm")
    while value:
        step = max(imm.min, min(imm.max, value))
        stream.alu(AluOp.ADD, kernel, imm=step, note=note)
        value -= step


def fold_body(nest: Nest, config: AcceleratorConfig) -> Kernel:
    return fold(nest, max_uops=config.uop_rows)


def alternate(nest: Nest, spare: int) -> Kernel:
    """A reduction into a single row as executions alternating between the row and `spare`."""
    return split_single_row(nest, spare)[0]


def combine_kernel(row: int, spare: int) -> Kernel:
    return Kernel(_uop(row, spare), 1, 1, (0, 0), (0, 0), (0, 0))
