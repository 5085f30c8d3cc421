"""One driver for every device: it runs an accelerator program by writing the AXI-Lite registers and
moving one DMA buffer, against a small :class:`Hardware` interface.

Implementations of the interface: the PYNQ board (:mod:`weft.runtime.pynq_device`: ``pynq.Overlay``,
``pynq.allocate``, MMIO), the RTL simulation (:mod:`weft.runtime.rtl_device`) and the functional
simulator's register model (:mod:`weft.runtime.register_backend`). Register offsets and fields come from the
register spec (``registers_spec``, which ``weft rtl`` writes as JSON), never from literals.

A run: the DRAM image goes into a buffer the hardware allocated at some physical address; the program's
DRAM addresses are relocated to it; the launch checks (:mod:`weft.runtime.safety`) pass; INSN_ADDR,
INSN_COUNT, CTRL.start; STATUS is polled until done or the watchdog's budget runs out; the image is read
back. :class:`DriverDevice` is the graph walker (:mod:`weft.core.walker`) with a DRAM-image runner
(:mod:`weft.runtime.dram_runner`) whose programs run through the driver (:class:`DriverPrograms`).

Imports numpy and light weft modules only: this module is part of the board runtime.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from weft.errors import WeftError
from weft.hw.regs import ErrorCode, registers_spec
from weft.isa import semantics
from weft.isa.asm import format_insn
from weft.isa.constants import INSN_BYTES, Opcode, Unit
from weft.isa.encoding import decode_insns, encode_insns, layout_of
from weft.runtime.devices import Device, run_loaded
from weft.runtime.dram_runner import AcceleratorImage, DramRunner, OnLayer
from weft.runtime.safety import LaunchError, check_buffers, check_config_hash, check_launch

if TYPE_CHECKING:
    from weft.config import AcceleratorConfig
    from weft.core.artifact import Artifact
    from weft.sim.dram import Dram

__all__ = ["Buffer", "Driver", "DriverDevice", "DriverPrograms", "Hardware", "RegisterMap", "RunError", "WatchdogError"]


class RunError(WeftError):
    """The accelerator stopped with an error code; ``index`` is the instruction the hardware names."""

    def __init__(self, message: str, code: int, index: int):
        self.code, self.index = code, index
        super().__init__(message)


class WatchdogError(WeftError):
    """The accelerator did not finish within the budget; ``report`` has status, counters and the stuck units."""

    def __init__(self, message: str, report: dict[str, Any]):
        self.report = report
        super().__init__(message)


class Buffer(Protocol):
    """A DMA buffer: ``array`` is the CPU's uint8 view, ``flush``/``invalidate`` sync it with the device."""

    physical_address: int
    array: np.ndarray

    def flush(self) -> None: ...
    def invalidate(self) -> None: ...


class Hardware(Protocol):
    """What the driver needs from a device: 32-bit register access, DMA buffers, and a way to let time pass
    between status polls (``pause``); ``reset`` brings a stuck accelerator back (False when it cannot)."""

    def read(self, offset: int) -> int: ...
    def write(self, offset: int, value: int) -> None: ...
    def allocate(self, nbytes: int) -> Buffer: ...
    def pause(self) -> None: ...
    def reset(self) -> bool: ...


class RegisterMap:
    """Offsets and fields by name, from the register spec (JSON data)."""

    def __init__(self, spec: Mapping[str, Any]):
        self.version = (int(spec["version"]["major"]), int(spec["version"]["minor"]))
        self.offsets = {r["name"]: int(r["offset"]) for r in spec["registers"]}
        self.fields = {f["name"]: (r["name"], int(f["lsb"]), int(f["width"]))
                       for r in spec["registers"] for f in r["fields"] if not f.get("source_lsb")}
        self.counters = [c["name"] for c in spec["counters"]]

    def bits(self, **values: int) -> int:
        word = 0
        for name, value in values.items():
            _, lsb, width = self.fields[name]
            word |= (value & ((1 << width) - 1)) << lsb
        return word

    def field(self, name: str, word: int) -> int:
        _, lsb, width = self.fields[name]
        return (word >> lsb) & ((1 << width) - 1)


