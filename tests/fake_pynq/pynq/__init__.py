"""A stand-in for the ``pynq`` package (PYNQ 3.x API, the parts weft's board code uses), backed by a
simulated accelerator, so the board code path runs without a board.

``Overlay(bitfile)`` reads the bitstream manifest beside the ``.bit`` (``manifest.json``, written by
``weft bitstream``: it names the config) and starts the accelerator: the RTL simulation
(:class:`weft.runtime.rtl_device.RtlBackend`) when ``WEFT_PYNQ_BACKEND=rtl`` (the default when cocotb is
installed), else the functional simulator's register model. ``allocate`` returns numpy arrays with a
``physical_address`` in the simulated DRAM, synced by ``flush``/``invalidate``; ``MMIO(base, length)``
reads and writes the accelerator's AXI-Lite registers. Host time does not advance a simulation, so each
MMIO read first lets up to ``WEFT_PYNQ_POLL_CYCLES`` clock cycles pass (or until the interrupt), which
models the time a board's CPU spends between two polls.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

__version__ = "3.0.1-weft-standin"
__all__ = ["MMIO", "Overlay", "PynqBuffer", "allocate"]

IP_BASE = 0x4000_0000
IP_RANGE = 0x1_0000
_FIRST = 0x10000
_ALIGN = 4096


class _State:
    overlay: Overlay | None = None


def _backend_kind() -> str:
    kind = os.environ.get("WEFT_PYNQ_BACKEND")
    if kind:
        return kind
    return "rtl" if importlib.util.find_spec("cocotb") is not None else "fsim"


class Overlay:
    def __init__(self, bitfile_name: str, download: bool = True, **_: Any):
        self.bitfile_name = str(bitfile_name)
        bit = Path(bitfile_name)
        manifest = bit.parent / "manifest.json"
        if not bit.exists() or not manifest.exists():
            raise OSError(f"bitstream {bit} or its manifest {manifest} does not exist")
        self.manifest = json.loads(manifest.read_text())
        self.ip_dict = {"weft_0": {"phys_addr": IP_BASE, "addr_range": IP_RANGE, "type": "weft:accel:weft:1.0",
                                   "fullpath": "weft_0"}}
        self.backend: Any = None
        if download:
            self.download()

    def download(self) -> None:
        from weft.config import load_config

        if self.backend is not None:
            self.backend.close()
        config = load_config(self.manifest["config"])
        size = int(os.environ.get("WEFT_PYNQ_DRAM_BYTES", 32 << 20))
        if _backend_kind() == "rtl":
            from weft.runtime.rtl_device import RtlBackend

            self.backend = RtlBackend(config, size, simulator=os.environ.get("WEFT_PYNQ_SIMULATOR", "verilator"))
        else:
            from weft.runtime.register_backend import FsimBackend

            self.backend = FsimBackend(config, size)
        self._next = _FIRST
        _State.overlay = self

    def free(self) -> None:
        if self.backend is not None:
            self.backend.close()
            self.backend = None
        if _State.overlay is self:
            _State.overlay = None

    def _alloc(self, nbytes: int) -> int:
        addr = self._next
        if addr + nbytes > self.backend.size:
            raise MemoryError(f"the simulated DRAM ({self.backend.size} bytes) cannot hold {nbytes} more bytes")
        self._next = (addr + nbytes + _ALIGN - 1) // _ALIGN * _ALIGN
        return addr


def _overlay() -> Overlay:
    if _State.overlay is None or _State.overlay.backend is None:
        raise RuntimeError("no overlay is loaded (pynq stand-in): create pynq.Overlay(bitfile) first")
    return _State.overlay


class PynqBuffer(np.ndarray):
    physical_address: int
    device_address: int

    def flush(self) -> None:
        _overlay().backend.write_mem(self.physical_address, np.ascontiguousarray(self).view(np.uint8).tobytes())

    def invalidate(self) -> None:
        data = _overlay().backend.read_mem(self.physical_address, self.nbytes)
        self.view(np.uint8).reshape(-1)[:] = np.frombuffer(data, dtype=np.uint8)

    def sync_to_device(self) -> None:
        self.flush()

    def sync_from_device(self) -> None:
        self.invalidate()

    def freebuffer(self) -> None:
        pass


def allocate(shape: Any, dtype: Any = "u4", **_: Any) -> PynqBuffer:
    ov = _overlay()
    buf = np.zeros(shape, dtype=dtype).view(PynqBuffer)
    buf.physical_address = buf.device_address = ov._alloc(buf.nbytes)
    return buf


class MMIO:
    def __init__(self, base_addr: int, length: int = 4, **_: Any):
        self.base_addr, self.length = base_addr, length
        self.poll_cycles = int(os.environ.get("WEFT_PYNQ_POLL_CYCLES", 2048))

    def _check(self, offset: int) -> None:
        ip = _overlay().ip_dict["weft_0"]
        if self.base_addr != ip["phys_addr"] or not 0 <= offset < min(self.length, ip["addr_range"]) or offset % 4:
            raise ValueError(f"MMIO 0x{self.base_addr + offset:x} is not an aligned register of the accelerator")

    def read(self, offset: int = 0, length: int = 4) -> int:
        self._check(offset)
        backend = _overlay().backend
        backend.wait_irq(self.poll_cycles)
        return int(backend.read_reg(offset))

    def write(self, offset: int, data: int) -> None:
        self._check(offset)
        _overlay().backend.write_reg(offset, int(data))
