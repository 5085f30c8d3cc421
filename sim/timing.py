"""The timing model: how many cycles the accelerator (:mod:`weft.hw`) takes to run an instruction stream.

An event model at the granularity of instructions and DRAM bursts, whose costs follow the RTL's structure
(:class:`Microarch`) and the DRAM's latency and bandwidth (:class:`weft.sim.dram_timing.DramTiming`, the
same numbers the cosimulation's DRAM answers with):

* fetch reads the stream in bursts (at most ``max_burst`` beats, never across 4 KiB, at most
  ``reader_beats`` beats requested and not yet consumed), unpacks ``ceil(16 bytes / bus)`` beats per
  instruction and dispatches one instruction per cycle into the unit's command queue
  (``cmd_queue_depth``), stalling while that queue is full;
* a unit starts its next instruction once it is free, the command is out of its queue, every token it
  pops is there and every queue it pushes has room; it pops at the start and pushes when done;
* LOAD (load unit: inp, wgt; compute unit: uop, acc, acc_narrow): one read request per DRAM row, each
  split into bursts; the requests of the three read clients (fetch, load, compute) share one AR channel
  (round-robin, a grant every ``arbiter_gap`` cycles) and one R channel that returns bursts in grant
  order, ``read_latency`` cycles after the grant, at ``read_duty`` beats per cycle; the SRAM is written one
  element per cycle in row order, zero padding included (no DRAM traffic), an element no earlier than
  its beats arrive, and at most ``unpack_queue`` rows are requested ahead of the writes;
* GEMM/ALU: one micro-op execution per cycle through its pipe (``gemm_stages`` or ``alu_stages`` deep),
  which fills and drains once per instruction; an ALU instruction that reads acc[src] issues one every
  ``alu_src_interval`` cycles (the accumulator's one read port reads dst and src in turn), but for an
  instruction of at most ``hw.structure.SRC_ROWS`` micro-ops without src loop factors, whose first sweep reads the
  rows into registers and the rest issue one per cycle;
* STORE: one element read per cycle from the output buffer, packed into beats, one write burst sequence
  per DRAM row (at most ``store_len_queue`` bursts ahead of their data), ``write_duty`` beats per cycle,
  done when the last write response is back, ``write_latency`` cycles after the last beat.

The cost is O(instructions + DRAM bursts), never O(micro-op executions). The result holds the RTL's event
counters (:data:`weft.hw.regs.COUNTERS`, same names and meanings) and a trace: for every instruction its
unit, kind, when it could have started (``ready``: unit free and command present), ``start`` and ``end``
(the cycle its unit is free again), from which a Chrome/Perfetto trace is drawn (:func:`trace_events`).

Cycle 0 is the first cycle the RTL's cycle counter counts (the cycle after START). Beats move in a fluid
approximation of the DRAM's pause pattern, so times are fractional; counters are rounded at the end.
:mod:`weft.sim.timing_calibrate` runs the same streams on the RTL to compare.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from weft.errors import WeftError
from weft.hw import structure
from weft.hw.regs import COUNTERS
from weft.isa.constants import AXI_BOUNDARY_BYTES, INSN_BYTES, MemId, Opcode, Unit
from weft.isa.layout import INSN_FIELD_NAMES
from weft.isa.program import DEP_FLAGS
from weft.isa.semantics import FLAG_QUEUE, QUEUES, UNIT_NAMES, row_bytes, units
from weft.sim.dram_timing import DramTiming
from weft.sim.fsim import INSN_KINDS

if TYPE_CHECKING:
    from weft.config import AcceleratorConfig

__all__ = ["TRACE_DTYPE", "Microarch", "TimingError", "TimingModel", "TimingReport",
           "trace_events"]

#: One row per instruction: its stream index, unit (Unit), kind (index into fsim.INSN_KINDS), and the
#: cycles it could start (unit free, command present), started, and ended (its unit free again).
TRACE_DTYPE = np.dtype([("index", np.int64), ("unit", np.int8), ("kind", np.int8), ("ready", np.float64),
                        ("start", np.float64), ("end", np.float64)])
_F = {name: k for k, name in enumerate(INSN_FIELD_NAMES)}
_KIND_CODE = {name: k for k, name in enumerate(INSN_KINDS)}


class TimingError(WeftError):
    """A stream the timing model cannot time: it deadlocks (run it on the functional simulator, which
    checks streams, to see why)."""


@dataclass(frozen=True)
class Microarch:
    """The structure of the RTL that the costs follow from: the depths the hardware is built with
    (:mod:`weft.hw.structure`), and behaviour that tests measure on the RTL (latencies, handshakes)."""

    #: Beats per AXI burst (the Zynq-7000 HP ports are AXI3).
    max_burst: int = structure.MAX_BURST
    #: hw.dma.BurstReader depth: beats a reader may have requested and not yet consumed.
    reader_beats: int = structure.READER_BEATS
    #: hw.dma.Load2D unpack_depth: DRAM rows a load may request ahead of the row it writes.
    unpack_queue: int = structure.UNPACK_DEPTH
    #: hw.dma.Store2D segment queue: DRAM rows a store may address ahead of the row it packs.
    store_seg_queue: int = structure.STORE_SEG_DEPTH
    #: hw.dma.Store2D burst-length queue: write bursts addressed ahead of their data.
    store_len_queue: int = structure.STORE_LEN_DEPTH
    #: hw.dma.Store2D: cycles from an SRAM read to its data entering the row queue (the read, registered).
    store_read_stages: int = structure.STORE_READ_STAGES
    #: hw.fetch, a bus narrower than an instruction: cycles from the word's last beat to its dispatch.
    fetch_decode_cycles: int = structure.FETCH_DECODE_CYCLES
    #: hw.fetch: cycles from its dispatch verdict to the command queue's write: the word leaves through a
    #: register of its own, which takes the next word as its own goes out (one a cycle).
    fetch_out_cycles: int = structure.FETCH_OUT_CYCLES
    #: amaranth.lib.fifo.SyncFIFOBuffered: cycles from a write into an empty queue to its read.
    fifo_latency: int = 2
    #: hw.unit and the engines: cycles from an instruction's start to its engine's first action (the unit
    #: registers the instruction; the engine, a DMA or the compute loop generator, its command).
    command_cycles: int = 2
    #: hw.axi.ReadArbiter: the grant is registered, so the AR channel takes a request every 2 cycles.
    arbiter_gap: int = 2
    #: hw.dma.BurstReader: cycles from a request taken (into its command register) to its first burst's
    #: address, when no request is ahead of it.
    reader_start: int = 2
    #: hw.dma.BurstReader: cycles from the consumer's take that makes room in the reader's buffer for a burst
    #: to that burst's address (the room verdict counts the takes up to the cycle before its own).
    reader_room_cycles: int = 2
    #: hw.compute, the GEMM pipe: loop generator, micro-op word (registered), row indices, the GEMM core's
    #: operands, products and adder tree (the accumulator's dst read beside it), accumulate (two), write back.
    gemm_stages: int = structure.COMPUTE_STAGES + structure.GEMM_LATENCY + structure.ACCUMULATE_STAGES
    #: hw.compute, the ALU pipe: loop generator, micro-op word (registered), row indices, its operands' reads,
    #: the ALU (three), write back.
    alu_stages: int = structure.COMPUTE_STAGES + structure.ALU_READ_STAGES + structure.ALU_STAGES
    #: hw.compute: cycles between issues of ALU micro-ops that read acc[src] (one accumulator read port).
    alu_src_interval: int = structure.ALU_SRC_INTERVAL
    #: Cycles from queueing a read burst's beats (read_latency after the AR handshake, and at least one
    #: cycle after it) to its first R beat: the DRAM model's R source drives a beat on the next edge.
    read_handshake: int = 1
    #: Cycles from the last W beat to the store's done on top of the DRAM's write_latency (at least 1): the B
    #: response through the model's B source, the outstanding-burst count, the registered busy.
    write_handshake: int = 3


@dataclass(frozen=True)
class TimingReport:
    """What :meth:`TimingModel.simulate` predicts for one stream."""

    cycles: int
    #: The RTL's event counters (weft.hw.regs.COUNTERS): same names, same meanings.
    counters: dict[str, int]
    #: Per instruction, in stream order: TRACE_DTYPE.
    trace: np.ndarray
    dram: DramTiming

    @property
    def utilization(self) -> float:
        """MAC-active cycles / cycles, as the RTL's counters give it."""
        return self.counters["mac_active"] / self.cycles if self.cycles else 0.0

    def summary(self) -> dict[str, Any]:
        """JSON-ready figures (no trace)."""
        c = self.cycles
        return {
            "cycles": c, "counters": dict(self.counters), "utilization": self.utilization,
            "unit_busy": {u: (self.counters[f"busy_{u}"] / c if c else 0.0) for u in UNIT_NAMES},
            "dram": self.dram.to_dict(),
        }


