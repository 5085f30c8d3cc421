"""The DRAM model inside the simulated design (weft.sim.dram_model): the wrapper it builds around weft_top, its
C++ rule checker, and on Verilator the same results as the AxiRam model on the same stream."""

from __future__ import annotations

import ctypes
import shutil
import subprocess

import numpy as np
import pytest

from weft.config import PRESETS
from weft.errors import UsageError
from weft.sim import dram_model
from weft.sim.cosim import job_from_program, run_jobs
from weft.sim.dram_timing import TIMINGS
from weft.sim.fsim import FunctionalSimulator
from weft.sim.randprog import random_program

_TOP = """module weft_top(clk, rst, irq, s_axil_awaddr, m_axi_rdata, m_axi_arid, m_axi_araddr, %s);
  input clk;
  input rst;
  output irq;
  input [7:0] s_axil_awaddr;
  input [63:0] m_axi_rdata;
  output [1:0] m_axi_arid;
  output [31:0] m_axi_araddr;
%s
endmodule
"""


def _toy_top() -> str:
    others = [name for name in dram_model._AXI if name not in ("rdata", "arid", "araddr")]
    decls = "\n".join(f"  input m_axi_{name};" for name in others)
    return _TOP % (", ".join(f"m_axi_{name}" for name in others), decls)


def test_the_wrapper_puts_the_model_on_m_axi_and_keeps_the_other_ports():
    text = dram_model.wrapper_verilog(_toy_top())
    assert "module weft_sim(" in text and "weft_dram #(.DATA_W(64), .ID_W(2), .ADDR_W(32))" in text
    header = text.splitlines()[1]
    for port in ("clk", "rst", "irq", "s_axil_awaddr", "dram_hold", "dram_read_bursts"):
        assert port in header
    assert "m_axi_" not in header
    assert ".rst(rst_q)" in text  # the design's reset comes through a register
    control = dram_model.control_file(_toy_top())
    assert 'public_flat_rw -module "weft_sim" -var "rst"' in control
    assert 'public_flat_rd -module "weft_sim" -var "irq"' in control
    assert "m_axi" not in control


def test_a_top_without_the_axi_ports_is_refused():
    with pytest.raises(UsageError, match="m_axi_"):
        dram_model.wrapper_verilog("module weft_top(clk);\n  input clk;\nendmodule\n")


def test_the_model_is_chosen_by_simulator_and_faults():
    assert dram_model.choose("verilator", None) == "dpi"
    assert dram_model.choose("icarus", None) == "axiram"
    assert dram_model.choose("verilator", None, faults=True) == "axiram"
    with pytest.raises(UsageError, match="Verilator"):
        dram_model.choose("icarus", "dpi")
    with pytest.raises(UsageError, match="fault"):
        dram_model.choose("verilator", "dpi", faults=True)
    with pytest.raises(UsageError, match="unknown DRAM model"):
        dram_model.choose("verilator", "ddr4")


@pytest.mark.parametrize("duty", [0.6, 0.75, 0.9, 1.0])
def test_the_pause_pattern_lets_the_duty_through(duty):
    pattern = dram_model.pause_pattern(duty)
    assert len(pattern) == dram_model.PAUSE_PERIOD
    assert pattern.count(False) == round(duty * dram_model.PAUSE_PERIOD)
    args = dram_model.plusargs(TIMINGS["pynq"], "img", "log")
    assert "+weft_dram_read_latency=32" in args and "+weft_dram_random=0" in args


@pytest.fixture(scope="module")
def checker(tmp_path_factory):
    """The model's C++ (no simulator needed) as a shared library."""
    compiler = shutil.which("c++")
    if compiler is None:
        pytest.skip("no C++ compiler")
    out = tmp_path_factory.mktemp("dram") / "libweft_dram.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-o", str(out), str(dram_model.MODEL_SOURCES[1])],
                   check=True)
    return ctypes.CDLL(str(out)), out.parent


def test_the_backing_store_maps_the_image_and_checks_the_rules(checker):
    lib, folder = checker
    lib.weft_dram_read32.restype = ctypes.c_uint
    image, log = folder / "dram.bin", folder / "violations.log"
    mem = dram_model.open_image(image, 1 << 16, create=True)
    mem[:8] = np.arange(1, 9, dtype=np.uint8)
    lib.weft_dram_open(str(image).encode(), str(log).encode())
    assert lib.weft_dram_read32(0) == 0x04030201
    assert lib.weft_dram_read32(0x10000 + 4) == 0x08070605  # addresses wrap at the image's size
    lib.weft_dram_write32(16, 0xAABBCCDD, 0b0101)
    assert list(mem[16:20]) == [0xDD, 0, 0xBB, 0]  # the strobes pick the bytes; the file is shared
    assert lib.weft_dram_check(0, 0x0F80, 16, 3, 1, 8) == 0  # 16 beats of 8 bytes up to the 4 KiB line
    assert log.read_text() == ""
    assert lib.weft_dram_check(0, 0x0F80, 17, 3, 1, 8) == 1
    assert lib.weft_dram_check(1, 0x0004, 1, 2, 0, 8) == 1
    lines = log.read_text().splitlines()
    assert lines[0] == "read burst at 0x00000f80 (17 beats): crosses a 4 KiB boundary"
    assert any("burst type 0 is not INCR" in line for line in lines)
    assert any("size 4 bytes is not the bus width of 8 bytes" in line for line in lines)
    assert any("address not aligned" in line for line in lines)


@pytest.mark.rtl("verilator")
def test_dpi_and_axiram_agree_on_the_same_stream():
    """Both models on the same random programs: bit-exact with the functional simulator, and the first
    program's cycles equal (later ones start at other phases of the duty pattern)."""
    config = PRESETS["tiny"]
    oracle = FunctionalSimulator(config)  # one instance for the batch, as the RTL's buffers carry over
    jobs, expected = [], []
    for seed in (3, 4):
        insns, dram = random_program(config, seed, 100)
        job = job_from_program(config, insns, dram)
        image = type(dram)(job.dram.size)
        image.data[:] = job.dram
        oracle.run(image, job.insn_addr, job.insn_count)
        jobs.append(job)
        expected.append(image.data)
    results = {model: run_jobs(config, "verilator", jobs, timing="pynq", dram_model=model)
               for model in dram_model.DRAM_MODELS}
    for model, runs in results.items():
        for run, want in zip(runs, expected, strict=True):
            np.testing.assert_array_equal(run.dram, want, err_msg=model)
            assert not run.report["violations"] and run.error_code == 0
    dpi, axiram = results["dpi"], results["axiram"]
    assert dpi[0].counters == axiram[0].counters
    assert [r.report["read_bursts"] for r in dpi] == [r.report["read_bursts"] for r in axiram]


@pytest.mark.rtl("verilator")
def test_random_stalls_run_on_the_dpi_model():
    config = PRESETS["tiny"]
    insns, dram = random_program(config, 7, 80)
    job = job_from_program(config, insns, dram)
    image = type(dram)(job.dram.size)
    image.data[:] = job.dram
    FunctionalSimulator(config).run(image, job.insn_addr, job.insn_count)
    stress = run_jobs(config, "verilator", [job], timing="stress", dram_model="dpi", seed=5)[0]
    ideal = run_jobs(config, "verilator", [job], timing="ideal", dram_model="dpi")[0]
    np.testing.assert_array_equal(stress.dram, image.data)
    assert stress.cycles > ideal.cycles
