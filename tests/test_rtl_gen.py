"""The generated Verilog: port names, config stamp, `weft rtl`, and `verilator --lint-only` per preset."""

from __future__ import annotations

import json
import os
import re
import subprocess

import numpy as np
import pytest

from weft.cli import main
from weft.config import PRESETS
from weft.isa.arith import pack, unpack
from weft.sim.bench_rtl import gemm_stream
from weft.sim.cosim import verilog_path
from weft.sim.fsim import run_program
from weft.sim.simulators import find

AXI_PORTS = ("awid awaddr awlen awsize awburst awvalid awready wdata wstrb wlast wvalid wready bid bresp bvalid "
             "bready arid araddr arlen arsize arburst arvalid arready rid rdata rresp rlast rvalid rready").split()
AXIL_PORTS = ("awaddr awvalid awready wdata wstrb wvalid wready bresp bvalid bready araddr arvalid arready rdata "
              "rresp rvalid rready").split()


def _ports(verilog: str) -> dict[str, int]:
    """Port name -> width of the top module."""
    top = verilog[verilog.index("module weft_top("):]
    top = top[:top.index("endmodule")]
    ports = {}
    for _direction, width, name in re.findall(r"^\s*(input|output)\s+(?:\[(\d+):0\]\s+)?(\w+);", top, re.M):
        ports[name] = int(width) + 1 if width else 1
    return ports


def test_top_level_ports_are_named_for_axi_tools_and_sized_by_the_config():
    config = PRESETS["tiny"]
    text = verilog_path(config).read_text()
    assert f"config hash {config.hash}" in text.splitlines()[0]
    ports = _ports(text)
    for name in AXI_PORTS:
        assert f"m_axi_{name}" in ports, name
    for name in AXIL_PORTS:
        assert f"s_axil_{name}" in ports, name
    assert {"clk", "rst", "irq"} <= set(ports)
    assert ports["m_axi_wdata"] == ports["m_axi_rdata"] == config.bus_width
    assert ports["m_axi_wstrb"] == config.bus_width // 8
    assert ports["m_axi_araddr"] == 32 and ports["m_axi_arlen"] == 8
    assert ports["s_axil_wdata"] == 32


def test_weft_rtl_writes_verilog_spec_and_header_from_one_config(tmp_path, capsys):
    assert main(["rtl", "--config", "tiny", "-o", str(tmp_path)]) == 0
    summary = json.loads(capsys.readouterr().out)
    config = PRESETS["tiny"]
    assert summary["config_hash"] == config.hash
    verilog = (tmp_path / "weft_top.v").read_text()
    spec = json.loads((tmp_path / "weft_spec.json").read_text())
    header = (tmp_path / "weft_spec.h").read_text()
    assert config.hash in verilog.splitlines()[0]
    assert spec["config_hash"] == config.hash and spec["config"] == config.to_dict()
    offsets = {r["name"]: r["offset"] for r in spec["registers"]["registers"]}
    assert f"#define WEFT_REG_INSN_COUNT 0x{offsets['INSN_COUNT']:04x}" in header
    assert f'#define WEFT_CONFIG_HASH "{config.hash}"' in header
    assert "ILLEGAL_OPCODE" in spec["registers"]["error_codes"]


@pytest.mark.rtl
@pytest.mark.parametrize("name", [
    "tiny", *[pytest.param(n, marks=pytest.mark.slow) for n in PRESETS if n != "tiny"],
])
def test_verilog_passes_verilator_lint(name, tmp_path):
    source = verilog_path(PRESETS[name])
    copy = tmp_path / "weft_top.v"  # Verilator wants the file named after the module
    copy.write_text(source.read_text())
    verilator = find("verilator")
    assert verilator is not None  # the rtl marker skips when there is none
    # ALWNEVER: Amaranth writes a constant-only `always @*` (a payload bit tied to 0); it is harmless
    result = subprocess.run([verilator.executable, "--lint-only", "-Wno-ALWNEVER", str(copy)], capture_output=True,
                            text=True, timeout=600, cwd=tmp_path, env={**os.environ, **verilator.env()})
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.parametrize("name", ["tiny", "rect"])
def test_rtl_benchmark_workload_is_a_real_matrix_product(name):
    """The `weft bench rtl` stream computes saturate(X . W^T) block by block (checked on the oracle)."""
    config = PRESETS[name]
    insns, dram, shape = gemm_stream(config, blocks=3)
    run_program(config, dram, insns)
    icb, ocb, rows = shape["icb"], shape["ocb"], shape["rows_per_block"]
    rb = {k: getattr(config, f"{k}_row_bits") // 8 for k in ("inp", "wgt", "out")}
    raw = dram.data
    # Locate the operands from the program: the first LOAD WGT, the LOAD INPs, the STOREs.
    wgt_load = next(r for r in insns if r["opcode"] == 0 and r["mem_id"] == 1)
    inp_loads = [r for r in insns if r["opcode"] == 0 and r["mem_id"] == 2]
    stores = [r for r in insns if r["opcode"] == 1 and r["x_size"]]
    w_start = int(wgt_load["dram_base"]) * rb["wgt"]
    w = unpack(raw[w_start:w_start + icb * ocb * rb["wgt"]].reshape(icb * ocb, -1), config.wgt_width)
    w = w.astype(np.int64).reshape(ocb, icb, config.block_out, config.block_in)
    for load, store in zip(inp_loads, stores, strict=True):
        x_start = int(load["dram_base"]) * rb["inp"]
        x = unpack(raw[x_start:x_start + rows * icb * rb["inp"]].reshape(rows * icb, -1), config.inp_width)
        x = x.astype(np.int64).reshape(rows, icb, config.batch, config.block_in)
        y = np.einsum("nibk,oiqk->nobq", x, w)  # (rows, ocb, batch, block_out)
        lo, hi = -(1 << (config.out_width - 1)), (1 << (config.out_width - 1)) - 1
        want = pack(np.clip(y, lo, hi).reshape(rows * ocb, -1), config.out_width).reshape(-1)
        o_start = int(store["dram_base"]) * rb["out"]
        assert np.array_equal(raw[o_start:o_start + want.size], want)