def trace_events(trace: np.ndarray, clock_mhz: float, name: str = "weft") -> list[dict[str, Any]]:
    """Chrome/Perfetto trace events ("X" complete events, microseconds) of a TRACE_DTYPE array: one track
    per unit, one slice per instruction, plus the wait before each start as a "stall" slice."""
    us = 1.0 / clock_mhz
    events: list[dict[str, Any]] = [{"ph": "M", "pid": 0, "name": "process_name", "args": {"name": name}}]
    for u, unit in enumerate(UNIT_NAMES):
        events.append({"ph": "M", "pid": 0, "tid": u, "name": "thread_name", "args": {"name": unit}})
    for row in trace.tolist():
        index, unit, kind, ready, start, end = row
        if start > ready:
            events.append({"ph": "X", "pid": 0, "tid": unit, "name": "stall", "ts": ready * us,
                           "dur": (start - ready) * us, "args": {"index": index}})
        events.append({"ph": "X", "pid": 0, "tid": unit, "name": INSN_KINDS[kind], "ts": start * us,
                       "dur": (end - start) * us, "args": {"index": index}})
    return events


# ---- a minimal discrete-event kernel ----------------------------------------------------------------------
class _Event:
    """A value that becomes known once (a time, or burst arrival data); processes wait for it."""

    __slots__ = ("value", "waiters")

    def __init__(self) -> None:
        self.value: Any = None
        self.waiters: list[Generator] = []


