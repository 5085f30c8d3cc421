"""Static checks of every emitted instruction stream, run before an artifact is written.

* :func:`check_hazards`: no GEMM/ALU instruction has two consecutive micro-op executions writing one
  accumulator row, and no ALU execution reads the row the previous one wrote (the pipeline does not check
  these, see the ISA's ``hazard`` semantics); every operand row lies inside its buffer.
* :func:`check_tokens`: the token protocol is balanced and cannot deadlock. The three units, the fetch
  unit and its command queues, and the four token queues (with their depths) are run abstractly, without
  data; since units block on bounded FIFOs this network is determinate, so one run that completes proves
  every timing completes. FINISH must be ordered (through tokens) after every load and store, and every
  pushed token must be popped by the end.

Failures raise :class:`StreamError` naming the layer and the instruction index.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

import numpy as np

from weft.errors import WeftError
from weft.isa import semantics
from weft.isa.arith import loop_indices
from weft.isa.asm import format_insn
from weft.isa.constants import Opcode, Unit
from weft.isa.semantics import FLAG_QUEUE, QUEUES, UNIT_NAMES, first_hazard, hazard_reach

if TYPE_CHECKING:
    from weft.config import AcceleratorConfig

__all__ = ["StreamError", "check_hazards", "check_stream", "check_tokens"]

LOAD, COMPUTE, STORE = int(Unit.LOAD), int(Unit.COMPUTE), int(Unit.STORE)


class StreamError(WeftError):
    """An emitted stream that breaks a rule of the accelerator; ``index`` is the instruction."""

    def __init__(self, layer: str, index: int, message: str):
        self.layer, self.index = layer, index
        super().__init__(f"layer '{layer}': instruction {index}: {message}")


def check_tokens(layer: str, insns: np.ndarray, config: AcceleratorConfig) -> dict[str, int]:
    """Run the token protocol of `insns` abstractly; returns the peak occupancy of each queue."""
    n = len(insns)
    if n == 0 or insns["opcode"][-1] != Opcode.FINISH:
        raise StreamError(layer, max(n - 1, 0), "the stream must end with FINISH")
    finishes = np.flatnonzero(insns["opcode"] == Opcode.FINISH)
    if finishes.size != 1:
        raise StreamError(layer, int(finishes[0]), "FINISH must appear once, last")
    illegal = semantics.first_illegal(semantics.legality_checks(insns, config.uop_rows))
    if illegal is not None:
        raise StreamError(layer, *illegal)
    units = semantics.units(insns)
    pops: list[tuple[int, ...]] = []
    pushes: list[tuple[int, ...]] = []
    for i in range(n):
        table = FLAG_QUEUE[int(units[i])]
        pops.append(tuple(q for f, q in table.items() if f.startswith("pop") and insns[f][i]))
        pushes.append(tuple(q for f, q in table.items() if f.startswith("push") and insns[f][i]))
    streams = [np.flatnonzero(units == u).tolist() for u in range(3)]
    lengths = [len(s) for s in streams]
    unit_list = units.tolist()
    depth, cmd_depth = config.token_queue_depth, config.cmd_queue_depth
    tokens: list[deque[np.ndarray]] = [deque() for _ in QUEUES]
    clocks = [np.full(3, -1, dtype=np.int64) for _ in range(3)]
    pos, dispatched, fetched = [0, 0, 0], [0, 0, 0], 0
    peak = [0, 0, 0, 0]
    while True:
        while fetched < n and dispatched[unit_list[fetched]] - pos[unit_list[fetched]] < cmd_depth:
            dispatched[unit_list[fetched]] += 1
            fetched += 1
        progressed = False
        for u in (COMPUTE, LOAD, STORE):
            while pos[u] < dispatched[u]:
                i = streams[u][pos[u]]
                if not all(tokens[q] for q in pops[i]) or not all(len(tokens[q]) < depth for q in pushes[i]):
                    break
                for q in pops[i]:
                    np.maximum(clocks[u], tokens[q].popleft(), out=clocks[u])
                clocks[u][u] = pos[u]
                if i == n - 1:  # FINISH
                    for other in (LOAD, STORE):
                        if lengths[other] and clocks[u][other] < lengths[other] - 1:
                            j = streams[other][-1]
                            raise StreamError(layer, i, f"FINISH is not ordered after the {UNIT_NAMES[other]} unit's "
                                                        f"last instruction {j} ({format_insn(insns[j])})")
                    left = {name: len(tokens[q]) for q, name in enumerate(QUEUES) if tokens[q]}
                    if left:
                        raise StreamError(layer, i, f"unbalanced tokens: {left} pushed and never popped")
                    unpopped = [k for k in range(3) if k != u and pos[k] < lengths[k]]
                    if unpopped:
                        k = unpopped[0]
                        raise StreamError(layer, streams[k][pos[k]], f"the {UNIT_NAMES[k]} unit has not run this "
                                                                     "instruction when FINISH does")
                    return dict(zip(QUEUES, peak, strict=True))
                for q in pushes[i]:
                    tokens[q].append(clocks[u].copy())
                    peak[q] = max(peak[q], len(tokens[q]))
                pos[u] += 1
                progressed = True
                if fetched < n:
                    break  # let fetch refill the queues
        if not progressed:
            blocked = []
            for u in (LOAD, COMPUTE, STORE):
                if pos[u] < lengths[u]:
                    i = streams[u][pos[u]]
                    blocked.append(f"{UNIT_NAMES[u]} at instruction {i} ({format_insn(insns[i])})")
            first = min(streams[u][pos[u]] for u in range(3) if pos[u] < lengths[u])
            raise StreamError(layer, first, "deadlock: " + "; ".join(blocked))


def check_hazards(layer: str, insns: np.ndarray, uops: np.ndarray, config: AcceleratorConfig) -> int:
    """Check every GEMM/ALU of `insns` against the micro-op buffer contents `uops` (UOP_DTYPE, from row
    0); returns the number of executions checked."""
    c = config
    seen: dict[tuple, None] = {}
    total = 0
    for i in np.flatnonzero(np.isin(insns["opcode"], [int(Opcode.GEMM), int(Opcode.ALU)])).tolist():
        r = insns[i]
        is_alu = int(r["opcode"]) == Opcode.ALU
        reset = not is_alu and bool(r["reset"])
        use_src = not reset and not (is_alu and r["use_imm"])
        acc_src = is_alu and not r["src_inp"]  # an ALU operand from acc (else from inp, like the GEMM's)
        key = tuple(int(r[f]) for f in ("opcode", "uop_bgn", "uop_end", "iter_out", "iter_in", "dst_factor_out",
                                        "dst_factor_in", "src_factor_out", "src_factor_in", "wgt_factor_out",
                                        "wgt_factor_in", "reset", "use_imm", "src_inp", "alu_op"))
        bgn, end = int(r["uop_bgn"]), int(r["uop_end"])
        if not 0 <= bgn < end <= len(uops):
            raise StreamError(layer, i, f"micro-ops {bgn}:{end} are outside the {len(uops)} loaded ones")
        total += (end - bgn) * int(r["iter_out"]) * int(r["iter_in"])
        if key in seen:
            continue
        seen[key] = None

        def rows(name: str, r=r, bgn=bgn, end=end) -> np.ndarray:
            return loop_indices(uops[name][bgn:end].astype(np.int64), int(r["iter_out"]), int(r["iter_in"]),
                                int(r[f"{name}_factor_out"]), int(r[f"{name}_factor_in"]))

        dst = rows("dst")
        limits = [("dst", dst, c.acc_rows, "acc")]
        src = rows("src") if use_src else None
        if src is not None:
            limits.append(("src", src, c.acc_rows if acc_src else c.inp_rows, "acc" if acc_src else "inp"))
        if use_src and not is_alu:
            limits.append(("wgt", rows("wgt"), c.wgt_rows, "wgt"))
        for name, idx, limit, mem in limits:
            if idx.size and (idx.min() < 0 or idx.max() >= limit):
                raise StreamError(layer, i, f"{name} row {int(idx.max())} is outside the {limit} rows of {mem} "
                                            f"({format_insn(r)})")
        found = first_hazard(dst, src if acc_src else None, hazard_reach(int(r["opcode"]), int(r["alu_op"])))
        if found is not None:
            e, before = found.execution, found.execution - found.back
            if found.kind == "write":
                raise StreamError(layer, i, f"executions {before} and {e} both write acc row {int(dst[e])}: the "
                                            f"consecutive-uop hazard ({format_insn(r)})")
            raise StreamError(layer, i, f"execution {e} reads acc row {int(src[e])} that execution {before} "
                                        f"writes: a read-after-write hazard ({format_insn(r)})")
    return total


def check_stream(layer: str, insns: np.ndarray, uops: np.ndarray, config: AcceleratorConfig) -> dict[str, int]:
    """Both checks; returns the peak token occupancy per queue and the executions checked."""
    peaks = check_tokens(layer, insns, config)
    return {**peaks, "executions": check_hazards(layer, insns, uops, config)}
