"""The hardware's structure constants that its timing follows from: burst length, queue depths, pipeline
depths.

Amaranth-free, like :mod:`weft.hw.regs`: the hardware modules take their defaults from here and the timing
model (:class:`weft.sim.timing.Microarch`) its costs, so the two cannot drift apart.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ACCUMULATE_STAGES", "ALU_READ_STAGES", "ALU_SRC_INTERVAL", "ALU_STAGES", "COMPUTE_STAGES",
           "FETCH_DECODE_CYCLES", "FETCH_OUT_CYCLES", "GEMM_LATENCY", "MAX_BURST", "READER_BEATS", "SRC_ROWS",
           "STORE_LEN_DEPTH", "STORE_READ_STAGES", "STORE_SEG_DEPTH", "UNPACK_DEPTH", "holds_src_rows"]

#: Beats per burst: the Zynq-7000 HP ports are AXI3 (16 beats); longer bursts only get split there.
MAX_BURST = 16
#: dma.BurstReader: beats a reader may have requested and not yet consumed.
READER_BEATS = 64
#: dma.Load2D: DRAM rows a load may request ahead of the row it writes.
UNPACK_DEPTH = 8
#: dma.Store2D: DRAM rows a store may address ahead of the row it packs.
STORE_SEG_DEPTH = 4
#: dma.Store2D: write bursts addressed ahead of their data.
STORE_LEN_DEPTH = 8
#: dma.Store2D: cycles from an SRAM read to its data entering the row queue: the block RAM's read, then the
#: data registered (the out block RAM's output and its bank multiplexer into the queue's LUT RAM was one of
#: tiny's last paths failing 100 MHz after nextpnr at 7f7d656).
STORE_READ_STAGES = 2
#: fetch, a bus narrower than an instruction: cycles from the word's last beat to its dispatch at the
#: earliest (the word registered as the beat lands, then its checks and the SRAM range check's sums, its
#: multiply, its compare, each registered).
FETCH_DECODE_CYCLES = 4
#: fetch: cycles from its dispatch verdict to the command queue's write (the word leaves through a register
#: of its own: the verdict through the queues' write enables into their levels was tiny's longest path).
FETCH_OUT_CYCLES = 1
#: datapath.GemmCore: its operands registered as read (no block RAM output straight into a multiplier), the
#: products, then the adder tree, registered halfway and at its root: the GEMM pipe's stages C, P, D and E.
GEMM_LATENCY = 4
#: compute, the ALU pipe: its operands' reads (inp[src] and acc[src] in C, acc[dst] in D, registered in E).
ALU_READ_STAGES = 3
#: compute, the GEMM pipe after the core: acc + sum (X), registered (Y).
ACCUMULATE_STAGES = 2
#: compute, the ALU pipe after its operands' reads: X (every op but SHR's right shift, MUL and RQ; their
#: partial products), Y (the products' sums, the right shift's longest steps), Z (the rest of the shift, RQ's
#: ReLU). SHR's, MUL's and RQ's results come two stages after the others': spec "hazard" keeps an execution
#: of one of them from the rows of the three before it (weft.isa.semantics.hazard_reach).
ALU_STAGES = 3
#: compute's stages around those of either pipe: loop generator, micro-op word (registered as it leaves the
#: block RAM), row indices and read addresses, write back.
COMPUTE_STAGES = 4
#: compute: cycles between issues of an ALU micro-op that reads acc[src]. The accumulator has one read port
#: (two would make Yosys duplicate its block RAMs), so dst and src are read in two cycles, as in VTA's ALU.
ALU_SRC_INTERVAL = 2
#: compute: acc[src] rows kept in registers per ALU instruction. When every execution of a micro-op reads the
#: same src row (no src loop factor) and the instruction has at most this many micro-ops, only the first
#: sweep reads them: a requantization's per-channel vectors cost the read port once per instruction.
SRC_ROWS = 8


def holds_src_rows(src_factor_out: Any, src_factor_in: Any, uops: Any) -> Any:
    """Whether an ALU instruction reading acc[src] keeps its src rows in registers after the first sweep:
    no src loop factor (each micro-op reads one row throughout) and at most SRC_ROWS micro-ops. On ints for
    the timing model, on Amaranth values for the hardware: the one statement of the rule for both."""
    return (src_factor_out == 0) & (src_factor_in == 0) & (uops <= SRC_ROWS)
