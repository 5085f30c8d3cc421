"""The semantics of an instruction stream beyond its bit layout: the one definition the simulator, the timing
model, the back end, the launch checks, the driver and the hardware units share.

The token queues between the three units (which unit pushes and which pops each one, with which dependency
flag), the unit that runs an instruction, the DRAM bytes of one row of each memory, and the legality table.
For each opcode: the memory ids it may name, the unit that runs it, the dependency flags that unit may set
(and the token queue each flag pops or pushes), which loads may pad, which ALU ops exist and that a GEMM or
ALU instruction loops over a non-empty micro-op range inside the uop buffer. The checks are vectorized over a
decoded stream (INSN_DTYPE); :func:`first_illegal` names the first offending instruction.

Range checks against a run's SRAM rows and DRAM bytes are not here: they depend on the image and buffers,
and the simulator and the driver each know their own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from weft.isa.asm import format_insn
from weft.isa.constants import AluOp, MemId, Opcode, Unit
from weft.isa.program import DEP_FLAGS

if TYPE_CHECKING:
    from weft.config import AcceleratorConfig

__all__ = ["FLAG_QUEUE", "LATE_ALU_OPS", "MEMS", "PADDED_MEMS", "QUEUES", "QUEUE_BETWEEN", "TOKEN_QUEUES", "UNIT_NAMES",
           "BesideRule", "Check", "Hazard", "QueueSpec", "acc_bank_rows", "acc_halves", "first_hazard", "first_illegal",
           "hazard_reach", "legality_checks", "named_row_bytes", "row_bytes", "sram_rows", "unit_of", "units"]

#: Unit names, by Unit value: "load", "compute", "store".
UNIT_NAMES = tuple(unit.name.lower() for unit in Unit)


@dataclass(frozen=True)
class QueueSpec:
    """One token queue: the unit that pushes it with which flag, and the unit that pops it with which."""

    name: str
    producer: Unit
    push: str
    consumer: Unit
    pop: str

    @property
    def doc(self) -> str:
        """Which way the tokens go, e.g. "load->compute"."""
        return f"{UNIT_NAMES[self.producer]}->{UNIT_NAMES[self.consumer]}"


#: The token queues, by index: everything else about queues (names, flags, routes) is derived from this table.
TOKEN_QUEUES = (
    QueueSpec("l2g", Unit.LOAD, "push_next", Unit.COMPUTE, "pop_prev"),
    QueueSpec("g2l", Unit.COMPUTE, "push_prev", Unit.LOAD, "pop_next"),
    QueueSpec("g2s", Unit.COMPUTE, "push_next", Unit.STORE, "pop_prev"),
    QueueSpec("s2g", Unit.STORE, "push_prev", Unit.COMPUTE, "pop_next"),
)
QUEUES = tuple(q.name for q in TOKEN_QUEUES)
#: (producer unit, consumer unit) -> the queue that orders the consumer after the producer.
QUEUE_BETWEEN: dict[tuple[int, int], QueueSpec] = {(q.producer, q.consumer): q for q in TOKEN_QUEUES}


def _flag_queue() -> dict[int, dict[str, int]]:
    ends: dict[int, dict[str, int]] = {u: {} for u in Unit}
    for k, q in enumerate(TOKEN_QUEUES):
        ends[q.producer][q.push] = k
        ends[q.consumer][q.pop] = k
    # In DEP_FLAGS order: error messages list a unit's flags in that order.
    return {u: {f: ends[u][f] for f in DEP_FLAGS if f in ends[u]} for u in Unit}


#: unit -> dependency flag -> queue it pops or pushes; a flag missing here is illegal for the unit.
FLAG_QUEUE = _flag_queue()

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


def row_bytes(config: AcceleratorConfig) -> dict[MemId, int]:
    """DRAM bytes of one row (the element a LOAD or STORE counts in) of each memory id.

    An acc_narrow row holds out_width-bit values, so it is as wide as an out row."""
    c = config
    return {MemId.UOP: c.uop_bits // 8, MemId.WGT: c.wgt_row_bits // 8, MemId.INP: c.inp_row_bits // 8,
            MemId.ACC: c.acc_row_bits // 8, MemId.OUT: c.out_row_bits // 8, MemId.ACC_NARROW: c.out_row_bits // 8}


def sram_rows(config: AcceleratorConfig) -> dict[MemId, int]:
    """Rows of the on-chip buffer each memory id addresses (an acc_narrow LOAD writes the accumulator)."""
    c = config
    return {MemId.UOP: c.uop_rows, MemId.WGT: c.wgt_rows, MemId.INP: c.inp_rows, MemId.ACC: c.acc_rows,
            MemId.OUT: c.out_rows, MemId.ACC_NARROW: c.acc_rows}


def named_row_bytes(config: AcceleratorConfig) -> dict[str, int]:
    """:func:`row_bytes` by lower-case memory name: uop, wgt, inp, acc, out, acc_narrow."""
    return {mem.name.lower(): size for mem, size in row_bytes(config).items()}


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


#: ALU ops whose result the pipeline has two stages after the others' (MUL's and RQ's products summed, RQ's
#: and SHR's right shift): an execution of one of them must not meet the rows of the three executions before
#: it either (spec "hazard"; the third: their results are handed back from F's register, not from the last
#: ALU stage's logic, which lay ahead of the multipliers' operand registers on tiny's longest paths after
#: place and route). The compiler's reductions (ADD, MAX) revisit a row every second execution.
LATE_ALU_OPS = frozenset({AluOp.SHR, AluOp.MUL, AluOp.RQ})


def hazard_reach(opcode: int, alu_op: int = 0) -> int:
    """How many executions back spec "hazard" reaches for a GEMM, or an ALU instruction with `alu_op`."""
    return 3 if opcode == Opcode.ALU and alu_op in LATE_ALU_OPS else 1


@dataclass(frozen=True)
class Hazard:
    """An execution that breaks spec "hazard": it writes (`kind` "write") or reads through src ("read") the acc
    row that the execution `back` before it writes."""

    kind: str
    execution: int
    back: int


def first_hazard(dst: np.ndarray, src: np.ndarray | None = None, reach: int = 1) -> Hazard | None:
    """Spec "hazard" over one GEMM/ALU instruction's executions in order: `dst` the acc rows they write, `src`
    the acc rows they read (an ALU's operand from acc; None for the others), `reach` from :func:`hazard_reach`.
    The earliest execution that meets a row one of the `reach` before it writes (a write before a read, the
    nearer before the farther); None when the instruction keeps the rule. The one statement of the rule for
    the functional simulator, the compiler's stream check and the random program generator."""
    found = []
    for back in range(1, reach + 1):
        for kind, rows in (("write", dst), ("read", src)):
            if rows is not None and (hits := np.flatnonzero(rows[back:] == dst[:-back])).size:
                found.append((int(hits[0]) + back, kind != "write", back, kind))
    if not found:
        return None
    e, _, back, kind = min(found)
    return Hazard(kind, e, back)


def acc_bank_rows(config: AcceleratorConfig) -> int:
    """Rows of the accumulator's lower half (bank 0; the upper half is bank 1): the halves of spec "beside"."""
    return config.acc_rows // 2


def acc_halves(config: AcceleratorConfig, lo: int, hi: int) -> frozenset[int]:
    """The halves (0 lower, 1 upper) that accumulator rows [lo, hi) touch."""
    half = acc_bank_rows(config)
    return frozenset(h for h, inside in ((0, lo < half), (1, hi > half)) if inside and hi > lo)


class BesideRule:
    """Spec "beside" as a compute stream goes by: the last instruction of each pipe (GEMM, ALU) that may
    still run. The functional simulator checks an instruction's ``beside`` with it; the code generator and
    the random programs set the bit where it allows. Feed every compute-unit instruction in order:
    :meth:`barrier` for its loads and FINISH (they wait for both pipes), :meth:`started` for GEMM and ALU."""

    def __init__(self) -> None:
        #: opcode -> (stream index, accumulator halves, whether it reads inp) of what may still run
        self.running: dict[int, tuple[int, frozenset[int], bool]] = {}

    def barrier(self) -> None:
        self.running.clear()

    def conflict(self, opcode: int, halves: frozenset[int], reads_inp: bool) -> str | None:
        """Why instruction `opcode`, touching `halves` (reading inp: `reads_inp`, an ALU operand) may not
        start beside the other pipe's running instruction, or None when it may (or nothing runs there)."""
        other = self.running.get(Opcode.ALU if opcode == Opcode.GEMM else Opcode.GEMM)
        if other is None:
            return None
        index, theirs, their_inp = other
        shared = sorted(halves & theirs)
        if shared:
            return (f"runs beside instruction {index}, but both touch acc rows in the "
                    f"{('lower', 'upper')[shared[0]]} half")
        if reads_inp or their_inp:
            return f"runs beside instruction {index}, but {'it' if reads_inp else 'that one'} takes its ALU operand " \
                   "from inp"
        return None

    def may_start(self, opcode: int, halves: frozenset[int], reads_inp: bool) -> bool:
        """Whether setting ``beside`` would gain anything and keep the rule: the other pipe runs something."""
        other = Opcode.ALU if opcode == Opcode.GEMM else Opcode.GEMM
        return bool(halves) and other in self.running and self.conflict(opcode, halves, reads_inp) is None

    def started(self, index: int, opcode: int, halves: frozenset[int], reads_inp: bool, beside: bool) -> None:
        """Record instruction `index` starting; without ``beside`` it waited for every earlier one."""
        if not beside:
            self.running.clear()
        self.running[opcode] = (index, halves, reads_inp)