class Driver:
    """Runs programs on `hw` for `config`; `spec` is the register spec (default: this weft's)."""

    def __init__(self, hw: Hardware, config: AcceleratorConfig, spec: Mapping[str, Any] | None = None, *,
                 timeout_s: float = 60.0):
        self.hw, self.config, self.timeout_s = hw, config, timeout_s
        self.regs = RegisterMap(spec if spec is not None else registers_spec(config))
        self._dram_base_bits = next(f.width for f in layout_of(config).formats["mem"].fields
                                    if f.name == "dram_base")
        self.buffer: Buffer | None = None
        #: Called right after START (tests use it to break the hardware mid-run).
        self.on_start: Callable[[], None] | None = None

    def read(self, name: str) -> int:
        return self.hw.read(self.regs.offsets[name])

    def write(self, name: str, value: int) -> None:
        self.hw.write(self.regs.offsets[name], value)

    def counter(self, name: str) -> int:
        return self.read(f"{name.upper()}_HI") << 32 | self.read(f"{name.upper()}_LO")

    def counters(self) -> dict[str, int]:
        return {name: self.counter(name) for name in self.regs.counters}

    def hardware_hash(self) -> str:
        return f"{self.read('CONFIG_HASH_HI') << 32 | self.read('CONFIG_HASH_LO'):016x}"

    def check_hardware(self) -> None:
        """Refuse hardware of another register-map major version or another config."""
        version = self.read("VERSION")
        major = self.regs.field("version_major", version)
        if major != self.regs.version[0]:
            raise LaunchError(f"the hardware has register map version {major}.x; this driver reads "
                              f"{self.regs.version[0]}.x")
        check_config_hash(self.config.hash, self.hardware_hash())

    def ensure_buffer(self, nbytes: int) -> Buffer:
        if self.buffer is None or self.buffer.array.size < nbytes:
            self.buffer = self.hw.allocate(nbytes)
        return self.buffer

    # ---- one program -----------------------------------------------------------------------------------
    def relocate(self, insns: np.ndarray, base: int) -> np.ndarray:
        """The stream with every DRAM row address moved by `base` bytes (the buffer's physical address)."""
        out = insns.copy()
        rows = semantics.row_bytes(self.config)
        for i, r in enumerate(out):
            if int(r["opcode"]) not in (Opcode.LOAD, Opcode.STORE):
                continue
            rb = rows.get(int(r["mem_id"]), 1)
            if base % rb:
                raise LaunchError(f"buffer address 0x{base:x} is not a multiple of the {rb}-byte rows of "
                                  f"instruction {i} ({format_insn(r)})", i)
            moved = int(r["dram_base"]) + base // rb
            if moved >> self._dram_base_bits:
                raise LaunchError(f"instruction {i} ({format_insn(r)}): relocated DRAM row {moved} does not fit "
                                  f"the {self._dram_base_bits}-bit dram_base field", i)
            out[i]["dram_base"] = moved
        return out

    def run_image(self, image: np.ndarray, insn_addr: int, insn_count: int) -> dict[str, Any]:
        """Run the program at `insn_addr` of the DRAM `image` (uint8, addresses from 0); the image is
        updated in place with the DRAM after the run. Returns the counters and wall seconds."""
        words = image[insn_addr:insn_addr + insn_count * INSN_BYTES].copy()  # image is overwritten below
        insns = decode_insns(self.config, words)
        buf = self.ensure_buffer(image.size)
        base = int(buf.physical_address)
        buffers = [(base, base + image.size)]
        check_buffers(buffers)  # before relocation, whose field overflow would hide the real cause
        moved = self.relocate(insns, base)
        # INSN_COUNT is what the hardware fetches: the check sees those instructions, none fewer
        check_launch(self.config, moved, base + insn_addr, buffers, INSN_BYTES, insn_count)
        buf.array[:image.size] = image
        buf.array[insn_addr:insn_addr + words.size] = np.frombuffer(encode_insns(self.config, moved), np.uint8)
        buf.flush()
        self.write("STATUS", self.regs.bits(done=1))  # clear a stale done
        self.write("INSN_ADDR", base + insn_addr)
        self.write("INSN_COUNT", insn_count)
        start = time.perf_counter()
        self.write("CTRL", self.regs.bits(start=1, irq_en=1))
        if self.on_start is not None:
            self.on_start()
        status = self._wait(insns, start)
        seconds = time.perf_counter() - start
        counters = self.counters()
        self.write("STATUS", self.regs.bits(done=1))
        if self.regs.field("error", status):
            code, index = self.read("ERROR_CODE"), self.read("ERROR_INDEX")
            name = ErrorCode(code).name if code in set(ErrorCode) else str(code)
            text = f" ({format_insn(insns[index])})" if 0 <= index < len(insns) else ""
            raise RunError(f"the accelerator stopped with error {name} at instruction {index}{text}", code, index)
        buf.invalidate()
        image[:] = buf.array[:image.size]
        image[insn_addr:insn_addr + words.size] = words  # the caller's stream, not the relocated one
        return {"counters": counters, "seconds": seconds}

    def _wait(self, insns: np.ndarray, start: float) -> int:
        while True:
            status = self.read("STATUS")
            if self.regs.field("done", status):
                return status
            if time.perf_counter() - start > self.timeout_s:
                report = self.watchdog_report(insns)
                self.hw.reset()
                raise WatchdogError(f"watchdog: the accelerator did not finish within {self.timeout_s} s; "
                                    f"{report['summary']}", report)
            self.hw.pause()

    def watchdog_report(self, insns: np.ndarray) -> dict[str, Any]:
        """Status and counters read twice: a unit whose stall counter moves waits for a token (on the queue
        its next instruction pops), one whose busy counter moves is stuck inside an instruction."""
        first = self.counters()
        self.hw.pause()
        second = self.counters()
        status = self.read("STATUS")
        moved = {k: second[k] - first[k] for k in first}
        dispatched = second.get("insns", 0)
        stuck = []
        for unit in semantics.UNIT_NAMES:
            if moved.get(f"busy_{unit}", 0):
                stuck.append({"unit": unit, "state": "busy", "queue": None,
                              "why": "executing an instruction that does not end (DRAM not answering?)"})
            elif moved.get(f"stall_{unit}", 0):
                stuck.append({"unit": unit, "state": "stalled", "queue": _waiting_queue(insns, unit, dispatched),
                              "why": "waiting for a token or for room in a queue"})
        if not stuck and not moved.get("insns", 0) and dispatched < len(insns):
            stuck.append({"unit": "fetch", "state": "waiting", "queue": None,
                          "why": "the instruction stream is not arriving from DRAM"})
        if moved.get("stall_fetch", 0):
            stuck.append({"unit": "fetch", "state": "stalled", "queue": "command queue",
                          "why": "its command queue is full"})
        parts = [f"{s['unit']} unit {s['state']}" + (f" on queue {s['queue']}" if s["queue"] else "") for s in stuck]
        summary = ("; ".join(parts) or "no unit advances") + (
            f" (STATUS busy={self.regs.field('busy', status)}, {dispatched} of {len(insns)} instructions dispatched)")
        return {"status": status, "counters": second, "moved": moved, "stuck": stuck, "summary": summary}


