"""A full ResNet-18 convolution layer on `default`, through the driver on Verilator: the DRAM image the
RTL leaves equals the functional simulator's to the bit, and the layer's output equals the reference's."""

from __future__ import annotations

import numpy as np
import pytest

import weft
from weft.compiler import models
from weft.runtime.driver import Driver
from weft.runtime.rtl_device import rtl_hardware
from weft.tools.bench_accel import replay_jobs

from .test_e2e import _compile, _shape
from .test_frontend_util import rand

pytestmark = [pytest.mark.slow, pytest.mark.rtl]


def test_resnet18_conv_layer_on_default_rtl_equals_fsim_and_ref():
    model = models.MODELS["resnet18"]()
    art = _compile(model, "default")
    name, shape = _shape(model)
    feeds = {name: rand(*shape, seed=5)}
    meta = art.sections["accel"].meta
    layer = next(x for x in meta["layers"] if x["name"] == "layer1.0.conv1")  # 64->64, 3x3, 56x56
    jobs, after, _ = replay_jobs(art, feeds, {layer["name"]})
    job = jobs[layer["name"]]
    hw = rtl_hardware(art.config, job.dram.size, simulator="verilator", timing="pynq")
    try:
        driver = Driver(hw, art.config, timeout_s=3600)
        driver.check_hardware()
        image = job.dram.copy()
        result = driver.run_image(image, job.insn_addr, job.insn_count)
    finally:
        hw.close()
    np.testing.assert_array_equal(image, after[layer["name"]])
    assert result["counters"]["mac_active"] > 0
    # the layer's output value, read back from the RTL's image, equals the reference interpreter's
    out = next(n for n in art.graph.nodes if n.name == layer["name"]).outputs[0]
    ref = weft.InferenceSession(art, device="ref")
    ref.run(None, feeds, keep_intermediates=True)
    fsim = weft.InferenceSession(art, device="fsim")
    fsim.run(None, feeds, keep_intermediates=True)
    np.testing.assert_array_equal(fsim.intermediate(out), ref.intermediate(out))
    rows = fsim.device.image.read_value(_Image(image), out)  # the RTL's DRAM, unpacked like the fsim device does
    np.testing.assert_array_equal(rows, ref.intermediate(out))


class _Image:
    """A DRAM image seen through the Dram read interface."""

    def __init__(self, data: np.ndarray):
        self.data = data

    def read(self, addr: int, nbytes: int) -> np.ndarray:
        return self.data[addr:addr + nbytes].copy()
