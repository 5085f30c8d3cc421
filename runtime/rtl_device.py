"""The "rtl" device: the driver runs compiled models on the generated Verilog in Verilator or Icarus.

:class:`RtlBackend` builds the design once per (config hash, simulator) with :func:`weft.sim.cosim.build`
(cached in the user cache folder), starts the simulator as a subprocess whose cocotb test
(:mod:`weft.runtime.rtl_server_tb`) is a command server, and talks to it over a loopback socket: register
reads and writes go over the design's AXI-Lite port, buffers into its AXI DRAM model (latency and
bandwidth from :data:`weft.sim.dram_timing.TIMINGS`, optionally overridden). Resetting starts a fresh
simulation (after a watchdog timeout the old one may be stuck mid-burst).

With ``trace=True`` the testbench also records when the core runs and when each unit is busy or stalled
(edge triggers, so the cost is a few callbacks per instruction), and the device keeps, per accelerator
layer of the last run, the rows :func:`weft.runtime.trace.activity_rows` makes of them
(:attr:`RtlDevice.trace_layers`, what ``weft run --device rtl --trace`` writes).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from weft.errors import UsageError
from weft.isa.constants import INSN_BYTES
from weft.isa.encoding import decode_insns
from weft.runtime.devices import Device, DeviceError, register_device, run_loaded
from weft.runtime.dram_runner import AcceleratorImage, DramRunner, OnLayer, ProgramRunner
from weft.runtime.driver import Driver, DriverPrograms
from weft.runtime.register_backend import FIRST_ADDRESS, BackendHardware
from weft.runtime.trace import RtlLayer, activity_rows
from weft.sim import dram_model as dpi
from weft.sim.cosim import build, toplevel
from weft.sim.dram_timing import TIMINGS

if TYPE_CHECKING:
    from collections.abc import Mapping

    from weft.config import AcceleratorConfig
    from weft.core.artifact import Artifact
    from weft.sim.dram import Dram

__all__ = ["RtlBackend", "RtlDevice", "rtl_hardware"]

TEST_MODULE = "weft.runtime.rtl_server_tb"
#: Seconds to wait for the simulator to connect, and for any one reply.
CONNECT_TIMEOUT_S = 120.0
REPLY_TIMEOUT_S = 600.0

_LAUNCH = """
import json, sys
from pathlib import Path
from weft.sim.cosim import cocotb_runner
build_dir, work, sim, env, toplevel = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[6]
try:
    cocotb_runner(sim).test(test_module=sys.argv[5], hdl_toplevel=toplevel, hdl_toplevel_lang="verilog",
                            build_dir=build_dir, test_dir=work, extra_env=json.loads(env),
                            plusargs=json.loads(sys.argv[7]), log_file=Path(work) / "sim.log")
except (SystemExit, RuntimeError):
    pass  # the parent sees the simulation stop answering and shows the logs
