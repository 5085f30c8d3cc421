"""The "pynq" device: the driver on a PYNQ board (PYNQ 3.x API: ``pynq.Overlay``, ``pynq.allocate``,
``pynq.MMIO``; no xlnk, removed in PYNQ 2.7).

``InferenceSession(art, device="pynq", bitstream="weft.bit")`` loads the overlay, finds the accelerator's
IP (the first whose name starts with ``weft``), checks the bitstream's manifest and the CONFIG_HASH
registers against the artifact, and runs the artifact's layers through :class:`~weft.runtime.driver.Driver`.
In CI the ``pynq`` module is the stand-in in ``tests/fake_pynq`` (backed by the RTL simulation), so this
exact code runs there. Imports numpy only until a device is made.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from weft.errors import read_input
from weft.runtime.devices import Device, DeviceError, register_device
from weft.runtime.driver import DriverDevice
from weft.runtime.safety import check_config_hash

if TYPE_CHECKING:
    from weft.config import AcceleratorConfig
    from weft.core.artifact import Artifact

__all__ = ["PynqDevice", "PynqHardware", "read_manifest"]


def read_manifest(bitstream: str | Path) -> dict[str, Any]:
    """The manifest beside a ``.bit`` (``manifest.json``), or {} when there is none."""
    path = Path(bitstream).parent / "manifest.json"
    return json.loads(path.read_text()) if path.exists() else {}


class _PynqBuffer:
    def __init__(self, buf: Any):
        self.buf = buf
        self.array = buf
        self.physical_address = int(buf.physical_address)

    def flush(self) -> None:
        self.buf.flush()

    def invalidate(self) -> None:
        self.buf.invalidate()


class PynqHardware:
    """The driver's Hardware interface on a PYNQ overlay."""

    def __init__(self, bitstream: str | Path, *, ip_name: str | None = None, poll_s: float = 50e-6):
        import pynq

        self.pynq, self.poll_s = pynq, poll_s
        self.overlay = pynq.Overlay(str(bitstream))
        names = [n for n in self.overlay.ip_dict if (n == ip_name if ip_name else n.startswith("weft"))]
        if not names:
            raise DeviceError(f"bitstream {bitstream} has no accelerator IP "
                              f"{ip_name or 'weft*'} (IPs: {', '.join(self.overlay.ip_dict)})")
        ip = self.overlay.ip_dict[names[0]]
        self.mmio = pynq.MMIO(int(ip["phys_addr"]), int(ip["addr_range"]))
        self.buffers: list[Any] = []

    def read(self, offset: int) -> int:
        return int(self.mmio.read(offset))

    def write(self, offset: int, value: int) -> None:
        self.mmio.write(offset, int(value))

    def allocate(self, nbytes: int) -> _PynqBuffer:
        buf = self.pynq.allocate(shape=(nbytes,), dtype=np.uint8)
        self.buffers.append(buf)
        return _PynqBuffer(buf)

    def pause(self) -> None:
        time.sleep(self.poll_s)

    def reset(self) -> bool:
        """Download the bitstream again: the only reset the accelerator has."""
        self.overlay.download()
        return True

    def close(self) -> None:
        for buf in self.buffers:
            buf.freebuffer()
        self.buffers.clear()
        free = getattr(self.overlay, "free", None)
        if free is not None:
            free()


class PynqDevice(Device):
    """``device="pynq"``: options ``bitstream`` (path of the .bit; its manifest beside it), ``spec`` (the
    register spec JSON written by ``weft rtl``, or its dict), ``ip_name``, ``timeout_s``. The driver device
    on a :class:`PynqHardware` (kept as :attr:`board`; ``driver`` and ``hardware`` are its)."""

    name = "pynq"

    def __init__(self, config: AcceleratorConfig, *, bitstream: str | Path | None = None,
                 spec: str | Path | Mapping | None = None, ip_name: str | None = None, timeout_s: float = 60.0):
        super().__init__(config)
        if bitstream is None:
            raise DeviceError("device 'pynq' needs the bitstream: InferenceSession(art, device='pynq', "
                              "bitstream='weft.bit') (its manifest.json beside it)")
        if not Path(bitstream).is_file():  # said before pynq's Overlay, whose error names the .hwh or a manifest
            raise DeviceError(f"device 'pynq': bitstream file {bitstream} does not exist (build it in Vivado from the "
                              "project `weft bitstream --board B --config C` writes, then `weft bitstream record`; "
                              "or give its path: bitstream=PATH)")
        manifest = read_manifest(bitstream)
        if manifest.get("config_hash") is not None:
            check_config_hash(config.hash, manifest["config_hash"], where=f"bitstream {bitstream} (its manifest)")
        if isinstance(spec, (str, Path)):
            data = json.loads(read_input(spec, "register spec"))
            spec = data.get("registers", data) if "registers" in data and isinstance(data["registers"], dict) else data
        self.board = DriverDevice(config, PynqHardware(bitstream, ip_name=ip_name), spec=spec, timeout_s=timeout_s,
                                  name=self.name)
        self.driver, self.hardware = self.board.driver, self.board.hardware

    def load(self, artifact: Artifact) -> None:
        super().load(artifact)
        self.board.load(artifact)

    def run(self, feeds: Mapping[str, np.ndarray], *, keep_intermediates: bool = False
            ) -> tuple[dict[str, np.ndarray], dict[str, Any], dict[str, np.ndarray]]:
        return self.board.run(feeds, keep_intermediates=keep_intermediates)

    def close(self) -> None:
        self.board.close()


register_device("pynq", PynqDevice)