def _waiting_queue(insns: np.ndarray, unit: str, dispatched: int) -> str | None:
    """The queue the unit's first undispatched-or-pending popping instruction waits on (best effort)."""
    pops = [(flag, semantics.QUEUES[q]) for flag, q in semantics.FLAG_QUEUE[Unit[unit.upper()]].items()
            if flag.startswith("pop")]
    for r in insns[:max(dispatched, 1)][::-1]:
        if semantics.UNIT_NAMES[semantics.unit_of(int(r["opcode"]), int(r["mem_id"]))] != unit:
            continue
        queues = [q for flag, q in pops if int(r[flag])]
        return "/".join(queues) if queues else None
    return None


class DriverPrograms:
    """A :class:`~weft.runtime.dram_runner.ProgramRunner` on `driver`: each program runs on the hardware
    from a copy of the DRAM image, and the hardware's counters become the simulator's statistics."""

    def __init__(self, driver: Driver):
        self.driver = driver

    def run(self, dram: Dram, insn_addr: int, insn_count: int) -> dict[str, Any]:
        result = self.driver.run_image(dram.data, insn_addr, insn_count)
        c, cfg = result["counters"], self.driver.config
        bus = cfg.bus_width // 8
        return {"insns": {"total": c["insns"]}, "insn_count": insn_count,
                "bytes": {"read": c["rd_beats"] * bus, "write": c["wr_beats"] * bus},
                "macs": c["mac_active"] * cfg.macs_per_cycle,
                "alu_ops": c["alu_active"] * cfg.batch * cfg.block_out, "cycles": c["cycles"],
                "seconds": result["seconds"]}


class DriverDevice(Device):
    """A device whose accelerator layers run through :class:`Driver` on `hardware`; host layers in numpy.
    ``on_layer`` is called around each program as on the fsim device; `chains` as on the rtl device."""

    name = "driver"

    def __init__(self, config: AcceleratorConfig, hardware: Hardware, *, spec: Mapping[str, Any] | None = None,
                 timeout_s: float = 60.0, on_layer: OnLayer | None = None, name: str = "driver", chains: bool = True):
        super().__init__(config)
        #: Run each chain of layers as its one program (see :class:`~weft.runtime.rtl_device.RtlDevice`).
        self.chains = chains
        self.name = name  # the device it serves (pynq), in messages
        self.hardware = hardware
        self.driver = Driver(hardware, config, spec, timeout_s=timeout_s)
        self.driver.check_hardware()
        self.on_layer = on_layer
        self.runner: DramRunner | None = None

    def load(self, artifact: Artifact) -> None:
        super().load(artifact)
        self.image = AcceleratorImage(artifact, self.config, self.name)
        self.layers = self.image.layers
        self.runner = DramRunner(self.image, DriverPrograms(self.driver), self, chains=self.chains)

    def run(self, feeds: Mapping[str, np.ndarray], *, keep_intermediates: bool = False
            ) -> tuple[dict[str, np.ndarray], dict[str, Any], dict[str, np.ndarray]]:
        return run_loaded(self.artifact, feeds, runner=self.runner, keep_intermediates=keep_intermediates)

    def close(self) -> None:
        close = getattr(self.hardware, "close", None)
        if close is not None:
            close()
