"""Register-level devices for the driver: a :class:`Backend` is an accelerator seen as registers plus a
physical memory (the RTL simulation server, or the functional simulator's register model here), and
:class:`BackendHardware` gives the driver's :class:`~weft.runtime.driver.Hardware` interface on one.

:class:`FsimBackend` answers the register map of :mod:`weft.hw.regs` with the functional simulator behind
it: START runs the program to its end at once (the simulator has no clock), so STATUS.done is set by the
first poll. Counters come from the simulator's statistics (cycles from the timing model when this build
has one, else 0). Imports numpy and light weft modules only: the board runtime's pynq stand-in uses it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from weft.hw.regs import COUNTERS, HW_VERSION, ErrorCode, register_map
from weft.isa.constants import INSN_BYTES
from weft.isa.encoding import decode_insns
from weft.runtime.fsim_device import new_timing_model
from weft.sim.dram import Dram
from weft.sim.fsim import DeadlockError, FunctionalSimulator, SimError

if TYPE_CHECKING:
    from weft.config import AcceleratorConfig

__all__ = ["Backend", "BackendBuffer", "BackendHardware", "FsimBackend", "error_code_of"]

#: First physical address handed out: not 0, so relocation is exercised as on a board.
FIRST_ADDRESS = 0x10000
_ALIGN = 4096


class Backend(Protocol):
    size: int

    def read_reg(self, offset: int) -> int: ...
    def write_reg(self, offset: int, value: int) -> None: ...
    def read_mem(self, addr: int, nbytes: int) -> bytes: ...
    def write_mem(self, addr: int, data: bytes) -> None: ...
    def wait_irq(self, cycles: int) -> bool: ...
    def reset(self) -> None: ...


class BackendBuffer:
    """A DMA buffer in the backend's memory: ``array`` is the host copy."""

    def __init__(self, backend: Backend, address: int, nbytes: int):
        self.backend, self.physical_address = backend, address
        self.array = np.zeros(nbytes, dtype=np.uint8)

    def flush(self) -> None:
        self.backend.write_mem(self.physical_address, self.array.tobytes())

    def invalidate(self) -> None:
        self.array[:] = np.frombuffer(self.backend.read_mem(self.physical_address, self.array.size), np.uint8)


class BackendHardware:
    """The driver's Hardware interface on a backend; buffers from a bump allocator, 4 KiB aligned."""

    def __init__(self, backend: Backend, *, pause_cycles: int = 4096):
        self.backend, self.pause_cycles = backend, pause_cycles
        self._next = FIRST_ADDRESS

    def read(self, offset: int) -> int:
        return self.backend.read_reg(offset)

    def write(self, offset: int, value: int) -> None:
        self.backend.write_reg(offset, value)

    def allocate(self, nbytes: int) -> BackendBuffer:
        addr = self._next
        if addr + nbytes > self.backend.size:
            raise MemoryError(f"cannot allocate {nbytes} bytes at 0x{addr:x}: the device memory has "
                              f"{self.backend.size} bytes")
        self._next = (addr + nbytes + _ALIGN - 1) // _ALIGN * _ALIGN
        return BackendBuffer(self.backend, addr, nbytes)

    def pause(self) -> None:
        self.backend.wait_irq(self.pause_cycles)

    def reset(self) -> bool:
        self.backend.reset()
        return True

    def close(self) -> None:
        close = getattr(self.backend, "close", None)
        if close is not None:
            close()


_MESSAGE_CODES = (
    ("illegal opcode", ErrorCode.ILLEGAL_OPCODE), ("memory id", ErrorCode.ILLEGAL_MEM_ID),
    ("dependency flag", ErrorCode.ILLEGAL_DEP_FLAG), ("ALU op", ErrorCode.ILLEGAL_ALU_OP),
    ("padding", ErrorCode.BAD_PADDING), ("rows of that buffer", ErrorCode.SRAM_RANGE),
    ("micro-op", ErrorCode.UOP_RANGE), ("FINISH must be last", ErrorCode.FINISH_NOT_LAST),
    ("without FINISH", ErrorCode.NO_FINISH), ("outside the", ErrorCode.BUS_ERROR),
)


