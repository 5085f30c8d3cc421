"""The driver on the functional simulator's register model: the same outputs as the fsim and ref
devices, to the bit, with the program relocated to a buffer at a nonzero physical address."""

from __future__ import annotations

import numpy as np
import pytest

import weft
from weft.hw.regs import registers_spec
from weft.runtime.driver import DriverDevice, RegisterMap, RunError
from weft.runtime.register_backend import FIRST_ADDRESS, fsim_hardware

from .driver_util import compiled, first_layer_image, with_insns


@pytest.mark.parametrize("name", ["mlp", "awkward_cnn"])
def test_driver_on_fsim_registers_is_bit_exact(name):
    art, feeds = compiled(name)
    ref = weft.InferenceSession(art, device="ref").run(None, feeds)
    fsim = weft.InferenceSession(art, device="fsim").run(None, feeds)
    size = FIRST_ADDRESS + art.sections["accel"].meta["dram_bytes"]
    sess = weft.InferenceSession(art, device=DriverDevice(art.config, fsim_hardware(art.config, size)))
    out = sess.run(None, feeds)
    for r, f, d in zip(ref, fsim, out, strict=True):
        np.testing.assert_array_equal(r, f)
        np.testing.assert_array_equal(f, d)
    assert sess.device.driver.buffer.physical_address == FIRST_ADDRESS
    # a second run on the same session gives the same answer
    np.testing.assert_array_equal(sess.run(None, feeds)[0], out[0])


def test_register_offsets_come_from_the_spec():
    art, _ = compiled()
    spec = registers_spec(art.config)
    regs = RegisterMap(spec)
    assert regs.offsets == {r["name"]: r["offset"] for r in spec["registers"]}
    assert regs.bits(start=1, irq_en=1) == 0b11


def test_hardware_error_names_the_instruction():
    """A program that passes the launch checks but faults in the hardware (an SRAM row past the end)."""
    from weft.isa.constants import Opcode
    from weft.isa.encoding import layout_of

    art, _ = compiled()
    image, layer, insns = first_layer_image(art)
    bad = insns.copy()
    i = next(k for k, r in enumerate(bad) if r["opcode"] == Opcode.LOAD and r["x_size"] > 0)
    width = next(f.width for f in layout_of(art.config).formats["mem"].fields if f.name == "sram_base")
    bad[i]["sram_base"] = (1 << width) - 1
    driver = DriverDevice(art.config, fsim_hardware(art.config, 1 << 22)).driver
    with pytest.raises(RunError, match=f"instruction {i} ") as info:
        driver.run_image(with_insns(art, image, layer, bad), layer["insn_addr"], layer["insn_count"])
    assert info.value.index == i


def test_run_image_leaves_the_same_dram_as_the_simulator():
    """The whole image, the caller's (unrelocated) instruction stream included."""
    from weft.sim.dram import Dram
    from weft.sim.fsim import FunctionalSimulator

    art, _ = compiled()
    image, layer, _ = first_layer_image(art)
    expected = Dram(image.size)
    expected.write(0, image)
    FunctionalSimulator(art.config).run(expected, layer["insn_addr"], layer["insn_count"])
    driver = DriverDevice(art.config, fsim_hardware(art.config, FIRST_ADDRESS + image.size)).driver
    got = image.copy()
    driver.run_image(got, layer["insn_addr"], layer["insn_count"])
    assert driver.buffer.physical_address != 0
    np.testing.assert_array_equal(got, expected.data)
