"""DRAM for the cosimulation: cocotbext-axi's ``AxiRam`` with latency, bandwidth limits and a rule checker.

``AxiRam`` answers each burst as soon as it sees it. :class:`DramModel` keeps its memory and channel models
but answers a read burst ``read_latency`` cycles after its AR handshake (several bursts may be in flight,
as on a real memory controller) and a write burst's B response ``write_latency`` cycles after its last W
beat; pause generators on R and W (cocotbext-axi's own mechanism) limit the bandwidth. Every burst is
checked against the AXI rules real boards need (INCR bursts of full bus width, at most 256 beats, never
crossing 4 KiB, WLAST on the last beat only); ``violations`` lists what broke them. Byte ranges put in
``faults`` answer SLVERR, to test how the accelerator reports bus errors.

The timings (:class:`DramTiming`, the Pynq-Z1 preset among :data:`TIMINGS`) live in
:mod:`weft.sim.dram_timing`, shared with the timing model.
"""

from __future__ import annotations

import itertools
import random
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import cocotb
from cocotb.simtime import get_sim_time
from cocotb.triggers import Event, Timer
from cocotbext.axi import AxiRam
from cocotbext.axi.axi_ram import AxiRamRead, AxiRamWrite
from cocotbext.axi.constants import AxiBurstType, AxiResp
from cocotbext.axi.memory import Memory

from weft.isa.constants import AXI_BOUNDARY_BYTES
from weft.sim.dram_model import pause_pattern
from weft.sim.dram_timing import TIMINGS, DramTiming

__all__ = ["TIMINGS", "DramModel", "DramTiming"]


def _pauses(duty: float, random_stalls: bool, seed: int) -> Iterator[bool] | None:
    """A pause generator (True = no beat this cycle) that lets `duty` of the cycles through."""
    if duty >= 1.0:
        return None
    if random_stalls:
        rng = random.Random(seed)
        return iter(lambda: rng.random() >= duty, None)  # an endless generator
    return itertools.cycle(pause_pattern(duty))


class _Checker:
    def __init__(self, bus_bytes: int, violations: list[str]):
        self.bus_bytes = bus_bytes
        self.violations = violations

    def burst(self, kind: str, addr: int, length: int, size: int, burst: int) -> None:
        def bad(what: str) -> None:
            self.violations.append(f"{kind} burst at 0x{addr:08x} ({length} beats): {what}")

        if burst != AxiBurstType.INCR:
            bad(f"burst type {burst} is not INCR")
        if (1 << size) != self.bus_bytes:
            bad(f"size {1 << size} bytes is not the bus width of {self.bus_bytes} bytes")
        if length > 256:
            bad("more than 256 beats")
        if addr % self.bus_bytes:
            bad("address not aligned to the bus width")
        if addr % AXI_BOUNDARY_BYTES + length * self.bus_bytes > AXI_BOUNDARY_BYTES:
            bad("crosses a 4 KiB boundary")


class _Faults:
    """Byte ranges [lo, hi) that answer SLVERR (bus-error tests); empty by default."""

    def __init__(self) -> None:
        self.ranges: list[tuple[int, int]] = []

    def hit(self, addr: int, nbytes: int) -> bool:
        return any(addr < hi and lo < addr + nbytes for lo, hi in self.ranges)


async def _when_due(pending: deque[tuple[float, Any]], arrived: Event) -> Any:
    """The oldest answer held in `pending` (with the simulation time in ns it is due at), once due; waits
    for one to arrive first when none is held."""
    while not pending:
        arrived.clear()
        await arrived.wait()
    due, item = pending.popleft()
    wait = due - get_sim_time(unit="ns")
    if wait > 0:
        await Timer(wait, unit="ns")
    return item


class _Timed:
    """What the timed read and write halves share: the timing, the rule checker, the fault ranges, and a
    count of the bursts answered."""

    def __init__(self, *args: Any, timing: DramTiming, period_ns: float, checker: _Checker, faults: _Faults,
                 **kwargs: Any):
        self.timing, self.period_ns, self.checker, self.faults = timing, period_ns, checker, faults
        self.bursts = 0
        super().__init__(*args, **kwargs)

    @staticmethod
    def _pace(channel: Any, duty: float, random_stalls: bool, seed: int) -> None:
        pauses = _pauses(duty, random_stalls, seed)
        if pauses is not None:
            channel.set_pause_generator(pauses)


    async def _answer_in_order(self, recv: Callable[[], Awaitable[Any]], take: Callable[[Any], Awaitable[Any]],
                               latency: int, send: Callable[[Any], Awaitable[None]]) -> None:
        """Receive requests with `recv`, take each in (`take` returns its answer), and `send` the answers in
        order, each `latency` cycles after it was taken, while more requests come in."""
        pending: deque[tuple[float, Any]] = deque()
        arrived = Event()

        async def sender() -> None:
            while True:
                await send(await _when_due(pending, arrived))

        task = cocotb.start_soon(sender())
        try:
            while True:
                answer = await take(await recv())
                pending.append((get_sim_time(unit="ns") + latency * self.period_ns, answer))
                arrived.set()
        finally:
            task.cancel()


