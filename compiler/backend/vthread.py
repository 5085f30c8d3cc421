"""Dependency tokens from program order (VTA's InjectCoProcSync), and virtual-thread interleaving.

The back end emits a layer as if one machine ran it instruction by instruction ("program order"). The
accelerator runs it on three units that only synchronize through four token queues, so every ordering
between units that program order implies must become a token: a GEMM waits (l2g) for the load that wrote
its input rows, a load waits (g2l) for the GEMM that last read the rows it overwrites, a store waits (g2s)
for the ALU op that wrote its output rows, a GEMM/ALU waits (s2g) for the store that last read the out
rows it overwrites, and FINISH waits for the last load and store.

:func:`inject_sync` derives these from the instructions' footprints. Vector clocks drop a wait that is
already implied through other tokens; the waits left on one queue name strictly increasing producer
instructions, so each is one push (on the producer) paired in FIFO order with one pop (on the waiter),
and every push is popped: the protocol is balanced by construction (and checked by
:mod:`weft.compiler.backend.check`).

Virtual threads (:func:`interleave`) are only an emission order plus a buffer split: tiles alternate between
threads, each thread owns a slice of inp, wgt and acc, and the threads' stages are emitted interleaved,
so the tokens let one thread's loads run while the other's GEMMs do.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from weft.compiler.backend.program import Insn
from weft.isa.constants import Opcode, Unit
from weft.isa.encoding import layout_of
from weft.isa.semantics import QUEUE_BETWEEN, BesideRule, acc_halves

if TYPE_CHECKING:
    from weft.config import AcceleratorConfig

__all__ = ["inject_sync", "interleave", "mark_beside"]

LOAD, COMPUTE, STORE = int(Unit.LOAD), int(Unit.COMPUTE), int(Unit.STORE)
# Who writes and who reads each shared SRAM. Two more carry orderings through DRAM in a program of several
# layers (:mod:`weft.compiler.backend.chain`), one row per layer: "stored" (a layer's stores write its row,
# an instruction of the compute unit that needs the layer's output in DRAM reads it) and "loadable" (the
# compute unit's barrier of a layer writes its row after those stores, the layer's loads of them read it):
# the load unit has no queue from the store unit, so the compute unit relays.
_SHARED = {"inp": (LOAD, COMPUTE), "wgt": (LOAD, COMPUTE), "out": (COMPUTE, STORE),
           "stored": (STORE, COMPUTE), "loadable": (COMPUTE, LOAD)}


def _rows(config: AcceleratorConfig, sram: str, insns: Sequence[Insn]) -> int:
    if sram in ("inp", "wgt", "out"):
        return {"inp": config.inp_rows, "wgt": config.wgt_rows, "out": config.out_rows}[sram]
    return max((hi for x in insns for m, _, hi in (*x.reads, *x.writes) if m == sram), default=0)


def inject_sync(insns: Sequence[Insn], config: AcceleratorConfig) -> None:
    """Set the dependency flags of `insns` (in place) so that the three units keep program order on
    every shared SRAM row. The last instruction must be FINISH."""
    if not insns or insns[-1].fields.get("opcode") != Opcode.FINISH:
        raise ValueError("a program must end with FINISH")
    last_write = {m: np.full(_rows(config, m, insns), -1, dtype=np.int64) for m in _SHARED}
    last_read = {m: np.full(_rows(config, m, insns), -1, dtype=np.int64) for m in _SHARED}
    streams: list[list[int]] = [[], [], []]  # global index of each unit's instructions
    clock_at: list[np.ndarray] = []  # per instruction: what its unit knows after it
    clock = [np.full(3, -1, dtype=np.int64) for _ in range(3)]
    for i, insn in enumerate(insns):
        u = int(insn.unit)
        k = len(streams[u])
        need: dict[int, int] = {}  # producer unit -> stream index this instruction must wait for

        def want(producer: int, index: int, need: dict[int, int] = need) -> None:
            if index >= 0 and index > need.get(producer, -1):
                need[producer] = index

        for sram, lo, hi in insn.reads:
            writer, _ = _SHARED[sram]
            if hi > lo:
                want(writer, int(last_write[sram][lo:hi].max()))
        for sram, lo, hi in insn.writes:
            _, reader = _SHARED[sram]
            if hi > lo:
                want(reader, int(last_read[sram][lo:hi].max()))
        if insn.fields.get("opcode") == Opcode.FINISH:
            want(LOAD, len(streams[LOAD]) - 1)
            want(STORE, len(streams[STORE]) - 1)
        for producer, index in sorted(need.items()):
            if producer == u or index <= clock[u][producer]:
                continue  # same unit (in order) or already known through other tokens
            queue = QUEUE_BETWEEN[(producer, u)]
            source = streams[producer][index]
            insns[source].fields[queue.push] = 1
            insn.fields[queue.pop] = 1
            np.maximum(clock[u], clock_at[source], out=clock[u])
        clock[u][u] = k
        clock_at.append(clock[u].copy())
        streams[u].append(i)
        for sram, lo, hi in insn.reads:
            last_read[sram][lo:hi] = k
        for sram, lo, hi in insn.writes:
            last_write[sram][lo:hi] = k


def mark_beside(insns: Sequence[Insn], config: AcceleratorConfig) -> int:
    """Set ``beside`` (in place) on every GEMM and ALU instruction that may start while the other compute
    pipe's running instruction runs (:class:`weft.isa.semantics.BesideRule`), where its format has the bit:
    all the accumulator rows of both in different halves (virtual threads own halves), neither an ALU reading
    inp. Returns how many it set."""
    formats = layout_of(config).formats
    rule = BesideRule()
    marked = 0
    for k, insn in enumerate(insns):
        if insn.unit != Unit.COMPUTE:
            continue
        op = insn.fields.get("opcode")
        if op not in (Opcode.GEMM, Opcode.ALU):  # the compute unit's loads and FINISH wait for both pipes
            rule.barrier()
            continue
        halves = acc_halves(config, *insn.acc)
        reads_inp = op == Opcode.ALU and bool(insn.fields.get("src_inp")) and not insn.fields.get("use_imm")
        beside = formats["gemm" if op == Opcode.GEMM else "alu"].has("beside") and rule.may_start(op, halves, reads_inp)
        if beside:
            insn.fields["beside"] = 1
            marked += 1
        rule.started(k, op, halves, reads_inp, beside)
    return marked


T = TypeVar("T")


def interleave(threads: Sequence[Sequence[T]]) -> Iterator[T]:
    """Round-robin over the threads' item lists (stages), in order: a0, b0, a1, b1, ..., then the rest."""
    longest = max((len(t) for t in threads), default=0)
    for step in range(longest):
        for t in threads:
            if step < len(t):
                yield t[step]
