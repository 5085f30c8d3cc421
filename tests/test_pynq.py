"""The PYNQ device's exact code path (pynq.Overlay, pynq.allocate, pynq.MMIO) against the stand-in in
tests/fake_pynq, backed by the RTL simulation (and by the functional simulator's register model)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import weft
from weft.config import PRESETS
from weft.runtime import bitstreams
from weft.runtime.safety import LaunchError
from weft.sim.cosim import verilog_path

from .driver_util import compiled

STANDIN = Path(__file__).parent / "fake_pynq"


@pytest.fixture
def standin(monkeypatch):
    monkeypatch.syspath_prepend(str(STANDIN))
    monkeypatch.delitem(sys.modules, "pynq", raising=False)
    monkeypatch.setenv("WEFT_PYNQ_DRAM_BYTES", str(1 << 20))
    yield monkeypatch


def _bitstream(tmp_path, config, board="pynq-z2"):
    folder = bitstreams.write_project(board, config, tmp_path, verilog=verilog_path(config).read_text())
    (folder / "weft.bit").write_bytes(b"stand-in bitstream for " + config.hash.encode())
    (folder / "weft.hwh").write_text("<hwh/>")
    bitstreams.record_build(folder)
    return folder / "weft.bit"


@pytest.mark.parametrize("backend", [
    "fsim",
    pytest.param("rtl", marks=pytest.mark.rtl),
])
def test_pynq_device_on_the_standin_is_bit_exact(standin, tmp_path, backend):
    standin.setenv("WEFT_PYNQ_BACKEND", backend)
    art, feeds = compiled("mlp")
    bit = _bitstream(tmp_path, art.config)
    sess = weft.InferenceSession(art, device="pynq", bitstream=bit)
    try:
        import pynq

        assert pynq.__version__.endswith("weft-standin")
        ref = weft.InferenceSession(art, device="ref").run(None, feeds)
        out = sess.run(None, feeds)
        for r, d in zip(ref, out, strict=True):
            np.testing.assert_array_equal(r, d)
        assert sess.device.driver.buffer.physical_address > 0
    finally:
        sess.device.close()


def test_pynq_refuses_a_bitstream_of_another_config(standin, tmp_path):
    standin.setenv("WEFT_PYNQ_BACKEND", "fsim")
    art, _ = compiled("mlp")
    other = PRESETS["default"]
    folder = bitstreams.write_project("pynq-z2", other, tmp_path, verilog="// not used")
    (folder / "weft.bit").write_bytes(b"x")
    with pytest.raises(LaunchError, match=f"config hash mismatch.*{art.config.hash}.*{other.hash}"):
        weft.InferenceSession(art, device="pynq", bitstream=folder / "weft.bit")