"""


class RtlBackend:
    """One simulated accelerator with `size` bytes of DRAM, served over a socket."""

    def __init__(self, config: AcceleratorConfig, size: int, *, simulator: str = "verilator",
                 timing: str = "pynq", read_latency: int | None = None, write_latency: int | None = None,
                 read_duty: float | None = None, write_duty: float | None = None, build_root: Path | None = None,
                 trace: bool = False, dram_model: str | None = None):
        if timing not in TIMINGS:
            raise DeviceError(f"unknown DRAM timing '{timing}' (known: {', '.join(TIMINGS)})")
        overrides = {k: v for k, v in (("read_latency", read_latency), ("write_latency", write_latency),
                                       ("read_duty", read_duty), ("write_duty", write_duty)) if v is not None}
        self.timing = replace(TIMINGS[timing], **overrides)
        self.config, self.simulator, self.trace = config, simulator, trace
        try:
            self.dram_model = dpi.choose(simulator, dram_model)
        except UsageError as err:
            raise DeviceError(str(err)) from None
        self.size = 1 << max(16, (size - 1).bit_length())
        self.build_dir = build(config, simulator, build_root, dram_model=self.dram_model)
        self.proc: subprocess.Popen | None = None
        #: The dpi model's memory (its image file, mapped here too); None with AxiRam.
        self.image: np.memmap | None = None
        self._start()

    def _start(self) -> None:
        self._work = tempfile.TemporaryDirectory(prefix=f"weft-rtl-{self.simulator}-", dir=self.build_dir.parent)
        listener = socket.create_server(("127.0.0.1", 0))
        listener.settimeout(1.0)
        host, port = listener.getsockname()
        setup: dict[str, Any] = {"config": self.config.to_dict(), "dram_size": self.size,
                                 "timing": self.timing.to_dict()}
        plusargs: list[str] = []
        if self.dram_model == "dpi":
            image, violations = Path(self._work.name) / "dram.bin", Path(self._work.name) / "dram_violations.log"
            self.image = dpi.open_image(image, self.size, create=True)
            setup["dpi"] = {"image": str(image), "log": str(violations)}
            plusargs = dpi.plusargs(self.timing, image, violations)
        env = {"WEFT_RTL_SERVER": f"{host}:{port}", "COCOTB_LOG_LEVEL": "WARNING",
               "WEFT_RTL_SETUP": json.dumps(setup)}
        log = open(Path(self._work.name) / "launch.log", "wb")
        self._log = log
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _LAUNCH, str(self.build_dir), self._work.name, self.simulator, json.dumps(env),
             TEST_MODULE, toplevel(self.dram_model), json.dumps(plusargs)],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        try:
            while True:
                try:
                    self.conn, _ = listener.accept()
                    break
                except TimeoutError:
                    if self.proc.poll() is not None or time.monotonic() > deadline:
                        raise DeviceError(f"the {self.simulator} simulation did not start:\n{self._tail()}") from None
        finally:
            listener.close()
        self.conn.settimeout(REPLY_TIMEOUT_S)
        self.stream = self.conn.makefile("rb")
        if self.trace:
            self._call({"op": "trace_on"})

    def _tail(self) -> str:
        text = ""
        for name in ("launch.log", "sim.log"):
            path = Path(self._work.name) / name
            if path.exists():
                text += path.read_text(errors="replace")[-2000:]
        return text or "(no log)"

    def _call(self, header: dict[str, Any], payload: bytes = b"") -> tuple[dict[str, Any], bytes]:
        if self.proc is None:
            raise DeviceError("the RTL simulation is closed")
        try:
            self.conn.sendall(json.dumps({**header, "nbytes": len(payload)}).encode() + b"\n" + payload)
            line = self.stream.readline()
        except OSError as err:
            raise DeviceError(f"the {self.simulator} simulation is gone ({err}):\n{self._tail()}") from None
        if not line:
            raise DeviceError(f"the {self.simulator} simulation stopped answering:\n{self._tail()}")
        reply = json.loads(line)
        data = self.stream.read(reply["nbytes"]) if reply.get("nbytes") else b""
        if not reply.get("ok"):
            raise DeviceError(f"RTL server: {reply.get('error')}")
        return reply, data

    # ---- the Backend interface ---------------------------------------------------------------------------
    def read_reg(self, offset: int) -> int:
        return int(self._call({"op": "read_reg", "offset": offset})[0]["value"])

    def write_reg(self, offset: int, value: int) -> None:
        self._call({"op": "write_reg", "offset": offset, "value": value & 0xFFFFFFFF})

    # With the dpi model the memory is the image file both processes map: the simulation is paused between
    # commands, so reading and writing it here needs no command.
    def read_mem(self, addr: int, nbytes: int) -> bytes:
        self._range(addr, nbytes)
        if self.image is not None:
            return self.image[addr:addr + nbytes].tobytes()
        return self._call({"op": "read_mem", "addr": addr, "n": nbytes})[1]

    def write_mem(self, addr: int, data: bytes) -> None:
        self._range(addr, len(data))
        if self.image is not None:
            self.image[addr:addr + len(data)] = np.frombuffer(data, dtype=np.uint8)
            return
        self._call({"op": "write_mem", "addr": addr}, data)

    def _range(self, addr: int, nbytes: int) -> None:
        if addr < 0 or addr + nbytes > self.size:
            raise DeviceError(f"bytes 0x{addr:x}..0x{addr + nbytes - 1:x} are outside the simulated "
                              f"{self.size}-byte DRAM")

    def wait_irq(self, cycles: int) -> bool:
        return bool(self._call({"op": "wait_irq", "cycles": cycles})[0]["irq"])

    def take_activity(self) -> dict[str, list[tuple[int, int]]]:
        """The intervals (clock cycles) the recorder closed since the last take: ``run``, and per unit its
        busy (``load``...) and stall (``stall_load``...) intervals. Needs ``trace=True``."""
        if not self.trace:
            raise DeviceError("this RTL simulation records no activity: create it with trace=True")
        spans = self._call({"op": "trace_take"})[0]["intervals"]
        return {name: [(int(a), int(b)) for a, b in pairs] for name, pairs in spans.items()}

    def hold_dram(self) -> None:
        """Stop answering DRAM reads (a stuck bus, for watchdog tests) until the next reset."""
        self._call({"op": "hold_dram"})

    def reset(self) -> None:
        self.close()
        self._start()

    def close(self) -> None:
        if self.proc is None:
            return
        try:
            self._call({"op": "quit"})
        except DeviceError:
            pass
        self.stream.close()
        self.conn.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None
        self.image = None  # the mapping goes with the last reference, before its file does
        self._log.close()
        self._work.cleanup()

    def __del__(self) -> None:
        if getattr(self, "proc", None) is not None:
            self.close()


def rtl_hardware(config: AcceleratorConfig, nbytes: int, **options: Any) -> BackendHardware:
    """Hardware for the driver on a fresh RTL simulation that holds one `nbytes` buffer."""
    return BackendHardware(RtlBackend(config, FIRST_ADDRESS + nbytes, **options))


class RtlDevice(Device):
    """``InferenceSession(art, device="rtl", simulator="verilator"|"icarus", timing="pynq", read_latency=...,
    write_latency=..., read_duty=..., write_duty=..., timeout_s=..., trace=False, dram_model=None)``;
    `dram_model` "dpi" (the default on Verilator: the DRAM model inside the design, no Python per cycle) or
    "axiram" (cocotbext-axi's, the default on Icarus). The simulation starts
    when the artifact is loaded (its DRAM sized for the artifact's image). With `trace`, each run keeps the
    RTL's activity per accelerator layer in :attr:`trace_layers`. `on_layer` is the fsim device's hook. With
    `chains` (the default), each chain of layers runs as its one program (:mod:`weft.compiler.backend.chain`);
    the RTL counts it as a whole, so its figures go to the chain's first layer and the others show none.

    The graph walker with a DRAM-image runner whose programs run through the driver on the simulation
    (:class:`~weft.runtime.driver.DriverPrograms`), followed by this device's bookkeeping (:class:`_Recording`)."""

    name = "rtl"

    def __init__(self, config: AcceleratorConfig, *, timeout_s: float = 600.0, trace: bool = False,
                 on_layer: OnLayer | None = None, chains: bool = True, **options: Any):
        super().__init__(config)
        self.on_layer = on_layer
        #: Run each chain of layers as its one program (the RTL's figures for it go to its first layer), else
        #: each layer's own.
        self.chains = chains
        self.options, self.timeout_s, self.trace = {**options, "trace": trace}, timeout_s, trace
        self.hardware: BackendHardware | None = None
        self.runner: DramRunner | None = None
        #: Per accelerator layer of the last run, in order (with ``trace=True``).
        self.trace_layers: list[RtlLayer] = []
        self._measured: dict[str, int] = {}

    def load(self, artifact: Artifact) -> None:
        super().load(artifact)
        self.image = AcceleratorImage(artifact, self.config, self.name)
        self.layers = self.image.layers
        if self.hardware is not None:
            self.hardware.close()
        self.hardware = rtl_hardware(self.config, self.image.section.dram_bytes, **self.options)
        self.driver = Driver(self.hardware, self.config, timeout_s=self.timeout_s)
        self.driver.check_hardware()
        self.runner = DramRunner(self.image, _Recording(self, DriverPrograms(self.driver)), self, chains=self.chains)

    def run(self, feeds: Mapping[str, np.ndarray], *, keep_intermediates: bool = False
            ) -> tuple[dict[str, np.ndarray], dict[str, Any], dict[str, np.ndarray]]:
        self.trace_layers = []
        return run_loaded(self.artifact, feeds, runner=self.runner, keep_intermediates=keep_intermediates)

    def layer_cycles(self, layer: dict[str, Any]) -> int | None:
        """Cycles the RTL took for the layer's program when it last ran (None before); a layer of a chain after
        its first has none of its own (0: the chain's program counts on its first layer)."""
        head = self.layers.get(layer["name"], layer).get("chain_head") if self.chains else None
        if head is not None:
            return 0 if head in self._measured else None
        return self._measured.get(layer["name"])

    def record_run(self, dram: Dram, insn_addr: int, insn_count: int, stats: dict[str, Any]) -> None:
        """After one program ran: keep its cycles by layer and, when tracing, its per-instruction rows."""
        assert self.artifact is not None and self.hardware is not None
        programs = [x for layer in self.layers.values() for x in (layer, *layer.get("relayout", ()))] + \
            [{**layer["chain"], "name": name} for name, layer in self.layers.items() if "chain" in layer]
        program = next((x for x in programs if x["insn_addr"] == insn_addr), None)
        name = program["name"] if program is not None else f"program at 0x{insn_addr:x}"
        cycles = int(stats["cycles"])
        self._measured[name] = cycles
        if not self.trace:
            return
        activity = self.hardware.backend.take_activity()
        words = dram.read(insn_addr, insn_count * INSN_BYTES)
        rows, traced = activity_rows(self.config, decode_insns(self.config, words), activity)
        if traced != cycles:
            raise DeviceError(f"layer '{name}': the RTL trace spans {traced} cycles, the cycle counter says {cycles}")
        ops = {node.name: node.op for node in self.artifact.graph.nodes}
        offset = sum(x.cycles for x in self.trace_layers)
        macs = cycles * self.config.macs_per_cycle
        op = ops.get(name, "relayout" if program is not None and program.get("rows") else "?")
        self.trace_layers.append(RtlLayer(name, op, offset, cycles, rows,
                                          stats["macs"] / macs if macs else 0.0))

    def close(self) -> None:
        if self.hardware is not None:
            self.hardware.close()
            self.hardware = None


class _Recording:
    """The driver's programs, followed by the device's bookkeeping (cycles, trace) after each program."""

    def __init__(self, device: RtlDevice, programs: ProgramRunner):
        self.device, self.programs = device, programs

    def run(self, dram: Dram, insn_addr: int, insn_count: int) -> dict[str, Any]:
        hardware = self.device.hardware
        if self.device.trace and hardware is not None:
            hardware.backend.take_activity()  # what a failed run may have left
        stats = self.programs.run(dram, insn_addr, insn_count)
        self.device.record_run(dram, insn_addr, insn_count, stats)
        return stats


register_device("rtl", RtlDevice)