class _After:
    """Yielded by a process: resume at `time`, after every process that runs at that time."""

    __slots__ = ("time",)

    def __init__(self, time: float) -> None:
        self.time = time


class _Kernel:
    """Runs generator processes in time order. A process yields a time (sleep until then), an _After, or
    an _Event (wait until it is fired; the yield returns its value)."""

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, int, Generator, Any]] = []
        self._seq = itertools.count()

    def spawn(self, proc: Generator) -> None:
        self._push(self.now, 0, proc, None)

    def _push(self, t: float, late: int, proc: Generator, value: Any) -> None:
        heapq.heappush(self._heap, (t, late, next(self._seq), proc, value))

    def fire(self, event: _Event, value: Any) -> None:
        event.value = value
        for proc in event.waiters:
            self._push(self.now, 0, proc, value)
        event.waiters = []

    def run(self) -> None:
        while self._heap:
            t, _, _, proc, value = heapq.heappop(self._heap)
            self.now = t
            while True:
                try:
                    what = proc.send(value)
                except StopIteration:
                    break
                if isinstance(what, _Event):
                    if what.value is None:
                        what.waiters.append(proc)
                        break
                    value = what.value
                    continue
                if isinstance(what, _After):
                    self._push(max(what.time, self.now), 1, proc, None)
                else:
                    self._push(max(float(what), self.now), 0, proc, None)
                break


def mac_executions(insns: np.ndarray) -> np.ndarray:
    """Per instruction, the executions that keep the MAC array busy (the ``mac_active`` counter's share):
    a GEMM that is not a reset, its micro-ops times its two loops; 0 for the rest."""
    execs = (insns["uop_end"].astype(np.int64) - insns["uop_bgn"]) * insns["iter_out"] * insns["iter_in"]
    return np.where((insns["opcode"] == Opcode.GEMM) & (insns["reset"] == 0), execs, 0)


def part_cycles(trace: np.ndarray, ends: Sequence[int]) -> list[int]:
    """The cycles of each part of a program of several layers (:mod:`weft.compiler.backend.chain`; `ends`:
    the index one past each part's last instruction), from its trace: a part ends when the last of its
    instructions does (or the part before it, if that is later), and its cycles run from the part before's
    end to its own. They add up to the program's cycles, less the FINISH's few."""
    out, before = [], 0.0
    for a, b in zip([0, *ends[:-1]], ends, strict=True):
        end = max(before, float(trace["end"][a:b].max()))
        out.append(round(end - before))
        before = end
    return out


def _bursts(addr: int, beats: int, bus_bytes: int, max_burst: int) -> list[int]:
    """Lengths of the bursts of a read or write of `beats` beats from bus-aligned `addr` (hw.dma._burst_len)."""
    out = []
    while beats:
        to_boundary = (AXI_BOUNDARY_BYTES - addr % AXI_BOUNDARY_BYTES) // bus_bytes
        n = min(beats, max_burst, to_boundary)
        out.append(n)
        addr += n * bus_bytes
        beats -= n
    return out


class TimingModel:
    """Predicts the RTL's cycle counts for one config and DRAM timing (default: the Pynq-Z1 preset)."""

    def __init__(self, config: AcceleratorConfig, dram: DramTiming | None = None,
                 arch: Microarch | None = None):
        c = config
        self.config = c
        self.dram = dram if dram is not None else DramTiming.pynq_z1()
        self.arch = arch if arch is not None else Microarch()
        self.bus_bytes = c.bus_width // 8
        # Element (SRAM row) bytes of each memory a DMA moves.
        self.elem_bytes = row_bytes(c)

    def simulate(self, insns: np.ndarray, insn_addr: int = 0) -> TimingReport:
        """Time `insns` (INSN_DTYPE, a legal stream ending in FINISH) fetched from byte `insn_addr`."""
        if len(insns) == 0:
            raise TimingError("an empty stream cannot be timed: the last instruction must be FINISH")
        return _Run(self, insns, int(insn_addr)).report()


