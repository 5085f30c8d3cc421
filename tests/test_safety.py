"""Launch checks: each refuses a crafted bad stream, naming the instruction, and nothing starts."""

from __future__ import annotations

import numpy as np
import pytest

from weft.config import PRESETS
from weft.isa.constants import MemId, Opcode
from weft.runtime.driver import Driver, DriverDevice
from weft.runtime.register_backend import fsim_hardware
from weft.runtime.safety import LaunchError

from .driver_util import CountingBackend, compiled, first_layer_image, with_insns


def _driver(art):
    from weft.runtime.register_backend import BackendHardware

    backend = CountingBackend(art.config, 1 << 22)
    return Driver(BackendHardware(backend), art.config), backend


def _refused(mutate, match):
    art, _ = compiled()
    image, layer, insns = first_layer_image(art)
    bad = insns.copy()
    index = mutate(bad)
    driver, _ = _driver(art)
    CountingBackend.starts = 0
    with pytest.raises(LaunchError, match=match) as info:
        driver.run_image(with_insns(art, image, layer, bad), layer["insn_addr"], layer["insn_count"])
    assert info.value.index == index
    assert f"instruction {index} (" in str(info.value)
    assert CountingBackend.starts == 0


def _first(insns, pred):
    return next(i for i, r in enumerate(insns) if pred(r))


def test_good_stream_runs():
    art, _ = compiled()
    image, layer, _ = first_layer_image(art)
    driver, _ = _driver(art)
    result = driver.run_image(image, layer["insn_addr"], layer["insn_count"])
    assert result["counters"]["insns"] == layer["insn_count"]


def test_dma_outside_the_buffer_is_refused():
    def mutate(insns):
        i = _first(insns, lambda r: r["opcode"] == Opcode.STORE and r["x_size"] > 0)
        insns[i]["dram_base"] = 1 << 24  # far past the run's buffer
        return i
    _refused(mutate, "DMA bytes .* outside the buffers allocated")


def test_unbalanced_tokens_are_refused():
    def mutate(insns):
        loads = [k for k, r in enumerate(insns) if r["opcode"] == Opcode.LOAD and r["mem_id"] in (MemId.INP, MemId.WGT)]
        insns[next(k for k in loads if not insns[k]["push_next"])]["push_next"] = 1
        # tokens match first-in first-out: the last push is the one nobody pops
        i = max(k for k in loads if insns[k]["push_next"])
        return i
    _refused(mutate, "pushes a token on queue l2g that no instruction pops")


def test_pop_without_push_is_refused():
    def mutate(insns):
        loads = [k for k, r in enumerate(insns) if r["opcode"] == Opcode.LOAD and r["mem_id"] in (MemId.INP, MemId.WGT)]
        insns[next(k for k in reversed(loads) if not insns[k]["pop_next"])]["pop_next"] = 1
        # tokens match first-in first-out: the last pop is the one nobody pushes for
        return max(k for k in loads if insns[k]["pop_next"])
    _refused(mutate, "pops queue g2l but no instruction pushes its token")


def test_bad_uop_span_is_refused():
    def mutate(insns):
        i = _first(insns, lambda r: r["opcode"] == Opcode.GEMM)
        insns[i]["uop_end"] = insns[i]["uop_bgn"]
        return i
    _refused(mutate, "micro-op range")


def test_uop_span_past_the_buffer_is_refused():
    def mutate(insns):
        i = _first(insns, lambda r: r["opcode"] in (Opcode.GEMM, Opcode.ALU))
        insns[i]["uop_end"] = PRESETS["tiny"].uop_rows + 1
        return i
    _refused(mutate, f"beyond the {PRESETS['tiny'].uop_rows} rows of the uop buffer")


def test_config_mismatch_is_refused():
    art, _ = compiled()
    other = PRESETS["default"]
    with pytest.raises(LaunchError, match="config hash mismatch"):
        DriverDevice(art.config, fsim_hardware(other, 1 << 20))


def test_relocation_moves_every_dram_address():
    art, _ = compiled()
    _, _, insns = first_layer_image(art)
    driver = Driver(fsim_hardware(art.config, 1 << 20), art.config)
    moved = driver.relocate(insns, 0x10000)
    mem = np.isin(insns["opcode"], [Opcode.LOAD, Opcode.STORE])
    assert mem.any()
    assert (moved["dram_base"][mem] > insns["dram_base"][mem]).all()
    np.testing.assert_array_equal(moved["dram_base"][~mem], insns["dram_base"][~mem])