def error_code_of(err: SimError) -> ErrorCode:
    """The hardware's error code for a simulator error (the simulator reports by message and class)."""
    if isinstance(err, DeadlockError):
        return ErrorCode.DEADLOCK
    text = str(err)
    return next((code for key, code in _MESSAGE_CODES if key in text), ErrorCode.LOOP_RANGE)


class FsimBackend:
    """The register map answered by the functional simulator on a `size`-byte memory."""

    def __init__(self, config: AcceleratorConfig, size: int, *, timing: bool = True):
        self.config, self.size = config, size
        self.dram = Dram(size)
        self.sim = FunctionalSimulator(config)
        self.regs = {r.name: r for r in register_map(config)}
        self.by_offset = {r.offset: r for r in self.regs.values()}

        self.timing = new_timing_model(config) if timing else None
        self.reset()

    def reset(self) -> None:
        self.values: dict[str, int] = {"insn_addr": 0, "insn_count": 0, "irq_en": 0, "busy": 0, "done": 0,
                                       "error": 0, "error_code": 0, "error_index": 0,
                                       "version_major": HW_VERSION[0], "version_minor": HW_VERSION[1]}
        self.values.update(dict.fromkeys((name for name, _ in COUNTERS), 0))
        self.sim.reset()

    def read_reg(self, offset: int) -> int:
        reg = self.by_offset.get(offset)
        if reg is None:
            return 0
        word = 0
        for f in reg.fields:
            value = f.value if f.access == "const" else (0 if f.access == "w1s" else self.values.get(f.name, 0))
            word |= ((value >> f.source_lsb) & ((1 << f.width) - 1)) << f.lsb
        return word

    def write_reg(self, offset: int, value: int) -> None:
        reg = self.by_offset.get(offset)
        if reg is None:
            return
        for f in reg.fields:
            bits = (value >> f.lsb) & ((1 << f.width) - 1)
            if f.access == "rw":
                self.values[f.name] = bits
            elif f.access == "w1c" and bits:
                self.values[f.name] = 0
            elif f.access == "w1s" and bits and f.name == "start" and not self.values["busy"]:
                self._start()

    def _start(self) -> None:
        addr, count = self.values["insn_addr"], self.values["insn_count"]
        self.values.update(error=0, error_code=0, error_index=0)
        try:
            stats = self.sim.run(self.dram, addr, count)
        except SimError as err:
            self.values.update(done=1, error=1, error_code=int(error_code_of(err)), error_index=err.index or 0)
            return
        c = self.config
        cycles = stats.get("cycles")
        if cycles is None and self.timing is not None:
            insns = decode_insns(c, self.dram.read(addr, count * INSN_BYTES))
            cycles = int(self.timing.simulate(insns, addr).cycles)
        bus = c.bus_width // 8
        moved = sum(stats["bytes"].values())
        stored = stats["bytes"]["out"]
        self.values.update(done=1, cycles=cycles or 0, insns=count,
                           mac_active=stats["macs"] // c.macs_per_cycle,
                           alu_active=stats["alu_execs"], rd_beats=-(-(moved - stored) // bus),
                           wr_beats=-(-stored // bus))

    def read_mem(self, addr: int, nbytes: int) -> bytes:
        return self.dram.read(addr, nbytes).tobytes()

    def write_mem(self, addr: int, data: bytes) -> None:
        self.dram.write(addr, np.frombuffer(data, dtype=np.uint8))

    def wait_irq(self, cycles: int) -> bool:
        return bool(self.values["done"] and self.values["irq_en"])

    def close(self) -> None:
        pass


def fsim_hardware(config: AcceleratorConfig, size: int, **options: Any) -> BackendHardware:
    return BackendHardware(FsimBackend(config, size, **options))