async def _as_is(request: Any) -> Any:
    return request


class _TimedRead(_Timed, AxiRamRead):
    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._pace(self.r_channel, self.timing.read_duty, self.timing.random_stalls, self.timing.seed)

    async def _process_read(self) -> None:
        # the burst's R beats start read_latency cycles after its AR handshake
        await self._answer_in_order(self.ar_channel.recv, _as_is, self.timing.read_latency, self._send_burst)

    async def _send_burst(self, ar: Any) -> None:
        arid, addr, length = int(ar.arid), int(ar.araddr), int(ar.arlen) + 1
        self.checker.burst("read", addr, length, int(ar.arsize), int(ar.arburst))
        self.bursts += 1
        lanes = self.byte_lanes
        for n in range(length):
            word = (addr + n * lanes) // lanes * lanes
            r = self.r_channel._transaction_obj()
            r.rid, r.rlast = arid, n == length - 1
            if self.faults.hit(word, lanes):
                r.rresp, r.rdata = AxiResp.SLVERR, 0
            else:
                r.rresp = AxiResp.OKAY
                r.rdata = int.from_bytes(self.read(word % self.size, lanes), "little")
            await self.r_channel.send(r)


class _TimedWrite(_Timed, AxiRamWrite):
    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._pace(self.w_channel, self.timing.write_duty, self.timing.random_stalls, self.timing.seed + 1)

    async def _process_write(self) -> None:
        # the B response comes write_latency cycles after the burst's last W beat
        await self._answer_in_order(self.aw_channel.recv, self._take_burst, self.timing.write_latency,
                                    self.b_channel.send)

    async def _take_burst(self, aw: Any) -> Any:
        awid, addr, length = int(aw.awid), int(aw.awaddr), int(aw.awlen) + 1
        self.checker.burst("write", addr, length, int(aw.awsize), int(aw.awburst))
        self.bursts += 1
        lanes = self.byte_lanes
        failed = False
        for n in range(length):
            w = await self.w_channel.recv()
            if int(w.wlast) != (n == length - 1):
                self.checker.violations.append(
                    f"write burst at 0x{addr:08x}: WLAST {int(w.wlast)} on beat {n} of {length}")
            data, strb = int(w.wdata).to_bytes(lanes, "little"), int(w.wstrb)
            base = (addr + n * lanes) // lanes * lanes
            if self.faults.hit(base, lanes):
                failed = True
                continue
            for lane in range(lanes):
                if strb >> lane & 1:
                    self.mem[(base + lane) % self.size] = data[lane]
        b = self.b_channel._transaction_obj()
        b.bid, b.bresp = awid, AxiResp.SLVERR if failed else AxiResp.OKAY
        return b


class DramModel(AxiRam):
    """An ``AxiRam`` of `size` bytes answering with `timing`; ``mem`` is the byte array."""

    def __init__(self, bus: Any, clock: Any, reset: Any, *, size: int, timing: DramTiming, period_ns: float):
        Memory.__init__(self, size, bytearray(size))  # the same memory object AxiRam would hold
        self.violations: list[str] = []
        #: Byte ranges [lo, hi) answered with SLVERR, for bus-error tests.
        self.faults = _Faults()
        checker = _Checker(len(bus.read.r.rdata) // 8, self.violations)
        common = dict(timing=timing, period_ns=period_ns, checker=checker, faults=self.faults)
        self.write_if = _TimedWrite(bus.write, clock, reset, True, mem=self.mem, **common)
        self.read_if = _TimedRead(bus.read, clock, reset, True, mem=self.mem, **common)

    # ---- what the testbench asks of either DRAM model (weft.sim.cocotb_tb.dpi_dram.DpiDram's too) ----------
    @property
    def read_bursts(self) -> int:
        return self.read_if.bursts

    @property
    def write_bursts(self) -> int:
        return self.write_if.bursts

    def set_faults(self, ranges: list[tuple[int, int]]) -> None:
        self.faults.ranges = list(ranges)

    def take_violations(self) -> list[str]:
        """The rules broken since the last take."""
        taken = list(self.violations)
        self.violations.clear()
        return taken

    def hold(self) -> None:
        """Stop answering reads (a stuck bus, for watchdog tests) for the rest of the simulation."""
        self.read_if.r_channel.set_pause_generator(itertools.repeat(True))
