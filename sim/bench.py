"""Benchmark of the functional simulator on a convolution-shaped workload.

The workload is one 3x3 convolution, stride 1, zero padding 1 (default 56x56, 64 -> 64 channels, the
middle layers of ResNet-18), followed by a requantizing ReLU (ALU SHR then MAX 0, saturated to out_width
on the way out). The output is cut into square tiles of T x T pixels; per tile:

* load: one LOAD INP of the (T+2) x (T+2) x in-channel-blocks input window, zero padding made by the DMA
  at the image border, into one half of the input buffer (double buffering);
* compute: GEMM reset, then one GEMM whose micro-ops enumerate (kh, kw, in-channel block, output column)
  with the loops over output-channel blocks (outer) and output rows (inner), then the two ALU ops;
* store: one strided STORE of the tile's T x T x out-channel-blocks rows.

Tokens make load, compute and store overlap across tiles (each SRAM half is released by a token), and the
result is checked against a plain numpy convolution in the same run.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np

from weft.config import AcceleratorConfig, load_config
from weft.errors import UsageError
from weft.isa import MemId, ProgramBuilder, encode_insns, encode_uops, uops_from
from weft.isa.arith import pack, wrap
from weft.isa.constants import INSN_BYTES
from weft.isa.semantics import named_row_bytes
from weft.sim.dram import Dram
from weft.sim.fsim import FunctionalSimulator, insn_region

__all__ = ["ConvWorkload", "bench_fsim", "conv_workload"]


class ConvWorkload:
    """A conv program, its DRAM image and the expected output (see the module docstring)."""

    def __init__(self, insns: np.ndarray, dram: Dram, insn_addr: int, out_addr: int, expected: bytes,
                 macs: int, description: dict[str, Any]):
        self.insns, self.dram, self.insn_addr = insns, dram, insn_addr
        self.out_addr, self.expected, self.macs, self.description = out_addr, expected, macs, description

    def output(self) -> bytes:
        return self.dram.read(self.out_addr, len(self.expected)).tobytes()


def _tile_size(c: AcceleratorConfig, size: int, icb: int, ocb: int) -> int:
    """The largest tile edge T (dividing `size`) whose buffers fit twice in the SRAMs."""
    for t in sorted((d for d in range(2, size + 1) if size % d == 0), reverse=True):
        uops = t + 9 * icb * t
        if ((t + 2) ** 2 * icb <= c.inp_rows // 2 and t * t * ocb <= c.acc_rows // 2
                and 2 * uops <= c.uop_rows and t * ocb < c.acc_rows):
            return t
    raise UsageError(f"config '{c.name}': no tile of the {size}x{size} image fits the buffers")


def _auto_channels(c: AcceleratorConfig) -> int:
    """64 channels, or fewer (a multiple of both blocks) when the weights or padding do not fit."""
    channels = 64
    while channels > max(c.block_in, c.block_out):
        icb, ocb = channels // c.block_in, channels // c.block_out
        if 9 * icb * ocb <= c.wgt_rows and icb <= 15:
            break
        channels //= 2
    return max(channels, c.block_in, c.block_out)


def _expected_rows(c: AcceleratorConfig, x: np.ndarray, w: np.ndarray, shift: int) -> bytes:
    """The output rows the program must store: im2col in float64 (exact for these sizes), then the
    requantizing ReLU, packed as the out rows (H, W, ocb) of (batch, block_out)."""
    batch, size, _, channels = x.shape
    xp = np.pad(x, ((0, 0), (1, 1), (1, 1), (0, 0))).astype(np.float64)
    cols = np.stack([xp[:, kh:kh + size, kw:kw + size, :] for kh in range(3) for kw in range(3)], axis=3)
    acc = cols.reshape(-1, 9 * channels) @ w.transpose(2, 3, 1, 0).reshape(9 * channels, channels)
    acc = wrap(acc.astype(np.int64), c.acc_width).reshape(batch, size, size, channels)
    out = np.clip(np.maximum(acc >> shift, 0), -(1 << (c.out_width - 1)), (1 << (c.out_width - 1)) - 1)
    rows = out.reshape(batch, size, size, channels // c.block_out, c.block_out).transpose(1, 2, 3, 0, 4)
    return pack(rows.reshape(-1, batch * c.block_out), c.out_width).tobytes()


def conv_workload(config: AcceleratorConfig, size: int = 56, channels: int | None = None, shift: int = 8,
                  seed: int = 0, buffers: int = 2) -> ConvWorkload:
    """Build the conv program (size x size x channels -> channels, 3x3) for `config`.

    `buffers` is 2 for double buffering; 1 uses one SRAM half for every tile, so tokens serialize
    load, compute and store tile by tile (same result, no overlap).
    """
    if buffers not in (1, 2):
        raise UsageError(f"buffers must be 1 or 2, got {buffers}")
    c = config
    channels = channels or _auto_channels(c)
    if channels % c.block_in or channels % c.block_out:
        raise UsageError(f"{channels} channels are not a multiple of block_in and block_out")
    icb, ocb, batch = channels // c.block_in, channels // c.block_out, c.batch
    if 9 * icb * ocb > c.wgt_rows or icb > 15:
        raise UsageError(f"config '{c.name}': {channels} channels do not fit the weight buffer")
    t = _tile_size(c, size, icb, ocb)
    rng = np.random.default_rng(seed)
    x = rng.integers(-(1 << (c.inp_width - 1)), 1 << (c.inp_width - 1), (batch, size, size, channels))
    w = rng.integers(-(1 << (c.wgt_width - 1)), 1 << (c.wgt_width - 1), (channels, channels, 3, 3))

    # DRAM rows: inp (H, W, icb) of (batch, block_in); wgt (ocb, kh, kw, icb) of (block_out, block_in);
    # out (H, W, ocb) of (batch, block_out).
    inp_rows = x.reshape(batch, size, size, icb, c.block_in).transpose(1, 2, 3, 0, 4)
    wgt_rows = w.reshape(ocb, c.block_out, icb, c.block_in, 3, 3).transpose(0, 4, 5, 2, 1, 3)
    inp_bytes = pack(inp_rows.reshape(-1, batch * c.block_in), c.inp_width)
    wgt_bytes = pack(wgt_rows.reshape(-1, c.block_out * c.block_in), c.wgt_width)
    rb = named_row_bytes(c)

    # Micro-ops, one set per SRAM half: reset/ALU walk the tile's accumulator rows, conv enumerates
    # (kh, kw, ic block, column) so two consecutive executions never write one row.
    acc_half, inp_half = t * t * ocb, (t + 2) ** 2 * icb
    tables, bases = [], []
    for half in range(2):
        bases.append(sum(len(u) for u in tables))
        tables.append(uops_from((half * acc_half + col * ocb, 0, 0) for col in range(t)))
        bases.append(sum(len(u) for u in tables))
        tables.append(uops_from(
            (half * acc_half + col * ocb, half * inp_half + (kh * (t + 2) + col + kw) * icb + ic,
             (kh * 3 + kw) * icb + ic)
            for kh in range(3) for kw in range(3) for ic in range(icb) for col in range(t)))
    uops = np.concatenate(tables)
    uop_bytes = encode_uops(c, uops)

    out_rows = size * size * ocb
    sizes = {"uop": len(uop_bytes), "inp": inp_bytes.size, "wgt": wgt_bytes.size, "out": out_rows * rb["out"]}
    addr, top = {}, 0
    for name, nbytes in sizes.items():
        align = max(64, rb[name])  # element addresses count rows, so regions start on a row boundary
        top = -(-top // align) * align
        addr[name] = top
        top += nbytes

    p = ProgramBuilder()
    p.load(MemId.WGT, 0, addr["wgt"] // rb["wgt"], 1, 9 * icb * ocb)
    tiles = [(ty, tx) for ty in range(0, size, t) for tx in range(0, size, t)]
    n = len(tiles)
    p.load(MemId.UOP, 0, addr["uop"] // rb["uop"], 1, len(uops))
    for k, (ty, tx) in enumerate(tiles):
        half, reuse, again = k % buffers, k >= buffers, k + buffers < n
        top_pad, bottom_pad = int(ty == 0), int(ty + t == size)
        left_pad, right_pad = int(tx == 0), int(tx + t == size)
        y0, x0 = ty - 1 + top_pad, tx - 1 + left_pad
        rows, cols = t + 2 - top_pad - bottom_pad, t + 2 - left_pad - right_pad
        window = addr["inp"] // rb["inp"] + (y0 * size + x0) * icb
        p.load(MemId.INP, half * inp_half, window, rows, cols * icb,
               stride=size * icb, pad=(top_pad, bottom_pad, left_pad * icb, right_pad * icb),
               deps=["push_next"] + (["pop_next"] if reuse else []))
        reset, conv = bases[2 * half], bases[2 * half + 1]
        loops = {"iter_out": ocb, "iter_in": t, "dst": (1, t * ocb)}
        p.gemm(reset, reset + t, reset=True, deps=["pop_prev"] + (["pop_next"] if reuse else []), **loops)
        p.gemm(conv, conv + 9 * icb * t, src=(0, (t + 2) * icb), wgt=(9 * icb, 0),
               deps=["push_prev"] if again else [], **loops)
        p.alu("shr", reset, reset + t, imm=shift, **loops)
        p.alu("max", reset, reset + t, imm=0, deps=["push_next"], **loops)
        p.store(half * acc_half, addr["out"] // rb["out"] + (ty * size + tx) * ocb, t, t * ocb,
                stride=size * ocb, deps=["pop_prev", "push_prev"])
    for _ in range(min(n, buffers)):  # collect the last stores' tokens: FINISH comes after every store
        p.load(MemId.UOP, 0, 0, 0, 0, deps=["pop_next"])
    p.finish()
    insns = p.insns

    dram = Dram(-(-top // 64) * 64 + len(insns) * INSN_BYTES + 64)
    dram.write(addr["uop"], uop_bytes)
    dram.write(addr["inp"], inp_bytes)
    dram.write(addr["wgt"], wgt_bytes)

    expected = _expected_rows(c, x, w, shift)
    macs = batch * size * size * channels * channels * 9
    description = {
        "op": "conv2d 3x3 stride 1 pad 1 + requantizing ReLU (ALU shr, max)",
        "input": [batch, size, size, channels], "output": [batch, size, size, channels],
        "tile": [t, t], "tiles": n, "instructions": len(insns), "uops": len(uops),
        "gemm_executions_per_tile": 9 * icb * t * t * ocb,
    }
    return ConvWorkload(insns, dram, insn_region(dram.size, len(insns)), addr["out"], expected, macs,
                        description)


def bench_fsim(config: str | AcceleratorConfig = "default", seconds: float = 2.0, repeat: int | None = None,
               model: str | None = None, size: int = 56, channels: int | None = None) -> dict[str, Any]:
    """Run the conv workload on the functional simulator for about `seconds` (or `repeat` times) and
    return JSON-ready figures: ``macs_per_s`` (median run; ``best_macs_per_s`` for the fastest), the
    workload, the config. The first run's output is checked against numpy; a mismatch raises."""
    if model is not None:
        raise UsageError("the fsim benchmark runs a fixed conv workload; it takes no model")
    c = load_config(config)
    work = conv_workload(c, size=size, channels=channels)
    work.dram.write(work.insn_addr, encode_insns(c, work.insns))
    sim = FunctionalSimulator(c)
    times: list[float] = []
    stats: dict[str, Any] = {}
    begin = time.perf_counter()
    while not times or (len(times) < repeat if repeat else time.perf_counter() - begin < seconds):
        start = time.perf_counter()
        stats = sim.run(work.dram, work.insn_addr, len(work.insns))
        times.append(time.perf_counter() - start)
        if len(times) == 1:
            verified = work.output() == work.expected
            if not verified:
                raise RuntimeError(f"functional simulator result differs from numpy on config '{c.name}'")
    if stats["macs"] != work.macs:
        raise RuntimeError(f"stats count {stats['macs']} MACs, the workload has {work.macs}")
    median, best = statistics.median(times), min(times)
    return {
        "bench": "fsim",
        "config": c.to_dict(),
        "config_hash": c.hash,
        "workload": work.description,
        "macs": work.macs,
        "runs": len(times),
        "seconds": sum(times),
        "seconds_per_run": median,
        "macs_per_s": work.macs / median,
        "best_macs_per_s": work.macs / best,
        "insns": stats["insns"],
        "verified": verified,
    }


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(bench_fsim(sys.argv[1] if len(sys.argv) > 1 else "default"), indent=2))