class _Run:
    """One simulation: the processes (fetch reader, fetch dispatcher, three units) and shared resources."""

    def __init__(self, model: TimingModel, insns: np.ndarray, insn_addr: int):
        self.m, self.c, self.a, self.d = model, model.config, model.arch, model.dram
        self.B = model.bus_bytes
        self.rows = insns.view(np.int64).reshape(len(insns), len(INSN_FIELD_NAMES)).tolist()
        self.mac_execs = mac_executions(insns).tolist()
        self.n = n = len(self.rows)
        self.insn_addr = insn_addr
        self.k = _Kernel()
        self.read_gap = 1.0 / self.d.read_duty
        self.write_gap = 1.0 / self.d.write_duty
        self.r_free = -math.inf  # when the R channel can carry the next beat
        self.requests: list[tuple[int, _Event] | None] = [None, None, None]  # per read client
        self.arbiter_idle = _Event()

        # Routing, per-unit positions and token indices (the k-th push of a queue is popped k-th).
        self.unit = [0] * n
        self.pos = [0] * n
        self.pops: list[list[tuple[int, int]]] = [[] for _ in range(n)]
        self.pushes: list[list[tuple[int, int]]] = [[] for _ in range(n)]
        self.streams: list[list[int]] = [[], [], []]
        counts = {"pop": [0] * len(QUEUES), "push": [0] * len(QUEUES)}
        for i, (r, u) in enumerate(zip(self.rows, units(insns).tolist(), strict=True)):
            self.unit[i], self.pos[i] = u, len(self.streams[u])
            self.streams[u].append(i)
            for flag in DEP_FLAGS:
                if r[_F[flag]]:
                    q = FLAG_QUEUE[u][flag]
                    kind = "pop" if flag.startswith("pop") else "push"
                    (self.pops if kind == "pop" else self.pushes)[i].append((q, counts[kind][q]))
                    counts[kind][q] += 1
        # A pop with no matching push (or a push whose room never frees) waits forever: a deadlock.
        tokens = [max(counts["push"][q], counts["pop"][q]) for q in range(len(QUEUES))]
        self.pushed = [[_Event() for _ in range(t)] for t in tokens]
        self.popped = [[_Event() for _ in range(t)] for t in tokens]
        self.dispatched = [_Event() for _ in range(n)]
        self.started = [[_Event() for _ in s] for s in self.streams]

        self.counters = dict.fromkeys((name for name, _ in COUNTERS), 0.0)
        self.counters["insns"] = n
        self.trace = np.zeros(n, dtype=TRACE_DTYPE)
        self.done_units = [False, False, False]
        self.waiting: list[str] = ["", "", ""]
        self.end: float | None = None

    # ---- shared read path ------------------------------------------------------------------------------
    def _read(self, client: int, beats: int) -> Generator:
        """Request a read burst of `beats` now (hw.axi.ReadArbiter client `client`: 0 fetch, 1 load,
        2 compute); returns (arrival of its first beat, grant cycle) once the arbiter grants it."""
        granted = _Event()
        self.requests[client] = (beats, granted)
        if self.arbiter_idle.value is None:
            self.k.fire(self.arbiter_idle, True)
        return (yield granted)

    def _arbiter(self) -> Generator:
        """Round-robin grants, one every arbiter_gap cycles; the DRAM answers bursts in grant order."""
        clients = len(self.requests)
        last, slot = 0, -math.inf  # the RTL's last_grant resets to 0
        while True:
            while not any(self.requests):
                self.arbiter_idle = _Event()
                yield self.arbiter_idle
            yield _After(max(self.k.now, slot))  # every request made in this cycle competes
            client = next(c for c in ((last + k) % clients for k in range(1, clients + 1)) if self.requests[c])
            beats, granted = self.requests[client]
            self.requests[client] = None
            g = self.k.now
            last, slot = client, g + self.a.arbiter_gap
            first = max(g + 1 + max(self.d.read_latency, 1) + self.a.read_handshake, self.r_free)
            self.r_free = first + beats * self.read_gap
            self.counters["rd_beats"] += beats
            self.k.fire(granted, (first, g))

    # ---- fetch -------------------------------------------------------------------------------------------
    def _fetch_layout(self) -> None:
        B = self.B
        first = self.insn_addr & ~(B - 1)
        end = self.insn_addr + self.n * INSN_BYTES
        total = -(-(end - first) // B)
        self.fetch_lens = _bursts(first, total, B, self.a.max_burst)
        self.fetch_starts = list(itertools.accumulate([0, *self.fetch_lens[:-1]]))
        self.fetch_ends = [s + n for s, n in zip(self.fetch_starts, self.fetch_lens, strict=True)]
        self.fetch_burst = [_Event() for _ in self.fetch_lens]
        #: when the unpacker takes each beat from the reader's buffer (worked out ahead of time, as beats are
        #: granted: a burst may be requested only `reader_room_cycles` after the beat that makes room for it)
        self.fetch_taken: list[float] = []
        self.fetch_wait: tuple[int, _Event] | None = None  # the reader waits until this many are taken
        self.fetch_lane = (self.insn_addr - first) // INSN_BYTES

    def _fetch_reader(self) -> Generator:
        t = float(self.a.reader_start)  # START launches fetch in cycle 0: its reader takes the request then
        for j, length in enumerate(self.fetch_lens):
            need = self.fetch_ends[j] - self.a.reader_beats  # beats consumed before this burst fits
            if need > len(self.fetch_taken):
                self.fetch_wait = (need, _Event())
                t = max(t, (yield self.fetch_wait[1]) + self.a.reader_room_cycles)
            elif need > 0:
                t = max(t, self.fetch_taken[need - 1] + self.a.reader_room_cycles)
            yield t
            first, g = yield from self._read(0, length)
            self.k.fire(self.fetch_burst[j], first)
            t = g + 1

    def _fetch_dispatch(self) -> Generator:
        """Fetch after its reader: one process per register a word passes (the unpacker, the check registers,
        the dispatch register, the output register), each waiting only on what its own moves wait on in the
        RTL, so that every time is worked out no later in the simulation than it happens: the reader's next
        burst waits on the unpacker's takes, which may run several words ahead of a dispatch stalled on a
        full command queue."""
        B, a = self.B, self.a
        n = self.n
        self.fetch_out = [_Event() for _ in range(n)]  # when each word moves into the output register
        if B < INSN_BYTES:
            # the word assembled (its last beat taken), then its entry into each register after the unpacker
            stages = [[_Event() for _ in range(n)] for _ in range(a.fetch_decode_cycles)]
            self.k.spawn(self._fetch_unpacker(stages))
            for r in range(1, len(stages)):
                self.k.spawn(self._fetch_register(stages, r))
            ready = stages[-1]
        else:
            ready = [_Event() for _ in range(n)]
            self.k.spawn(self._fetch_lanes(ready))
        assert a.fetch_out_cycles == 1  # (the rules below are those of one output register)
        depth = self.c.cmd_queue_depth
        d_prev = 0.0  # when the last word was written into its command queue
        for k in range(n):
            # The verdict moves the word into the output register once that is empty or its word goes out
            # (the cycle of the previous write at the earliest); the queue takes it from there, a cycle later
            # at the earliest, once it has room.
            o = max((yield ready[k]) + 1, d_prev)
            self.k.fire(self.fetch_out[k], o)
            u, j = self.unit[k], self.pos[k]
            d = o + a.fetch_out_cycles
            if j >= depth:
                d = max(d, (yield self.started[u][j - depth]) + 1)
            self.counters["stall_fetch"] += d - (o + a.fetch_out_cycles)
            self.k.fire(self.dispatched[k], d)
            d_prev = d

    def _fetch_arrival(self) -> Callable[[int], Generator]:
        """When a beat of the stream is in the reader's buffer (its burst's first beat, then one per read gap),
        for beats asked for in order."""
        burst, arrived, first_beat = 0, -1, 0.0

        def arrival(beat: int) -> Generator:
            nonlocal burst, arrived, first_beat
            while beat >= self.fetch_ends[burst]:
                burst += 1
            if arrived < burst:
                first_beat = yield self.fetch_burst[burst]
                arrived = burst
            return first_beat + (beat - self.fetch_starts[burst]) * self.read_gap
        return arrival

    def _fetch_consumed(self, beat: int, t: float) -> None:
        """The unpacker takes beats up to `beat` by cycle `t`: room in the reader's buffer."""
        self.fetch_taken += [t] * (beat + 1 - len(self.fetch_taken))
        if self.fetch_wait is not None and beat + 1 >= self.fetch_wait[0]:
            self.k.fire(self.fetch_wait[1], t)
            self.fetch_wait = None

    def _fetch_unpacker(self, stages: list[list[_Event]]) -> Generator:
        """A bus narrower than an instruction: the unpacker assembles a word from its beats, taking the next
        word's first beat once the word before has moved on (into the first check register)."""
        a, arrival = self.a, self._fetch_arrival()
        per = INSN_BYTES // self.B
        for k in range(self.n):
            accept = (yield stages[1][k - 1]) if k else 0.0
            for beat in range(k * per, (k + 1) * per):
                accept = max(accept + (beat > k * per), (yield from arrival(beat)) + a.fifo_latency)
                self._fetch_consumed(beat, accept)
            self.k.fire(stages[0][k], accept)

    def _fetch_register(self, stages: list[list[_Event]], r: int) -> Generator:
        """The r-th register after the unpacker (the check registers, then the dispatch register): a word moves
        in a cycle after it entered the one before at the earliest. A check register takes it as its own word
        moves on; the dispatch register only once empty (the cycle after its word moved out), so it is checked
        from the cycle after (FETCH_DECODE_CYCLES after its last beat at the earliest)."""
        last = r == len(stages) - 1
        for k in range(self.n):
            t = (yield stages[r - 1][k]) + 1
            if k:
                t = max(t, (yield self.fetch_out[k - 1]) + 1 if last else (yield stages[r + 1][k - 1]))
            self.k.fire(stages[r][k], t)

    def _fetch_lanes(self, ready: list[_Event]) -> Generator:
        """A bus as wide as an instruction or wider: each word is checked as its beat is in the unpacker, a
        cycle after the word before moved into the output register at the earliest; the beat is taken with its
        last word."""
        a, arrival = self.a, self._fetch_arrival()
        lanes = self.B // INSN_BYTES
        for k in range(self.n):
            beat = (self.fetch_lane + k) // lanes
            t = (yield from arrival(beat)) + a.fifo_latency
            if k:
                t = max(t, (yield self.fetch_out[k - 1]) + 1)
            self.k.fire(ready[k], t - 1)  # (ready: the cycle before the word can move on)
            if (self.fetch_lane + k) % lanes == lanes - 1 or k == self.n - 1:
                self._fetch_consumed(beat, (yield self.fetch_out[k]))

    # ---- units -------------------------------------------------------------------------------------------
    def _unit(self, u: int) -> Generator:
        free = 0.0
        depth = self.c.token_queue_depth
        # The compute unit's two pipes (spec "beside"): GEMM in one, ALU in the other, other instructions
        # (its loads, FINISH) in the first. An instruction starts a cycle after the one before it at the
        # earliest, when both pipes are free or, an ALU with beside set, its own. It retires (frees its pipe,
        # pushes) when done, but one that pushes a cycle after the other pipe's older instruction retired.
        pipe_free = {"gemm": 0.0, "alu": 0.0}
        retired = {"gemm": -1.0, "alu": -1.0}
        last_start = -1.0
        covered = 0.0  # the unit counted busy up to here
        for j, i in enumerate(self.streams[u]):
            self.waiting[u] = f"instruction {i} waits for fetch"
            pipe, beside = "", False
            if u == Unit.COMPUTE:
                op = self.rows[i][_F["opcode"]]
                pipe = "gemm" if op == Opcode.GEMM else "alu" if op == Opcode.ALU else ""
                beside = bool(pipe) and bool(self.rows[i][_F["beside"]])
                free = max(pipe_free.values()) if not beside else pipe_free[pipe]
                free = max(free, last_start + 1)
            ready = max(free, (yield self.dispatched[i]) + self.a.fifo_latency)
            t = ready
            for q, k in self.pops[i]:
                self.waiting[u] = f"instruction {i} waits to pop {QUEUES[q]} token {k}"
                t = max(t, (yield self.pushed[q][k]) + 1)
            for q, k in self.pushes[i]:
                if k >= depth:
                    self.waiting[u] = f"instruction {i} waits for room in {QUEUES[q]}"
                    t = max(t, (yield self.popped[q][k - depth]) + 1)
            self.waiting[u] = ""
            yield t
            s = max(t, self.k.now)
            self.k.fire(self.started[u][j], s)
            for q, k in self.pops[i]:
                self.k.fire(self.popped[q][k], s)
            done = yield from self._execute(i, s)
            retire = done
            if u == Unit.COMPUTE:
                last_start = s
                slot = pipe or "gemm"
                other = "alu" if slot == "gemm" else "gemm"
                if beside and retired[other] >= s and self.pushes[i]:  # the other pipe's is older and runs
                    retire = max(done, retired[other] + 1)
                retired[slot], pipe_free[slot] = retire, retire + 1
            for q, k in self.pushes[i]:
                self.k.fire(self.pushed[q][k], retire)
            # busy from the cycle after the start to the retire: the compute unit's pipes count once together
            self.counters[f"busy_{UNIT_NAMES[u]}"] += max(0.0, retire - max(s, covered))
            covered = max(covered, retire)
            self.counters[f"stall_{UNIT_NAMES[u]}"] += s - ready
            self.trace[i] = (i, u, _KIND_CODE[self._kind(i)], ready, s, retire + 1)
            free = retire + 1
        self.done_units[u] = True

    def _kind(self, i: int) -> str:
        r = self.rows[i]
        op = r[_F["opcode"]]
        if op in (Opcode.LOAD, Opcode.STORE) and r[_F["x_size"]] == 0:
            return "nop"
        if op == Opcode.LOAD:
            return f"load_{MemId(r[_F['mem_id']]).name.lower()}"
        return Opcode(op).name.lower()

    def _execute(self, i: int, s: float) -> Generator:
        """The instruction's body from its start `s`; returns its done cycle (it pushes then; its unit
        takes the next instruction one cycle later)."""
        r = self.rows[i]
        op = r[_F["opcode"]]
        if op == Opcode.FINISH:
            self.end = s + 2  # `finished` is registered; the run ends (and the counter stops) then
            return s + 1
        if op in (Opcode.GEMM, Opcode.ALU):
            execs = (r[_F["uop_end"]] - r[_F["uop_bgn"]]) * r[_F["iter_out"]] * r[_F["iter_in"]]
            self.counters["mac_active"] += self.mac_execs[i]
            if op == Opcode.ALU:
                self.counters["alu_active"] += execs
            # Decode and loop launch (command_cycles), one issue per execution, then the pipeline drains. An
            # execution that reads acc[src] waits alu_src_interval - 1 cycles after the issue before it; without
            # src loop factors and with at most SRC_ROWS micro-ops only the first sweep reads (registers hold the
            # rows).
            # An operand from inp comes through inp's own read port: no wait.
            waits = 0
            if op == Opcode.ALU and not r[_F["use_imm"]] and not r[_F["src_inp"]] and execs:
                uops = r[_F["uop_end"]] - r[_F["uop_bgn"]]
                kept = structure.holds_src_rows(r[_F["src_factor_out"]], r[_F["src_factor_in"]], uops)
                waits = (uops if kept else execs) - 1
            stages = self.a.gemm_stages if op == Opcode.GEMM else self.a.alu_stages
            issues = execs - 1 + waits * (self.a.alu_src_interval - 1) + stages if execs else 0
            return s + self.a.command_cycles + issues
        if r[_F["x_size"]] == 0:
            return s + 1
        if op == Opcode.STORE:
            return self._store(r, s)
        done = yield from self._load(r, s, client=self.unit[i] + 1)  # read clients: fetch, load, compute
        return done

    def _load(self, r: list[int], s: float, client: int) -> Generator:
        """A 2-D load (hw.dma.Load2D): the request side yields at every burst; the write side follows."""
        a, B = self.a, self.B
        E = self.m.elem_bytes[MemId(r[_F["mem_id"]])]
        y, x, stride, base = r[_F["y_size"]], r[_F["x_size"]], r[_F["x_stride"]], r[_F["dram_base"]]
        y0, y1, x0, x1 = (r[_F[k]] for k in ("y_pad_0", "y_pad_1", "x_pad_0", "x_pad_1"))
        width, height = x0 + x + x1, y0 + y + y1
        if not width or not height:
            return s + a.command_cycles + 1
        lanes = B // E if E <= B else 0  # elements per beat (0: an element takes several beats)
        per = E // B if E > B else 1  # beats per element
        cursor = s + a.command_cycles + y0 * width  # next SRAM write slot (the DMA starts with the padding)
        gap = self.read_gap
        granted = 0
        taken: list[tuple[int, float]] = []  # (beats granted up to this burst, when its last beat is consumed)
        oldest = 0
        elem_first = 0.0  # when the first beat of the element being assembled heads the buffer
        unpack: list[float] = []  # when the unpacker takes each row
        g_prev = -math.inf
        started = -math.inf  # when the burst reader started the previous row's request
        row_end = -math.inf  # last write of the previous DRAM row
        for yy in range(y):
            start = (base + yy * stride) * E
            aligned = start & ~(B - 1)
            row_beats = -(-(start + x * E - aligned) // B)
            lane0 = (start - aligned) // E if lanes else 0
            # The row's request enters the burst reader's command register (its lane the unpack queue) once the
            # register is free; the reader starts it when the row before has issued its last burst.
            c = s + a.command_cycles if yy == 0 else started + 1
            if yy >= a.unpack_queue:
                c = max(c, unpack[yy - a.unpack_queue] + 1)
            started = max(c + a.reader_start - 1, g_prev + 1)
            u = c + a.fifo_latency if yy == 0 else max(c + a.fifo_latency, row_end + (0 if lanes else 1))
            unpack.append(u)
            cursor += x0
            req = started + 1  # the reader's first burst
            beat0 = 0
            for n in _bursts(aligned, row_beats, B, a.max_burst):
                over = granted + n - a.reader_beats  # beats that must be consumed before this request
                if over > 0:
                    while taken[oldest][0] < over:
                        oldest += 1
                    req = max(req, taken[oldest][1] + a.reader_room_cycles)
                yield req
                first, g = yield from self._read(client, n)
                granted += n
                g_prev = g
                req = g + 1
                avail = first + a.fifo_latency  # when the burst's first beat heads the reader's buffer
                last = avail + (n - 1) * gap
                if lanes:  # elements ja..jb-1 lie in this burst's beats; one SRAM write per cycle
                    ja = max(0, beat0 * lanes - lane0)
                    jb = min(x, (beat0 + n) * lanes - lane0)
                    last_beat = (lane0 + jb - 1) // lanes
                    w = max(max(cursor, avail, u + 1) + (jb - ja - 1),
                            avail + (last_beat - beat0) * gap + (jb - 1 - max(ja, last_beat * lanes - lane0)))
                    cursor = w + 1
                    taken.append((granted, w))
                else:  # elements ja..jb-1 end in this burst; each takes `per` beats, one beat per cycle
                    if beat0 % per == 0:
                        elem_first = avail
                    ja = (beat0 + per) // per - 1
                    jb = (beat0 + n + per) // per - 1
                    accept = max(elem_first, u + 1 if ja == 0 else cursor - 1)
                    if jb > ja:
                        last_accept = max(accept + per - 1, avail + ((ja + 1) * per - 1 - beat0) * gap)
                        w = max(cursor, last_accept + 1) + (jb - ja - 1) * per
                        w = max(w, avail + (jb * per - 1 - beat0) * gap + 1)
                        cursor = w + 1
                        tail = beat0 + n - jb * per  # beats of the next element in this burst
                        if tail:
                            elem_first = avail + (jb * per - beat0) * gap
                        taken.append((granted, max(last, w + tail - 1) if tail else w - 1))
                    else:
                        taken.append((granted, max(last, accept + n - 1)))
                beat0 += n
            row_end = cursor - 1
            cursor += x1
        return cursor + y1 * width  # the last write is at cursor - 1; done one cycle later

    def _store(self, r: list[int], s: float) -> float:
        """A 2-D store (hw.dma.Store2D); the write channel is the store unit's alone, so no yields."""
        a, B = self.a, self.B
        E = self.m.elem_bytes[MemId.OUT]
        y, x, stride, base = r[_F["y_size"]], r[_F["x_size"]], r[_F["x_stride"]], r[_F["dram_base"]]
        if y == 0:
            return s + a.command_cycles + 1
        lanes = B // E if E < B else 0
        per = E // B if E > B else 1
        gap = self.write_gap  # >= 1: one beat per cycle at most
        # element e is out of the SRAM read pipeline at sram0 + e: the first read as the command lands, its
        # read stages, then the row queue (amaranth's SyncFIFO: readable the cycle after its write)
        sram0 = s + a.command_cycles + a.store_read_stages + 1
        w_prev = -math.inf
        packed = -math.inf  # last element the packer took
        aw_prev = -math.inf
        w_lasts: list[float] = []  # last W beat of each burst
        seg_taken: list[float] = []
        elems_before = 0
        for yy in range(y):
            start = (base + yy * stride) * E
            aligned = start & ~(B - 1)
            row_beats = -(-(start + x * E - aligned) // B)
            lane0 = (start - aligned) // E if lanes else 0
            seg = s + a.command_cycles if yy == 0 else aw_prev + 1
            if yy >= a.store_seg_queue:
                seg = max(seg, seg_taken[yy - a.store_seg_queue] + 1)
            if lanes:
                load = max(seg + a.fifo_latency, packed)
                active = load + 1
            else:
                load = seg + a.fifo_latency
                active = -math.inf
            seg_taken.append(load)
            aw = seg + 1
            beat0 = 0
            for n in _bursts(aligned, row_beats, B, a.max_burst):
                if len(w_lasts) >= a.store_len_queue:
                    aw = max(aw, w_lasts[-a.store_len_queue] + 1)
                len_ready = aw + a.fifo_latency
                if lanes:
                    ja = max(0, beat0 * lanes - lane0)
                    jb = min(x, (beat0 + n) * lanes - lane0)
                    first_beat_elems = min(jb, (beat0 + 1) * lanes - lane0) - ja
                    p = max(packed + 1, sram0 + elems_before + ja, active)
                    w0 = max(p + first_beat_elems - 1, len_ready, w_prev + gap)
                    w = w0 + max(jb - ja - first_beat_elems, (n - 1) * gap)
                    packed = w
                else:
                    elem = beat0 // per
                    w0 = max(w_prev + gap, len_ready)
                    if beat0 % per == 0:  # a new element enters the packer
                        w0 = max(w0, sram0 + elems_before + elem + (1 if per > 1 else 0))
                    w = w0 + (n - 1) * gap
                w_lasts.append(w)
                w_prev = w
                aw_prev = aw
                aw += 1
                beat0 += n
            elems_before += x
            self.counters["wr_beats"] += row_beats
        return w_prev + a.write_handshake + max(1, self.d.write_latency)

    # ---- run -------------------------------------------------------------------------------------------
    def report(self) -> TimingReport:
        self._fetch_layout()
        k = self.k
        k.spawn(self._arbiter())
        k.spawn(self._fetch_reader())
        k.spawn(self._fetch_dispatch())
        for u in (Unit.LOAD, Unit.COMPUTE, Unit.STORE):
            k.spawn(self._unit(int(u)))
        k.run()
        if not all(self.done_units) or self.end is None:
            stuck = "; ".join(f"{UNIT_NAMES[u]}: {self.waiting[u]}" for u in range(3)
                              if not self.done_units[u] and self.waiting[u])
            raise TimingError(f"the stream deadlocks ({stuck or 'no FINISH reached'}); the functional "
                              "simulator reports why")
        cycles = round(self.end + 1)
        self.counters["cycles"] = cycles
        counters = {name: round(self.counters[name]) for name, _ in COUNTERS}
        return TimingReport(cycles=cycles, counters=counters, trace=self.trace, dram=self.d)
