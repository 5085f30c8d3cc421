"""Bad inputs to the board driver: crafted streams the launch checks refuse (legality from the ISA's one
table, the simulator's too), buffers above the 32-bit AXI space, an INSN_COUNT the check did not see.
Each refusal names the culprit, nothing starts and the caller's image is left as it was."""

from __future__ import annotations

import re

import numpy as np
import pytest

from weft.isa.constants import AluOp, MemId, Opcode
from weft.runtime.driver import Driver
from weft.runtime.register_backend import BackendBuffer, BackendHardware, FsimBackend
from weft.runtime.safety import LaunchError, check_launch
from weft.sim.dram import Dram
from weft.sim.fsim import FunctionalSimulator, SimError

from .driver_util import CountingBackend, compiled, first_layer_image, with_insns


class _HighHardware(BackendHardware):
    """Hands out buffers at a chosen physical address, as a ZynqMP may above 4 GiB."""

    def __init__(self, backend: FsimBackend, address: int):
        super().__init__(backend)
        self.address = address

    def allocate(self, nbytes: int) -> BackendBuffer:
        return BackendBuffer(self.backend, self.address, nbytes)


def _driver(art, hardware=None):
    backend = CountingBackend(art.config, 1 << 22)
    CountingBackend.starts = 0
    return Driver(hardware(backend) if hardware else BackendHardware(backend), art.config)


def _first(insns, pred):
    return next(i for i, r in enumerate(insns) if pred(r))


def _refuse(image, layer, match, *, count=None, hardware=None):
    art, _ = compiled()
    driver = _driver(art, hardware)
    before = image.copy()
    with pytest.raises(LaunchError, match=match) as info:
        driver.run_image(image, layer["insn_addr"], layer["insn_count"] if count is None else count)
    assert CountingBackend.starts == 0
    np.testing.assert_array_equal(image, before)  # nothing of the caller's was overwritten
    return info.value


def _set(field, value, pred):
    def mutate(insns):
        i = _first(insns, pred)
        insns[i][field] = value
        return i
    return mutate


def _is(opcode, *mems):
    return lambda r: r["opcode"] == opcode and (not mems or r["mem_id"] in mems) and r["x_size"] > 0


ILLEGAL = {
    "store_into_inp": (_set("mem_id", MemId.INP, _is(Opcode.STORE)), "STORE writes only the out buffer"),
    "store_from_acc": (_set("mem_id", MemId.ACC, _is(Opcode.STORE)), "illegal memory id 3 for STORE"),
    "load_into_out": (_set("mem_id", MemId.OUT, _is(Opcode.LOAD, MemId.INP)), "LOAD writes only the uop, wgt"),
    "load_mem_id_6": (_set("mem_id", 6, _is(Opcode.LOAD, MemId.WGT)), "illegal memory id 6 for LOAD"),
    "load_unit_pops_prev": (_set("pop_prev", 1, _is(Opcode.LOAD, MemId.INP)),
                            "dependency flag pop_prev is illegal for the load unit"),
    "store_unit_pushes_next": (_set("push_next", 1, _is(Opcode.STORE)),
                               "dependency flag push_next is illegal for the store unit"),
    "padded_store": (_set("x_pad_0", 1, _is(Opcode.STORE)), "padding is only allowed on loads into inp"),
    "padded_weights": (_set("y_pad_1", 2, _is(Opcode.LOAD, MemId.WGT)), "padding is only allowed on loads"),
    "alu_op_7": (_set("alu_op", 7, lambda r: r["opcode"] == Opcode.ALU), "illegal ALU op 7"),
    "empty_uop_range": (_set("uop_end", 0, lambda r: r["opcode"] == Opcode.GEMM), "empty micro-op range"),
}


@pytest.mark.parametrize("case", ILLEGAL)
def test_illegal_instruction_is_refused_before_launch(case):
    mutate, match = ILLEGAL[case]
    art, _ = compiled()
    image, layer, insns = first_layer_image(art)
    bad = insns.copy()
    if case == "alu_op_7" and not (bad["opcode"] == Opcode.ALU).any():
        pytest.skip("no ALU instruction in this layer")
    assert max(AluOp) < 7
    i = mutate(bad)
    bad_image = with_insns(art, image, layer, bad)
    err = _refuse(bad_image, layer, match)
    assert err.index == i and f"instruction {i} (" in str(err)
    # the simulator applies the same table, with the same words
    dram = Dram(bad_image.size)
    dram.write(0, bad_image)
    with pytest.raises(SimError) as sim:
        FunctionalSimulator(art.config).run(dram, layer["insn_addr"], layer["insn_count"])
    assert sim.value.index == i and re.search(match, str(sim.value))  # the same rule, in the same words


def test_illegal_opcode_bits_are_refused():
    """Opcode 5 cannot be encoded: the bits are patched into the image."""
    art, _ = compiled()
    image, layer, insns = first_layer_image(art)
    i = _first(insns, lambda r: r["opcode"] == Opcode.GEMM)
    at = layer["insn_addr"] + i * layer["insn_bytes"]
    image[at] = (int(image[at]) & 0xF8) | 5
    err = _refuse(image, layer, rf"instruction {i} \(.*\): illegal opcode 5")
    assert err.index == i


@pytest.mark.parametrize("address", [1 << 32, (1 << 32) - 4096, 0x8_0000_0000])
def test_buffer_above_4gib_is_refused(address):
    art, _ = compiled()
    image, layer, _ = first_layer_image(art)
    err = _refuse(image, layer, rf"buffer 0 at 0x{address:x}\.\..* is not below 4 GiB",
                  hardware=lambda backend: _HighHardware(backend, address))
    assert err.index is None


def test_truncated_image_does_not_program_an_unchecked_count():
    """The image ends before the stream does: fewer instructions decode than INSN_COUNT would fetch."""
    art, _ = compiled()
    image, layer, _ = first_layer_image(art)
    cut = image[:layer["insn_addr"] + (layer["insn_count"] - 1) * layer["insn_bytes"]].copy()
    _refuse(cut, layer, f"INSN_COUNT {layer['insn_count']} differs from the {layer['insn_count'] - 1} instructions")


def test_check_launch_refuses_a_count_it_did_not_see():
    art, _ = compiled()
    _, _, insns = first_layer_image(art)
    with pytest.raises(LaunchError, match=f"INSN_COUNT {len(insns) + 3} differs"):
        check_launch(art.config, insns, 0, [(0, 1 << 20)], 16, len(insns) + 3)


def test_dma_range_past_4gib_in_a_low_buffer_is_refused():
    """The buffer list itself reaches past 4 GiB (a caller of check_launch with a huge range)."""
    art, _ = compiled()
    _, _, insns = first_layer_image(art)
    with pytest.raises(LaunchError, match=r"buffer 1 at 0xfff00000\.\.0x1000fffff is not below 4 GiB"):
        check_launch(art.config, insns, 0, [(0, 1 << 20), (0xFFF0_0000, (1 << 32) + (1 << 20))], 16, len(insns))

