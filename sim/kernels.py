"""The GEMM and ALU cores as whole-array numpy kernels.

A GEMM or ALU instruction is a loop nest of micro-op *executions* (see
:func:`weft.isa.arith.loop_indices`). Executing them one by one in Python would cost microseconds each;
these kernels do every execution of an instruction at once and stay bit-exact:

* GEMM only reads the accumulator row it writes, and modular addition is associative, so an instruction
  adds to each touched row the exact integer sum of its executions' products, wrapped once at the end.
  The products come from BLAS on float tiles: int8 x int8 dot products over ``block_in`` are exact in
  float32 (and wider ones in float64; :func:`weft.isa.arith.float_dtype_for` picks the one that is exact).
  Executions are grouped by weight row (or by input row when there are fewer of those) so each group is one matmul, and
  the per-row sums are exact float64 ``bincount`` reductions (or int64 ``add.at`` past 2**53).
* ALU executions depend on each other only through rows they write. When no execution reads (as src) a
  row that another one writes, each row evolves alone: repeated destinations are applied in rounds (the
  k-th update of every row in round k) or, for associative ops with constant operands, with ``ufunc.at``.
  Otherwise executions are scheduled in dependency levels, which is exact for any pattern.
"""

from __future__ import annotations

import numpy as np

from weft.isa import arith
from weft.isa.arith import alu_op, exact_dtype, wrap
from weft.isa.constants import AluOp

__all__ = ["alu_apply", "gemm_row_sums"]

#: Below this many executions an instruction is one batched matmul (grouping costs more than it saves).
_SMALL = 64
#: Executions per chunk when no grouping pays (bounds the gathered weight tiles in memory).
_CHUNK = 4096


def _small_keys(keys: np.ndarray, limit: int) -> np.ndarray:
    """Keys below `limit` as uint16 when they fit, so a stable argsort is a radix sort."""
    return keys.astype(np.uint16) if limit <= 1 << 16 else keys


