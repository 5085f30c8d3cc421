"""The functional simulator: the bit-exact oracle for the ISA in :mod:`weft.isa.spec` (SEMANTICS).

It runs an encoded instruction stream from a DRAM image the way the accelerator does: the fetch unit
reads the stream and routes each instruction to the load, compute or store unit (through command queues
of ``cmd_queue_depth`` entries); each unit runs its own instructions in order; the four token queues
(l2g, g2l, g2s, s2g, ``token_queue_depth`` tokens each) are the only synchronization. An instruction starts
when every queue it pops holds a token and every queue it pushes has room; it pops at the start and pushes
when done. Instructions execute atomically, compute first: load and store run only while compute is
blocked, so a FINISH that tokens do not order after the last load and store is caught.

Beyond the data, the simulator checks what hardware would silently get wrong, each as a :class:`SimError`
naming the instruction: illegal encodings (the rules of :mod:`weft.isa.semantics`, which the board's launch
checks apply too), rows and DRAM bytes out of range, uop hazards, FINISH misuse,
deadlocks (:class:`DeadlockError`) and, with ``check_races``, data races on the SRAMs two units share
(:class:`RaceError`): a load overwriting inp/wgt rows that compute may still read, compute reading rows a
load may not have written yet, and the same between compute writing out rows and store reading them.
Happens-before comes from vector clocks carried by the tokens. DRAM hazards between STORE and later loads
are not tracked. Operands an instruction does not read are not range-checked: src and wgt of a reset
GEMM, src of an ALU instruction with an immediate.

Speed: GEMM and ALU instructions run as whole-array kernels (:mod:`weft.sim.kernels`); the per-instruction
cost in Python is a few tens of microseconds.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from weft.errors import WeftError
from weft.isa import semantics
from weft.isa.arith import float_dtype_for, int_dtype, loop_indices, pack, unpack, wrap
from weft.isa.asm import format_insn
from weft.isa.constants import DRAM_ALIGN_BYTES, INSN_BYTES, AluOp, MemId, Opcode, Unit
from weft.isa.encoding import decode_insns, decode_uops, encode_insns, make_uops
from weft.isa.layout import INSN_FIELD_NAMES
from weft.isa.program import DEP_FLAGS
from weft.isa.semantics import FLAG_QUEUE, QUEUES, TOKEN_QUEUES, UNIT_NAMES, first_hazard, hazard_reach, row_bytes
from weft.sim.dram import Dram
from weft.sim.kernels import alu_apply, gemm_row_sums

if TYPE_CHECKING:
    from weft.config import AcceleratorConfig
    from weft.sim.timing import TimingModel

__all__ = [
    "INSN_KINDS", "DeadlockError", "Dram", "FunctionalSimulator", "RaceError", "SimError",
    "insn_region", "run_program",
]

LOAD, COMPUTE, STORE = int(Unit.LOAD), int(Unit.COMPUTE), int(Unit.STORE)
#: Counted instruction kinds (`stats["insns"]`); a LOAD or STORE with x_size == 0 counts as "nop".
INSN_KINDS = ("load_inp", "load_wgt", "load_uop", "load_acc", "load_acc_narrow", "store", "gemm", "alu",
              "finish", "nop")
_F = {name: k for k, name in enumerate(INSN_FIELD_NAMES)}
_INSN_ALIGN = 64


class SimError(WeftError):
    """A program the accelerator cannot run as written. ``index`` is the instruction (None for the
    fetch of the stream itself); the message names it as "instruction N"."""

    def __init__(self, message: str, index: int | None = None):
        self.index = index
        super().__init__(message)


class DeadlockError(SimError):
    """No unit can start its next instruction and the program has not finished. ``blocked`` maps each
    unit that is not done to what it waits for."""

    def __init__(self, message: str, blocked: dict[str, dict[str, Any]]):
        self.blocked = blocked
        super().__init__(message, min((b["index"] for b in blocked.values()), default=None))


class RaceError(SimError):
    """Two units touch one SRAM row and no token orders the accesses: the result depends on timing."""


@dataclass(frozen=True)
class _Mem:
    name: str
    row_bytes: int
    width: int  # bits per element
    rows: int  # SRAM rows the memory id addresses

    @property
    def elems(self) -> int:
        return self.row_bytes * 8 // self.width


def insn_region(dram_size: int, insn_count: int) -> int:
    """Where :func:`run_program` puts a program by default: the last bytes of the image, 64-byte aligned."""
    addr = (dram_size - insn_count * INSN_BYTES) // _INSN_ALIGN * _INSN_ALIGN
    if addr < 0:
        raise ValueError(f"{insn_count} instructions do not fit a {dram_size}-byte DRAM image")
    return addr


def run_program(config: AcceleratorConfig, dram: Dram, insns: np.ndarray, insn_addr: int | None = None,
                **options: Any) -> dict[str, Any]:
    """Encode `insns` (INSN_DTYPE), write them to `dram` at `insn_addr` (default: :func:`insn_region`, the
    top of the image) and run them on a fresh simulator; returns the stats. Options go to the simulator."""
    words = encode_insns(config, insns)
    if insn_addr is None:
        insn_addr = insn_region(dram.size, len(insns))
    dram.write(insn_addr, words)
    return FunctionalSimulator(config, **options).run(dram, insn_addr, len(insns))


class FunctionalSimulator:
    """Runs instruction streams for one accelerator config; the SRAMs persist between runs (as on the
    board) until :meth:`reset`.

    ``check_races`` turns on the shared-SRAM race checks; ``model_fetch`` models the in-order fetch unit
    and its command queues, so a stream whose order would stall fetch forever is reported as a deadlock.
    ``timing`` (a :class:`weft.sim.timing.TimingModel`, or True for one with the Pynq-Z1 DRAM) adds the
    predicted cycle count, the RTL's event counters and a per-instruction trace to the stats.
    """

    #: Runs a program of several layers with its figures split by layer (``run(parts=...)``).
    splits_parts = True

    def __init__(self, config: AcceleratorConfig, *, check_races: bool = True, model_fetch: bool = True,
                 timing: TimingModel | bool | None = None):
        # The config guarantees whole-byte rows, so element addresses (index * row bytes) are exact.
        self.config = c = config
        self.check_races = check_races
        self.model_fetch = model_fetch
        if timing is True:
            from weft.sim.timing import TimingModel  # local: the timing model builds on this module

            timing = TimingModel(c)
        self.timing = timing or None
        if self.timing is not None and self.timing.config.hash != c.hash:
            raise ValueError(f"the timing model is for config '{self.timing.config.name}' (hash "
                             f"{self.timing.config.hash}), the simulator for '{c.name}' (hash {c.hash})")
        self._shape = (c.batch, c.block_in, c.block_out)
        self._term_bound = c.block_in << (c.inp_width + c.wgt_width - 2)
        fdtype = float_dtype_for(c.block_in, c.inp_width, c.wgt_width)
        if fdtype is None:
            raise SimError(f"config '{c.name}': GEMM products of {c.block_in} terms are too wide to simulate")
        self._fdtype = fdtype
        rb, rows = row_bytes(c), semantics.sram_rows(c)
        widths = {MemId.UOP: c.uop_bits, MemId.WGT: c.wgt_width, MemId.INP: c.inp_width, MemId.ACC: c.acc_width,
                  MemId.OUT: c.out_width, MemId.ACC_NARROW: c.out_width}
        self._mems = {mid: _Mem(mid.name.lower(), rb[mid], widths[mid], rows[mid]) for mid in MemId}
        self._out_lo, self._out_hi = -(1 << (c.out_width - 1)), (1 << (c.out_width - 1)) - 1
        #: The inp lane each accumulator lane reads as an ALU operand from inp: lane o of a batch row
        #: reads inp lane o mod block_in.
        self._inp_lanes = (np.arange(c.batch)[:, None] * c.block_in
                           + np.arange(c.block_out)[None, :] % c.block_in).reshape(-1)
        self.reset()

    # ---- state --------------------------------------------------------------------------------------
    def reset(self) -> None:
        """Zero every SRAM."""
        c = self.config
        self._inp = np.zeros((c.inp_rows, c.batch * c.block_in), dtype=self._fdtype)
        self._wgt = np.zeros((c.wgt_rows, c.block_out * c.block_in), dtype=self._fdtype)
        self._acc = np.zeros((c.acc_rows, c.batch * c.block_out), dtype=np.int64)
        self._out = np.zeros((c.out_rows, c.batch * c.block_out), dtype=int_dtype(c.out_width))
        self._uop = np.zeros((3, c.uop_rows), dtype=np.int64)  # dst, src, wgt

    @property
    def inp(self) -> np.ndarray:
        """Input buffer, (inp_rows, batch*block_in)."""
        return self._inp.astype(int_dtype(self.config.inp_width))

    @property
    def wgt(self) -> np.ndarray:
        """Weight buffer, (wgt_rows, block_out*block_in), o-major rows."""
        return self._wgt.astype(int_dtype(self.config.wgt_width))

    @property
    def acc(self) -> np.ndarray:
        """Accumulators, (acc_rows, batch*block_out)."""
        return self._acc.astype(int_dtype(self.config.acc_width))

    @property
    def out(self) -> np.ndarray:
        """Output buffer, (out_rows, batch*block_out)."""
        return self._out.copy()

    @property
    def uop(self) -> np.ndarray:
        """Micro-op buffer as UOP_DTYPE records (dst, src, wgt)."""
        uops = make_uops(self.config.uop_rows)
        uops["dst"], uops["src"], uops["wgt"] = self._uop
        return uops

    # ---- decode and static checks -------------------------------------------------------------------
    def _fetch(self, dram: Dram, insn_addr: int, insn_count: int) -> np.ndarray:
        nbytes = insn_count * INSN_BYTES
        if insn_count < 0 or insn_addr < 0 or insn_addr + nbytes > dram.size:
            raise SimError(f"instruction fetch of {insn_count} instructions ({nbytes} bytes) at "
                           f"0x{insn_addr:x} is outside the {dram.size}-byte DRAM image")
        return decode_insns(self.config, dram.data[insn_addr:insn_addr + nbytes])

    def _route(self, insns: np.ndarray, dram_size: int) -> np.ndarray:
        """The unit of each instruction; raises SimError for the first instruction that is illegal as
        encoded (before anything runs, like a decoder that rejects the stream)."""
        n = len(insns)
        col = {name: insns[name] for name in INSN_FIELD_NAMES}
        op, mem = col["opcode"], col["mem_id"]
        is_load, is_store = op == Opcode.LOAD, op == Opcode.STORE
        units = semantics.units(insns)
        active = (is_load | is_store) & (col["x_size"] > 0)
        checks = semantics.legality_checks(insns, self.config.uop_rows)

        table = [self._mems.get(m) for m in range(8)]  # by memory id; None for ids with no memory
        rows = np.array([t.rows if t else 0 for t in table])[mem]
        row_bytes = np.array([t.row_bytes if t else 0 for t in table])[mem]
        height = col["y_pad_0"] + col["y_size"] + col["y_pad_1"]
        width = col["x_pad_0"] + col["x_size"] + col["x_pad_1"]
        sram_end = col["sram_base"] + height * width
        names = [t.name if t else "?" for t in table]
        checks.append((active & (sram_end > rows), lambda i: (
            f"{'reads' if is_store[i] else 'writes'} {names[mem[i]]} rows {col['sram_base'][i]}.."
            f"{sram_end[i] - 1}, beyond the {rows[i]} rows of that buffer")))
        first = col["dram_base"] * row_bytes
        last = (col["dram_base"] + (col["y_size"] - 1) * col["x_stride"] + col["x_size"]) * row_bytes
        checks.append((active & (col["y_size"] > 0) & (last > dram_size), lambda i: (
            f"DRAM bytes 0x{first[i]:x}..0x{last[i] - 1:x} are outside the {dram_size}-byte image")))

        finishes = np.flatnonzero(op == Opcode.FINISH)
        order_bad = np.zeros(n, dtype=bool)
        if finishes.size and finishes[0] < n - 1:
            order_bad[finishes[0] + 1] = True
        checks.append((order_bad, lambda i: (
            f"follows the FINISH at instruction {i - 1}: FINISH must be last")))

        illegal = semantics.first_illegal(checks)
        if illegal is not None:
            i, rule = illegal
            raise SimError(f"instruction {i} ({format_insn(insns[i])}): {rule}", i)
        if not finishes.size:
            last_index = max(n - 1, 0)
            raise SimError(f"instruction {last_index}: the program ends without FINISH "
                           f"({n} instructions; the last one must be FINISH)", last_index)
        return units

    # ---- running --------------------------------------------------------------------------------------
    def run(self, dram: Dram, insn_addr: int, insn_count: int, parts: Sequence[int] = ()) -> dict[str, Any]:
        """Fetch `insn_count` instructions at byte `insn_addr` of `dram`, run them to FINISH (mutating
        `dram` and the SRAMs) and return the stats:

        ``insns`` (count per kind, see INSN_KINDS), ``bytes`` (DRAM bytes moved per memory: uop, wgt,
        inp, acc, acc_narrow, out; padding moves none), ``macs`` (non-reset GEMM executions x batch x
        block_in x block_out), ``alu_ops`` (ALU executions x batch x block_out), ``gemm_execs`` (reset
        included), ``alu_execs``, ``tokens`` (pushes per queue), ``tokens_left`` (still queued at FINISH),
        ``max_tokens`` (peak occupancy per queue: how far units ran ahead of each other), ``insn_count``,
        ``wall_s`` and ``cycles`` (None without a timing model). With one (``timing``), ``cycles`` is the
        predicted cycle count and the stats add ``counters`` (the RTL's event counters,
        :data:`weft.hw.regs.COUNTERS`), ``utilization`` (MAC-active cycles / cycles) and ``trace`` (per
        instruction: unit, kind, ready, start, end; :data:`weft.sim.timing.TRACE_DTYPE`).

        `parts` (a program of several layers, :mod:`weft.compiler.backend.chain`): the index one past each
        part's last instruction; the stats then add ``parts``, each part's ``insns``, ``bytes``, ``macs``,
        ``alu_ops``, ``gemm_execs``, ``alu_execs``, ``insn_count`` and (with a timing model) ``cycles``
        (:func:`weft.sim.timing.part_cycles`).

        Raises SimError (DeadlockError, RaceError) for a program the accelerator cannot run as written;
        the SRAMs and `dram` are then left as they were when the failing instruction started.
        """
        started = time.perf_counter()
        insns = self._fetch(dram, int(insn_addr), int(insn_count))
        units = self._route(insns, dram.size)
        n = len(insns)
        self._insns = insns
        rows = insns.view(np.int64).reshape(n, len(INSN_FIELD_NAMES)).tolist()
        unit_of = units.tolist()
        self._unit_of = unit_of
        streams: list[list[int]] = [np.flatnonzero(units == u).tolist() for u in (LOAD, COMPUTE, STORE)]
        self._streams = streams
        pops: list[tuple[int, ...]] = []
        pushes: list[tuple[int, ...]] = []
        flag_cols = [_F[f] for f in DEP_FLAGS]
        for r, u in zip(rows, unit_of, strict=True):
            table = FLAG_QUEUE[u]
            set_flags = [f for f, k in zip(DEP_FLAGS, flag_cols, strict=True) if r[k]]
            pops.append(tuple(table[f] for f in set_flags if f.startswith("pop")))
            pushes.append(tuple(table[f] for f in set_flags if f.startswith("push")))
        self._new_run_state()
        stats = _new_stats()
        ends = list(parts) or [n]
        if ends[-1] != n or any(b <= a for a, b in itertools.pairwise([0, *ends])):
            raise SimError(f"parts {ends} do not split the program's {n} instructions", n - 1)
        part_stats = [_new_stats() for _ in ends]  # (the run's stats add them up below)
        stats_of = [part_stats[k] for k, (a, b) in enumerate(itertools.pairwise([0, *ends])) for _ in range(a, b)]

        depth, cmd_depth = self.config.token_queue_depth, self.config.cmd_queue_depth
        lengths = [len(s) for s in streams]
        pos = [0, 0, 0]
        dispatched = [0, 0, 0] if self.model_fetch else list(lengths)
        fetched = 0 if self.model_fetch else n
        tokens: list[deque[tuple[int, int, int]]] = [deque() for _ in QUEUES]
        clocks = [[0, 0, 0] for _ in range(3)]
        peak = [0] * len(QUEUES)
        while True:
            while fetched < n and dispatched[unit_of[fetched]] - pos[unit_of[fetched]] < cmd_depth:
                dispatched[unit_of[fetched]] += 1
                fetched += 1
            for u in (COMPUTE, LOAD, STORE):
                p = pos[u]
                if p >= dispatched[u]:
                    continue
                i = streams[u][p]
                if all(tokens[q] for q in pops[i]) and all(len(tokens[q]) < depth for q in pushes[i]):
                    break
            else:
                raise self._deadlock(pos, dispatched, fetched, unit_of, tokens, pops, pushes)
            clock = clocks[u]
            for q in pops[i]:
                for k, t in enumerate(tokens[q].popleft()):
                    if t > clock[k]:
                        clock[k] = t
            clock[u] = p + 1
            r = rows[i]
            opcode = r[_F["opcode"]]
            if u == COMPUTE and opcode not in (Opcode.GEMM, Opcode.ALU):
                self._beside_rule.barrier()  # a LOAD or FINISH of the compute unit waits for both pipes
            if opcode == Opcode.FINISH:
                self._check_finish(i, clock, pos, lengths)
                stats_of[i]["insns"]["finish"] += 1
            else:
                self._execute(i, r, opcode, clock, dram, stats_of[i])
            for q in pushes[i]:
                tokens[q].append((clock[0], clock[1], clock[2]))
                stats["tokens"][QUEUES[q]] += 1
                peak[q] = max(peak[q], len(tokens[q]))
            pos[u] = p + 1
            if opcode == Opcode.FINISH:
                break
        for part in part_stats:
            for key in _PART_KEYS:
                if isinstance(part[key], dict):
                    stats[key] = {k: stats[key][k] + v for k, v in part[key].items()}
                else:
                    stats[key] += part[key]
        if parts:
            stats["parts"] = [{**{key: part[key] for key in _PART_KEYS}, "insn_count": b - a}
                              for part, a, b in zip(part_stats, [0, *ends[:-1]], ends, strict=True)]
        stats["tokens_left"] = {name: len(tokens[q]) for q, name in enumerate(QUEUES)}
        stats["max_tokens"] = dict(zip(QUEUES, peak, strict=True))
        stats["insn_count"] = n
        if self.timing is not None:
            report = self.timing.simulate(insns, int(insn_addr))
            stats.update(cycles=report.cycles, counters=report.counters, utilization=report.utilization,
                         trace=report.trace)
            if parts:
                from weft.sim.timing import part_cycles  # local: the timing model builds on this module

                for part, cycles in zip(stats["parts"], part_cycles(report.trace, ends), strict=True):
                    part["cycles"] = cycles
        stats["wall_s"] = time.perf_counter() - started
        return stats

    def _check_finish(self, i: int, clock: list[int], pos: list[int], lengths: list[int]) -> None:
        for u in (LOAD, STORE):
            if clock[u] == lengths[u]:
                continue
            name = UNIT_NAMES[u]
            if pos[u] < lengths[u]:
                j = self._streams[u][pos[u]]
                why = f"the {name} unit has not run instruction {j} ({format_insn(self._insns[j])}) yet"
            else:
                j = self._streams[u][-1]
                why = f"no token orders the {name} unit's last instruction {j} before it"
            raise SimError(f"instruction {i} (FINISH): {why}; FINISH must come after every load and store "
                           "(e.g. pop a token the last store pushes)", i)

    def _deadlock(self, pos: list[int], dispatched: list[int], fetched: int, unit_of: list[int],
                  tokens: list[deque], pops: list[tuple[int, ...]], pushes: list[tuple[int, ...]]
                  ) -> DeadlockError:
        depth = self.config.token_queue_depth
        parts, blocked = [], {}
        for u in (LOAD, COMPUTE, STORE):
            name, stream = UNIT_NAMES[u], self._streams[u]
            if pos[u] == len(stream):
                parts.append(f"{name} unit done")
                continue
            i = stream[pos[u]]
            waits = []
            if pos[u] >= dispatched[u]:
                full = UNIT_NAMES[unit_of[fetched]]
                waits.append(f"fetch (stalled at instruction {fetched}: the {full} command queue is full, "
                             f"{self.config.cmd_queue_depth} entries)")
            else:
                waits += [f"pop {QUEUES[q]} ({TOKEN_QUEUES[q].doc}), which is empty" for q in pops[i]
                          if not tokens[q]]
                waits += [f"push {QUEUES[q]} ({TOKEN_QUEUES[q].doc}), which is full ({depth} tokens)"
                          for q in pushes[i] if len(tokens[q]) >= depth]
            blocked[name] = {"index": i, "waits": waits}
            parts.append(f"{name} unit blocked at instruction {i} ({format_insn(self._insns[i])}): waits to "
                         + " and to ".join(waits))
        return DeadlockError("deadlock: no unit can proceed; " + "; ".join(parts), blocked)

    # ---- execution --------------------------------------------------------------------------------------
    def _new_run_state(self) -> None:
        c = self.config
        # Race tracking: per shared SRAM row, the epoch (1-based position in its unit's stream) of the last
        # write by its writer unit and of the last read by its reader unit.
        self._epochs = {
            "inp": (np.zeros(c.inp_rows, np.int64), np.zeros(c.inp_rows, np.int64)),
            "wgt": (np.zeros(c.wgt_rows, np.int64), np.zeros(c.wgt_rows, np.int64)),
            "out": (np.zeros(c.out_rows, np.int64), np.zeros(c.out_rows, np.int64)),
        }
        self._beside_rule = semantics.BesideRule()
        #: Per DRAM line, the store (1-based position in the store unit's stream) that last wrote it this run,
        #: and the load of each loading unit that last read it.
        self._stored: np.ndarray | None = None
        self._dram_read: dict[int, np.ndarray] = {}

    def _error(self, i: int, message: str, cls: type[SimError] = SimError) -> SimError:
        return cls(f"instruction {i} ({format_insn(self._insns[i])}): {message}", i)

    def _beside(self, i: int, r: list[int], opcode: int, rows: tuple[np.ndarray, ...], reads_inp: bool) -> None:
        """Spec "beside" (:class:`weft.isa.semantics.BesideRule`): an instruction that may start while the
        other pipe's last one still runs touches only the other half of the accumulator, and neither reads inp."""
        halves = frozenset().union(*(semantics.acc_halves(self.config, int(x.min()), int(x.max()) + 1)
                                     for x in rows if x.size))
        beside = bool(r[_F["beside"]])
        if beside:
            why = self._beside_rule.conflict(opcode, halves, reads_inp)
            if why is not None:
                raise self._error(i, why)
        self._beside_rule.started(i, opcode, halves, reads_inp, beside)

    def _execute(self, i: int, r: list[int], opcode: int, clock: list[int], dram: Dram, stats: dict) -> None:
        if opcode == Opcode.GEMM:
            self._gemm(i, r, clock, stats)
        elif opcode == Opcode.ALU:
            self._alu(i, r, clock, stats)
        elif r[_F["x_size"]] == 0:
            stats["insns"]["nop"] += 1
        elif opcode == Opcode.LOAD:
            self._load(i, r, clock, dram, stats)
        else:
            self._store(i, r, clock, dram, stats)

    # Race checks. `writer`/`reader` are the units that write and read the SRAM; clock[unit] is how far
    # this instruction knows that unit has got.
    def _race(self, i: int, sram: str, rows: np.ndarray | slice, clock: list[int], *, reader: int, writer: int,
              write: bool) -> None:
        """Record a write (or read) of `rows`; raise RaceError when the last read (or write) of one of them by
        the other unit is not ordered before it by tokens."""
        if not self.check_races:
            return
        written, read = self._epochs[sram]
        other, last = (reader, read) if write else (writer, written)
        if last[rows].size and int(last[rows].max()) > clock[other]:
            row, epoch = self._culprit(rows, last, clock[other])
            j = self._streams[other][epoch - 1]
            culprit = f"instruction {j} ({format_insn(self._insns[j])})"
            raise self._error(i, (f"overwrites {sram} row {row} that {culprit} reads, and no token orders that read "
                                  "before this write" if write else
                                  f"reads {sram} row {row} written by {culprit}, and no token orders that write "
                                  "before this read") + " (data race)", RaceError)
        if write:
            written[rows] = clock[writer]
        else:
            read[rows] = clock[reader]

    @staticmethod
    def _culprit(rows: np.ndarray | slice, epochs: np.ndarray, known: int) -> tuple[int, int]:
        index = np.arange(epochs.size)[rows]
        k = int(np.argmax(epochs[index] > known))
        return int(index[k]), int(epochs[index[k]])

    def _dram_rows(self, dram: Dram, r: list[int], spec: _Mem) -> np.ndarray:
        """The (y_size, x_size * row_bytes) bytes a LOAD reads (a strided view: bounds are pre-checked)."""
        rb, y, x = spec.row_bytes, r[_F["y_size"]], r[_F["x_size"]]
        if y == 0:
            return np.zeros((0, x * rb), dtype=np.uint8)
        start = r[_F["dram_base"]] * rb
        return as_strided(dram.data[start:], shape=(y, x * rb), strides=(r[_F["x_stride"]] * rb, 1),
                          writeable=False)

    def _dram_lines(self, r: list[int], rb: int) -> list[tuple[int, int]]:
        """The DRAM lines (of _DRAM_LINE bytes) each row of a 2-D transfer touches: [first, last + 1) per row."""
        start, x, stride = r[_F["dram_base"]] * rb, r[_F["x_size"]] * rb, r[_F["x_stride"]] * rb
        return [((start + k * stride) // _DRAM_LINE, (start + k * stride + x - 1) // _DRAM_LINE + 1)
                for k in range(r[_F["y_size"]]) if x]

    def _dram_race(self, i: int, u: int, r: list[int], rb: int, clock: list[int], dram: Dram) -> None:
        """Check a load or store's DRAM lines against the stores and loads before it, and record them: a load
        reads what the store that last wrote the line stored only when a token orders that store before it,
        and a store overwrites what a load read only when one orders that load before it (a layer reading
        what an earlier layer of the same program stored, weft.compiler.backend.chain's barriers: whichever
        of the two the simulator happens to run first). Values have buffers aligned to lines of their own."""
        if not self.check_races:
            return
        if self._stored is None or self._stored.size * _DRAM_LINE < dram.size:
            lines = -(-dram.size // _DRAM_LINE)
            self._stored = np.zeros(lines, np.int64)
            self._dram_read = {LOAD: np.zeros(lines, np.int64), COMPUTE: np.zeros(lines, np.int64)}
        stored, store = self._stored, u == STORE
        for a, b in self._dram_lines(r, rb):
            checks = [(reader, read) for reader, read in self._dram_read.items()] if store else [(STORE, stored)]
            for other, last in checks:
                if int(last[a:b].max()) > clock[other]:
                    line, epoch = self._culprit(slice(a, b), last, clock[other])
                    j = self._streams[other][epoch - 1]
                    raise self._error(i, (
                        f"stores DRAM bytes {line * _DRAM_LINE}.. that instruction {j} ({format_insn(self._insns[j])}) "
                        "loads, and no token orders that load before this store" if store else
                        f"loads DRAM bytes {line * _DRAM_LINE}.. that instruction {j} ({format_insn(self._insns[j])}) "
                        "stores, and no token orders that store before this load") + " (data race)", RaceError)
            if store:
                stored[a:b] = clock[STORE]
            else:
                self._dram_read[u][a:b] = clock[u]

    def _load(self, i: int, r: list[int], clock: list[int], dram: Dram, stats: dict) -> None:
        mem = MemId(r[_F["mem_id"]])
        spec = self._mems[mem]
        y, x, base = r[_F["y_size"]], r[_F["x_size"]], r[_F["sram_base"]]
        self._dram_race(i, self._unit_of[i], r, spec.row_bytes, clock, dram)
        raw = self._dram_rows(dram, r, spec)
        stats["insns"][f"load_{spec.name}"] += 1
        stats["bytes"][spec.name] += raw.size
        if mem == MemId.UOP:
            uops = decode_uops(self.config, raw)
            self._uop[:, base:base + uops.size] = (uops["dst"], uops["src"], uops["wgt"])
            return
        y0, y1, x0, x1 = (r[_F[k]] for k in ("y_pad_0", "y_pad_1", "x_pad_0", "x_pad_1"))
        values = unpack(raw, spec.width).reshape(y, x, spec.elems)
        if y0 or y1 or x0 or x1:
            tile = np.zeros((y0 + y + y1, x0 + x + x1, spec.elems), dtype=values.dtype)
            tile[y0:y0 + y, x0:x0 + x] = values
            values = tile
        values = values.reshape(-1, spec.elems)
        end = base + values.shape[0]
        if mem == MemId.INP:
            self._race(i, "inp", slice(base, end), clock, reader=COMPUTE, writer=LOAD, write=True)
            self._inp[base:end] = values
        elif mem == MemId.WGT:
            self._race(i, "wgt", slice(base, end), clock, reader=COMPUTE, writer=LOAD, write=True)
            self._wgt[base:end] = values
        else:  # ACC, or ACC_NARROW sign-extended into the accumulator
            self._acc[base:end] = values

    def _store(self, i: int, r: list[int], clock: list[int], dram: Dram, stats: dict) -> None:
        spec = self._mems[MemId.OUT]
        y, x, base, stride = r[_F["y_size"]], r[_F["x_size"]], r[_F["sram_base"]], r[_F["x_stride"]]
        self._race(i, "out", slice(base, base + y * x), clock, reader=STORE, writer=COMPUTE, write=False)
        self._dram_race(i, STORE, r, spec.row_bytes, clock, dram)
        rb = spec.row_bytes
        stats["insns"]["store"] += 1
        stats["bytes"]["out"] += y * x * rb
        if y == 0:
            return
        data = pack(self._out[base:base + y * x].reshape(y, x * spec.elems), spec.width)
        start = r[_F["dram_base"]] * rb
        if y == 1 or stride >= x:  # rows do not overlap in DRAM
            view = as_strided(dram.data[start:], shape=(y, x * rb), strides=(stride * rb, 1))
            view[...] = data
        else:  # overlapping rows: later rows win, as the DMA writes them in order
            for k in range(y):
                dram.data[start + k * stride * rb:start + k * stride * rb + x * rb] = data[k]

    def _loop(self, i: int, r: list[int], which: int, name: str, limit: int, memory: str) -> np.ndarray:
        """Row indices of one operand over the whole loop, in execution order, range-checked."""
        bgn, end = r[_F["uop_bgn"]], r[_F["uop_end"]]
        idx = loop_indices(self._uop[which, bgn:end], r[_F["iter_out"]], r[_F["iter_in"]],
                           r[_F[f"{name}_factor_out"]], r[_F[f"{name}_factor_in"]])
        if idx.size and int(idx.max()) >= limit:
            e = int(np.argmax(idx >= limit))
            raise self._error(i, f"{self._where(r, e)} {name} row {idx[e]} is beyond the {limit} rows of "
                                 f"{memory}")
        return idx

    @staticmethod
    def _where(r: list[int], e: int) -> str:
        count = r[_F["uop_end"]] - r[_F["uop_bgn"]]
        inner, k = divmod(e, count)
        i, j = divmod(inner, max(r[_F["iter_in"]], 1))
        return f"execution {e} (i={i}, j={j}, uop {r[_F['uop_bgn']] + k})"

    def _hazards(self, i: int, r: list[int], dst: np.ndarray, src: np.ndarray | None) -> None:
        found = first_hazard(dst, src, hazard_reach(r[_F["opcode"]], r[_F["alu_op"]]))
        if found is None:
            return
        e = found.execution
        before = "the previous execution" if found.back == 1 else \
            f"the execution {found.back} before it ({AluOp(r[_F['alu_op']]).name}'s result comes late)"
        if found.kind == "read":
            raise self._error(i, f"{self._where(r, e)} reads acc row {src[e]} that {before} writes: "
                                 "this read-after-write is a hazard the pipeline does not check")
        raise self._error(i, f"{self._where(r, e)} writes acc row {dst[e]} like {before}: "
                             "this is a hazard the pipeline does not check")

    def _dst(self, i: int, r: list[int], kind: str, stats: dict) -> np.ndarray:
        """Count a GEMM or ALU instruction; the acc rows its executions write, in execution order."""
        stats["insns"][kind] += 1
        return self._loop(i, r, 0, "dst", self.config.acc_rows, "acc")

    def _gemm(self, i: int, r: list[int], clock: list[int], stats: dict) -> None:
        c = self.config
        dst = self._dst(i, r, "gemm", stats)
        self._beside(i, r, Opcode.GEMM, (dst,), False)
        if not dst.size:
            return
        self._hazards(i, r, dst, None)
        stats["gemm_execs"] += dst.size
        if r[_F["reset"]]:
            rows = np.flatnonzero(np.bincount(dst, minlength=c.acc_rows))
            self._race(i, "out", rows, clock, reader=STORE, writer=COMPUTE, write=True)
            self._acc[rows] = 0
            self._out[rows] = 0
            return
        src = self._loop(i, r, 1, "src", c.inp_rows, "inp")
        wsel = self._loop(i, r, 2, "wgt", c.wgt_rows, "wgt")
        self._race(i, "inp", src, clock, reader=COMPUTE, writer=LOAD, write=False)
        self._race(i, "wgt", wsel, clock, reader=COMPUTE, writer=LOAD, write=False)
        execs = dst.size
        overwrite = bool(r[_F["overwrite"]])
        if overwrite:  # each execution writes its own products: a row keeps its last execution's
            last = dst.size - 1 - np.unique(dst[::-1], return_index=True)[1]
            dst, src, wsel = dst[last], src[last], wsel[last]
        rows, sums = gemm_row_sums(self._inp, self._wgt, dst, src, wsel, self._shape, c.acc_rows,
                                   self._term_bound)
        self._race(i, "out", rows, clock, reader=STORE, writer=COMPUTE, write=True)
        self._acc[rows] = wrap(sums if overwrite else self._acc[rows] + sums, c.acc_width)
        self._out[rows] = np.clip(self._acc[rows], self._out_lo, self._out_hi)
        stats["macs"] += execs * c.macs_per_cycle

    def _alu(self, i: int, r: list[int], clock: list[int], stats: dict) -> None:
        c = self.config
        dst = self._dst(i, r, "alu", stats)
        if not dst.size:
            self._beside(i, r, Opcode.ALU, (), bool(r[_F["src_inp"]] and not r[_F["use_imm"]]))
            return
        operand: int | np.ndarray = r[_F["imm"]]
        src = None
        if r[_F["use_imm"]]:
            pass
        elif r[_F["src_inp"]]:  # the operand rows come from inp: no acc row is read, so no read hazard
            rows_in = self._loop(i, r, 1, "src", c.inp_rows, "inp")
            self._race(i, "inp", rows_in, clock, reader=COMPUTE, writer=LOAD, write=False)
            operand = self._inp[rows_in][:, self._inp_lanes].astype(np.int64)
        else:
            src = self._loop(i, r, 1, "src", c.acc_rows, "acc")
        self._beside(i, r, Opcode.ALU, (dst,) if src is None else (dst, src),
                     bool(r[_F["src_inp"]] and not r[_F["use_imm"]]))
        self._hazards(i, r, dst, src)
        if self.check_races:  # before anything changes, so a failing run stops at the instruction's start
            self._race(i, "out", np.unique(dst), clock, reader=STORE, writer=COMPUTE, write=True)
        rows = alu_apply(self._acc, r[_F["alu_op"]], dst, src, operand, c.acc_width, c.acc_rows)
        self._out[rows] = np.clip(self._acc[rows], self._out_lo, self._out_hi)
        stats["alu_execs"] += dst.size
        stats["alu_ops"] += dst.size * c.batch * c.block_out


#: The DRAM race check's granularity: every region of an artifact's DRAM is aligned to it.
_DRAM_LINE = DRAM_ALIGN_BYTES

#: The stats a run adds up over its parts (and reports per part).
_PART_KEYS = ("insns", "bytes", "macs", "alu_ops", "gemm_execs", "alu_execs")


def _new_stats() -> dict[str, Any]:
    return {
        "insns": dict.fromkeys(INSN_KINDS, 0),
        "bytes": dict.fromkeys(("uop", "wgt", "inp", "acc", "acc_narrow", "out"), 0),
        "macs": 0,
        "alu_ops": 0,
        "gemm_execs": 0,
        "alu_execs": 0,
        "tokens": dict.fromkeys(QUEUES, 0),
        "cycles": None,
    }

