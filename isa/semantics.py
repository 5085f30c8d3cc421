"""Which encodings are legal: the one definition the functional simulator and the board's launch checks share.

For each opcode: the memory ids it may name, the unit that runs it, the dependency flags that unit may set
(and the token queue each flag pops or pushes), which loads may pad, which ALU ops exist and that a GEMM or
ALU instruction loops over a non-empty micro-op range inside the uop buffer. The checks are vectorized over a
decoded stream (INSN_DTYPE); :func:`first_illegal` names the first offending instruction.

Range checks against a run's SRAM rows and DRAM bytes are not here: they depend on the image and buffers,
and the simulator and the driver each know their own.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from weft.isa.asm import format_insn
from weft.isa.constants import AluOp, MemId, Opcode, Unit
from weft.isa.program import DEP_FLAGS

__all__ = ["FLAG_QUEUE", "MEMS", "PADDED_MEMS", "QUEUES", "UNIT_NAMES", "Check", "first_illegal", "legality_checks",
           "unit_of", "units"]

#: Token queues, by index: load->compute, compute->load, compute->store, store->compute.
QUEUES = ("l2g", "g2l", "g2s", "s2g")
L2G, G2L, G2S, S2G = range(len(QUEUES))
#: unit -> dependency flag -> queue it pops or pushes; a flag missing here is illegal for the unit.
FLAG_QUEUE: dict[int, dict[str, int]] = {
    Unit.LOAD: {"pop_next": G2L, "push_next": L2G},
    Unit.COMPUTE: {"pop_prev": L2G, "pop_next": S2G, "push_prev": G2L, "push_next": G2S},
    Unit.STORE: {"pop_prev": G2S, "push_prev": S2G},
}
#: Memory ids a data-moving opcode may name, and why (the end of the refusal message).
MEMS: dict[int, tuple[tuple[MemId, ...], str]] = {
    Opcode.LOAD: ((MemId.UOP, MemId.WGT, MemId.INP, MemId.ACC, MemId.ACC_NARROW),
                  "LOAD writes only the uop, wgt, inp, acc and acc_narrow buffers"),
    Opcode.STORE: ((MemId.OUT,), "STORE writes only the out buffer"),
}
#: Memory ids whose LOAD may pad with zeros (a STORE never pads).
PADDED_MEMS = (MemId.INP, MemId.ACC, MemId.ACC_NARROW)
#: Loads the load unit runs; every other LOAD (uop, acc, acc_narrow) goes to the compute unit.
_LOAD_UNIT_MEMS = (MemId.INP, MemId.WGT)
#: Unit names, by Unit value.
UNIT_NAMES = ("load", "compute", "store")

#: (one flag per instruction: it breaks this rule, what the rule says of instruction i).
Check = tuple[np.ndarray, Callable[[int], str]]


def _table(*members: int) -> np.ndarray:
    """An 8-entry boolean lookup table (for 3-bit fields) that is True at `members`."""
    table = np.zeros(8, dtype=bool)
    table[[int(m) for m in members]] = True
    return table


def unit_of(opcode: int, mem_id: int) -> Unit:
    """The unit that runs one instruction."""
    if opcode == Opcode.STORE:
        return Unit.STORE
    return Unit.LOAD if opcode == Opcode.LOAD and mem_id in _LOAD_UNIT_MEMS else Unit.COMPUTE


def units(insns: np.ndarray) -> np.ndarray:
    """The unit (int Unit) that runs each instruction of a decoded stream."""
    op, mem = insns["opcode"], insns["mem_id"]
    out = np.full(len(insns), int(Unit.COMPUTE), dtype=np.int64)
    out[(op == Opcode.LOAD) & _table(*_LOAD_UNIT_MEMS)[mem]] = Unit.LOAD
    out[op == Opcode.STORE] = Unit.STORE
    return out


def legality_checks(insns: np.ndarray, uop_rows: int) -> list[Check]:
    """Every rule of the encoding, in the order the simulator reports them; `uop_rows` is the uop buffer's."""
    op, mem = insns["opcode"], insns["mem_id"]  # 3-bit fields: they index 8-entry tables
    unit = units(insns)
    is_load, is_store = op == Opcode.LOAD, op == Opcode.STORE
    active = (is_load | is_store) & (insns["x_size"] > 0)
    checks: list[Check] = [(~_table(*Opcode)[op], lambda i: f"illegal opcode {op[i]}")]
    bad_mem = np.zeros(len(insns), dtype=bool)
    for opcode, (mems, _) in MEMS.items():
        bad_mem |= (op == opcode) & ~_table(*mems)[mem]
    checks.append((bad_mem, lambda i: f"illegal memory id {mem[i]} for {Opcode(op[i]).name}: {MEMS[op[i]][1]}"))
    for flag in DEP_FLAGS:
        bad = (insns[flag] != 0) & ~_table(*(u for u, m in FLAG_QUEUE.items() if flag in m))[unit]
        checks.append((bad, lambda i, f=flag: (
            f"dependency flag {f} is illegal for the {UNIT_NAMES[unit[i]]} unit (it may use "
            f"{', '.join(FLAG_QUEUE[int(unit[i])])})")))
    checks.append(((op == Opcode.ALU) & (insns["alu_op"] > max(AluOp)),
                   lambda i: f"illegal ALU op {insns['alu_op'][i]}"))
    pads = insns["y_pad_0"] + insns["y_pad_1"] + insns["x_pad_0"] + insns["x_pad_1"]
    no_pad = is_store | (is_load & ~_table(*PADDED_MEMS)[mem])
    checks.append((active & no_pad & (pads > 0), lambda i: (
        f"padding is only allowed on loads into inp, acc and acc_narrow, not on {format_insn(insns[i])}")))
    looped = _table(Opcode.GEMM, Opcode.ALU)[op]
    bgn, end = insns["uop_bgn"], insns["uop_end"]
    checks.append((looped & (bgn >= end), lambda i: f"empty micro-op range {bgn[i]}:{end[i]}"))
    checks.append((looped & (end > uop_rows), lambda i: (
        f"micro-op range {bgn[i]}:{end[i]} is beyond the {uop_rows} rows of the uop buffer")))
    return checks


def first_illegal(checks: list[Check]) -> tuple[int, str] | None:
    """(index, rule) of the first instruction that breaks any of `checks`; None when all hold."""
    firsts = [(int(np.argmax(mask)), k) for k, (mask, _) in enumerate(checks) if mask.any()]
    if not firsts:
        return None
    i, k = min(firsts)
    return i, checks[k][1](i)