def _groups(keys: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Stable order of executions by key, the distinct keys, and each group's size."""
    order = np.argsort(_small_keys(keys, counts.size), kind="stable")
    present = np.flatnonzero(counts)
    return order, present, counts[present]


def _products(inp: np.ndarray, wgt: np.ndarray, src: np.ndarray, wsel: np.ndarray,
              shape: tuple[int, int, int], inp_rows: int, wgt_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-execution products (E, batch*block_out) and the permutation of executions they are in."""
    batch, block_in, block_out = shape
    count = src.size
    if count <= _SMALL:
        x = inp[src].reshape(count, batch, block_in)
        w = wgt[wsel].reshape(count, block_out, block_in)
        return np.matmul(x, w.transpose(0, 2, 1)).reshape(count, -1), np.arange(count)
    w_counts = np.bincount(wsel, minlength=wgt_rows)
    s_counts = np.bincount(src, minlength=inp_rows)
    n_w, n_s = int(np.count_nonzero(w_counts)), int(np.count_nonzero(s_counts))
    if min(n_w, n_s) * 8 > count:  # groups of a few executions: a batched matmul of gathered tiles
        out = np.empty((count, batch * block_out), dtype=inp.dtype)
        for lo in range(0, count, _CHUNK):
            hi = min(lo + _CHUNK, count)
            x = inp[src[lo:hi]].reshape(hi - lo, batch, block_in)
            w = wgt[wsel[lo:hi]].reshape(hi - lo, block_out, block_in)
            out[lo:hi] = np.matmul(x, w.transpose(0, 2, 1)).reshape(hi - lo, -1)
        return out, np.arange(count)
    if n_w <= n_s:  # one weight tile per group: X_group @ W^T
        order, keys, sizes = _groups(wsel, w_counts)
        x = inp[src[order]]
        if np.all(sizes == sizes[0]):
            n = int(sizes[0])
            w = wgt[keys].reshape(keys.size, block_out, block_in)
            y = np.matmul(x.reshape(keys.size, n * batch, block_in), w.transpose(0, 2, 1))
            return y.reshape(count, batch * block_out), order
        out = np.empty((count, batch * block_out), dtype=inp.dtype)
        ends = np.cumsum(sizes)
        for key, lo, hi in zip(keys.tolist(), (ends - sizes).tolist(), ends.tolist(), strict=True):
            w = wgt[key].reshape(block_out, block_in)
            out[lo:hi] = (x[lo:hi].reshape(-1, block_in) @ w.T).reshape(hi - lo, -1)
        return out, order
    # One input tile per group: W_group @ X^T (fully connected layers reuse one input row).
    order, keys, sizes = _groups(src, s_counts)
    w = wgt[wsel[order]]
    if np.all(sizes == sizes[0]):
        n = int(sizes[0])
        x = inp[keys].reshape(keys.size, batch, block_in).transpose(0, 2, 1)
        y = np.matmul(w.reshape(keys.size, n * block_out, block_in), x)  # (groups, n*block_out, batch)
        y = y.reshape(keys.size, n, block_out, batch).transpose(0, 1, 3, 2)
        return y.reshape(count, batch * block_out), order
    out = np.empty((count, batch * block_out), dtype=inp.dtype)
    ends = np.cumsum(sizes)
    for key, lo, hi in zip(keys.tolist(), (ends - sizes).tolist(), ends.tolist(), strict=True):
        x = inp[key].reshape(batch, block_in)
        y = w[lo:hi].reshape(-1, block_in) @ x.T  # (n*block_out, batch)
        out[lo:hi] = y.reshape(hi - lo, block_out, batch).transpose(0, 2, 1).reshape(hi - lo, -1)
    return out, order


def _patterns(matrix: np.ndarray, limit: int) -> tuple[np.ndarray, np.ndarray] | None:
    """Distinct rows of `matrix` when there are at most `limit`: (first row of each, row -> pattern id)."""
    # A multiplicative hash of each row (wrapping int64 arithmetic); equality is verified below.
    golden = np.uint64(0x9E3779B97F4A7C15)
    coeffs = (np.arange(1, matrix.shape[1] + 1, dtype=np.uint64) * golden).view(np.int64) | 1
    keys = (matrix * coeffs).sum(axis=1)
    uniq, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    if uniq.size > limit or not np.array_equal(matrix, matrix[first[inverse]]):
        return None
    return first, inverse


def _dense_sums(inp: np.ndarray, wgt: np.ndarray, order: np.ndarray, src: np.ndarray, wsel: np.ndarray,
                rows: int, shape: tuple[int, int, int], dtype: np.dtype) -> np.ndarray | None:
    """Row sums as im2col matmuls, when every destination row takes the same number K of executions
    and the rows share a few weight sequences (convolutions) or input sequences (fully connected).

    `order` sorts the executions by destination; returns (rows, batch*block_out) floats or None.
    """
    batch, block_in, block_out = shape
    k = order.size // rows
    s_mat, w_mat = src[order].reshape(rows, k), wsel[order].reshape(rows, k)
    limit = max(16, rows // 16)
    out = np.empty((rows, batch * block_out), dtype=dtype)
    by_wgt = _patterns(w_mat, limit)
    if by_wgt is not None:  # X (n*batch, K*block_in) @ W (K*block_in, block_out) per weight sequence
        first, inverse = by_wgt
        for p, head in enumerate(first.tolist()):
            sel = np.flatnonzero(inverse == p)
            x = inp[s_mat[sel]].astype(dtype, copy=False)  # (n, K, batch*block_in)
            x = x.reshape(sel.size, k, batch, block_in).transpose(0, 2, 1, 3).reshape(-1, k * block_in)
            w = wgt[w_mat[head]].astype(dtype, copy=False).reshape(k, block_out, block_in)
            y = x @ w.transpose(0, 2, 1).reshape(k * block_in, block_out)
            out[sel] = y.reshape(sel.size, batch * block_out)
        return out
    by_src = _patterns(s_mat, limit)
    if by_src is not None:  # X (batch, K*block_in) @ W (K*block_in, n*block_out) per input sequence
        first, inverse = by_src
        for p, head in enumerate(first.tolist()):
            sel = np.flatnonzero(inverse == p)
            x = inp[s_mat[head]].astype(dtype, copy=False).reshape(k, batch, block_in)
            x = x.transpose(1, 0, 2).reshape(batch, k * block_in)
            w = wgt[w_mat[sel]].astype(dtype, copy=False).reshape(sel.size, k, block_out, block_in)
            y = x @ w.transpose(1, 3, 0, 2).reshape(k * block_in, sel.size * block_out)
            out[sel] = y.reshape(batch, sel.size, block_out).transpose(1, 0, 2).reshape(sel.size, -1)
        return out
    return None


def gemm_row_sums(inp: np.ndarray, wgt: np.ndarray, dst: np.ndarray, src: np.ndarray, wsel: np.ndarray,
                  shape: tuple[int, int, int], acc_rows: int, term_bound: int
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Exact sums of ``inp[src] . wgt[wsel]^T`` per destination row.

    `inp` (rows, batch*block_in) and `wgt` (rows, block_out*block_in) are float tiles holding exact
    integers; `term_bound` bounds the magnitude of one execution's product. Returns the touched rows
    (sorted) and int64 sums (rows, batch*block_out).
    """
    counts = np.bincount(dst, minlength=acc_rows)
    rows = np.flatnonzero(counts)
    per_row = int(counts.max())
    if dst.size > _SMALL and dst.size == per_row * rows.size:  # every row takes the same count
        dtype = exact_dtype(per_row * term_bound)
        if dtype is not None:
            order = np.argsort(_small_keys(dst, acc_rows), kind="stable")
            sums = _dense_sums(inp, wgt, order, src, wsel, rows.size, shape, dtype)
            if sums is not None:
                return rows, sums.astype(np.int64)
    lut = np.empty(acc_rows, dtype=np.intp)
    lut[rows] = np.arange(rows.size)
    products, order = _products(inp, wgt, src, wsel, shape, inp.shape[0], wgt.shape[0])
    slot = lut[dst[order]]
    if per_row * term_bound <= arith.F64_EXACT:  # float64 sums of integers stay exact
        columns = np.ascontiguousarray(products.T, dtype=np.float64)
        sums = np.empty((products.shape[1], rows.size), dtype=np.float64)
        for c in range(columns.shape[0]):
            sums[c] = np.bincount(slot, weights=columns[c], minlength=rows.size)
        return rows, sums.T.astype(np.int64)
    sums64 = np.zeros((rows.size, products.shape[1]), dtype=np.int64)
    np.add.at(sums64, slot, products.astype(np.int64))
    return rows, sums64


# ---- ALU -------------------------------------------------------------------------------------------


def _ranks(keys: np.ndarray) -> np.ndarray:
    """For each position, how many earlier positions hold the same key."""
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    starts = np.r_[True, sorted_keys[1:] != sorted_keys[:-1]]
    first = np.maximum.accumulate(np.where(starts, np.arange(keys.size), 0))
    ranks = np.empty(keys.size, dtype=np.int64)
    ranks[order] = np.arange(keys.size) - first
    return ranks


def _levels(dst: list[int], src: list[int]) -> np.ndarray:
    """Dependency level of each execution: within a level all reads may happen before all writes."""
    last_write: dict[int, int] = {}
    last_read: dict[int, int] = {}
    levels = np.empty(len(dst), dtype=np.int64)
    for e, (d, s) in enumerate(zip(dst, src, strict=True)):
        level = max(last_write.get(d, -1) + 1, last_write.get(s, -1) + 1, last_read.get(d, 0))
        levels[e] = level
        last_write[d] = level
        if last_read.get(s, 0) < level:
            last_read[s] = level
    return levels


def _apply_in_steps(acc: np.ndarray, op: int, dst: np.ndarray, src: np.ndarray | None, imm: int | np.ndarray,
                    steps: np.ndarray, acc_width: int) -> None:
    """Apply executions step by step; within a step destinations are distinct and reads come first."""
    order = np.argsort(steps, kind="stable")
    counts = np.bincount(steps)
    ends = np.cumsum(counts)
    for lo, hi in zip((ends - counts).tolist(), ends.tolist(), strict=True):
        sel = order[lo:hi]
        d = dst[sel]
        operand = acc[src[sel]] if src is not None else imm[sel] if isinstance(imm, np.ndarray) else imm
        acc[d] = alu_op(op, acc[d], operand, acc_width)


_AT = {AluOp.MIN: np.minimum, AluOp.MAX: np.maximum, AluOp.ADD: np.add, AluOp.MUL: np.multiply}


def alu_apply(acc: np.ndarray, op: int, dst: np.ndarray, src: np.ndarray | None, imm: int | np.ndarray,
              acc_width: int, acc_rows: int) -> np.ndarray:
    """Run every execution of an ALU instruction on `acc` (int64 rows, in place) in program order
    semantics; `src` is None with an operand that is not an acc row: `imm`, an immediate or one operand row
    per execution (read from inp). Returns the touched rows."""
    counts = np.bincount(dst, minlength=acc_rows)
    rows = np.flatnonzero(counts)
    repeats = int(counts.max())
    if src is not None:
        written = counts > 0
        if np.any(written[src] & (src != dst)):  # a row read here is written here: order matters
            _apply_in_steps(acc, op, dst, src, imm, _levels(dst.tolist(), src.tolist()), acc_width)
            return rows
    if repeats == 1:
        operand = imm if src is None else acc[src]
        acc[dst] = alu_op(op, acc[dst], operand, acc_width)
    elif op in _AT and (src is None or not np.any(src == dst)):
        operand = imm if src is None else acc[src]
        _AT[AluOp(op)].at(acc, dst, operand)  # wraps modulo 2^64, which keeps the residue mod 2^acc
        acc[rows] = wrap(acc[rows], acc_width)
    else:  # rows evolve independently: the k-th update of every row in round k
        _apply_in_steps(acc, op, dst, src, imm, _ranks(dst), acc_width)
    return rows
