"""The main demo job.

Until the compiler lands, it assembles a small GEMM + ALU program (a tiled int8 matrix multiply followed
by a requantizing ReLU on the ALU), runs it on the functional simulator, checks it against numpy and
prints what it did.
"""

from __future__ import annotations

import time

import numpy as np

from weft.config import AcceleratorConfig
from weft.isa import MemId, ProgramBuilder, disassemble, encode_uops, uops_from

__all__ = ["build_matmul_relu", "run_demo"]


def _pack_rows(values: np.ndarray, width: int) -> bytes:
    """Little-endian bit-pack signed integers (last axis = elements of a row) into bytes."""
    flat = values.astype(np.int64).reshape(-1) & ((1 << width) - 1)
    bits = ((flat[:, None] >> np.arange(width)) & 1).astype(np.uint8).reshape(-1)
    return np.packbits(bits, bitorder="little").tobytes()


def build_matmul_relu(config: AcceleratorConfig, seed: int = 0, m_blocks: int = 4, k_blocks: int = 2,
                      n_blocks: int = 2, shift: int = 6):
    """A tiled C = relu((A @ W^T) >> shift) program, its DRAM image and the numpy reference.

    Returns (insns, dram_bytes, layout, expected) where layout gives the byte addresses of each region.
    """
    c = config
    rng = np.random.default_rng(seed)
    lo_i, hi_i = -(1 << (c.inp_width - 1)), (1 << (c.inp_width - 1))
    lo_w, hi_w = -(1 << (c.wgt_width - 1)), (1 << (c.wgt_width - 1))
    a = rng.integers(lo_i, hi_i, size=(m_blocks, c.batch, k_blocks * c.block_in))
    w = rng.integers(lo_w, hi_w, size=(n_blocks * c.block_out, k_blocks * c.block_in))

    # Packed layouts: inp rows (m, kb) of (batch, block_in); wgt rows (nb, kb) of (block_out, block_in).
    inp_rows = a.reshape(m_blocks, c.batch, k_blocks, c.block_in).transpose(0, 2, 1, 3)
    wgt_rows = w.reshape(n_blocks, c.block_out, k_blocks, c.block_in).transpose(0, 2, 1, 3)
    # Micro-ops enumerate the output tiles; the reduction over k-blocks is the outer loop, so two
    # consecutive uops never write the same accumulator row.
    uops = uops_from(
        (m * n_blocks + n, m * k_blocks, n * k_blocks) for m in range(m_blocks) for n in range(n_blocks)
    )
    n_uops = len(uops)
    uop_bytes = encode_uops(c, uops)
    inp_bytes = _pack_rows(inp_rows, c.inp_width)
    wgt_bytes = _pack_rows(wgt_rows, c.wgt_width)

    # DRAM map: each region aligned to its row size so element addresses are exact.
    row_bytes = {"uop": c.uop_bits // 8, "inp": c.inp_row_bits // 8, "wgt": c.wgt_row_bits // 8,
                 "out": c.out_row_bits // 8}
    layout, cursor = {}, 0
    for name, size in (("uop", len(uop_bytes)), ("inp", len(inp_bytes)), ("wgt", len(wgt_bytes)),
                       ("out", n_uops * row_bytes["out"])):
        align = max(row_bytes[name], 64)
        cursor = -(-cursor // align) * align
        layout[name] = cursor
        cursor += size
    insn_addr = -(-cursor // 64) * 64

    p = ProgramBuilder()
    p.load(MemId.UOP, sram=0, dram=layout["uop"] // row_bytes["uop"], y=1, x=n_uops)
    p.load(MemId.WGT, sram=0, dram=layout["wgt"] // row_bytes["wgt"], y=1, x=n_blocks * k_blocks)
    p.load(MemId.INP, sram=0, dram=layout["inp"] // row_bytes["inp"], y=1, x=m_blocks * k_blocks,
           deps=["push_next"])
    p.gemm(0, n_uops, reset=True, deps=["pop_prev"])
    p.gemm(0, n_uops, iter_out=k_blocks, src=(1, 0), wgt=(1, 0))
    # The ALU walks all output rows with one uop (uop 0 is row 0) and a loop: dst and src step together.
    p.alu("shr", 0, 1, iter_out=n_uops, dst=(1, 0), src=(1, 0), imm=shift)
    p.alu("max", 0, 1, iter_out=n_uops, dst=(1, 0), src=(1, 0), imm=0, deps=["push_next"])
    p.store(sram=0, dram=layout["out"] // row_bytes["out"], y=1, x=n_uops, deps=["pop_prev", "push_prev"])
    p.load(MemId.UOP, sram=0, dram=0, y=0, x=0, deps=["pop_next"])  # sync: wait for the store
    p.finish()

    acc = np.einsum("mbk,nk->mbn", a, w)
    expected = np.clip(np.maximum(acc >> shift, 0), -(1 << (c.out_width - 1)), (1 << (c.out_width - 1)) - 1)
    dram = bytearray(insn_addr + 16 * (len(p) + 1))
    dram[layout["uop"]:layout["uop"] + len(uop_bytes)] = uop_bytes
    dram[layout["inp"]:layout["inp"] + len(inp_bytes)] = inp_bytes
    dram[layout["wgt"]:layout["wgt"] + len(wgt_bytes)] = wgt_bytes
    layout["insn"] = insn_addr
    return p.insns, bytes(dram), layout, expected


def _unpack_out(config: AcceleratorConfig, data: np.ndarray, rows: int) -> np.ndarray:
    w = config.out_width
    bits = np.unpackbits(np.asarray(data, dtype=np.uint8), bitorder="little")
    count = rows * config.batch * config.block_out
    vals = bits[: count * w].reshape(count, w).astype(np.int64) @ (1 << np.arange(w))
    vals = np.where(vals >= (1 << (w - 1)), vals - (1 << w), vals)
    return vals.reshape(rows, config.batch, config.block_out)


def run_demo(config: AcceleratorConfig, seed: int = 0) -> int:
    """Print the program, run it on the functional simulator, check it against numpy."""
    from weft.isa import encode_insns
    from weft.sim.fsim import Dram, FunctionalSimulator

    c = config
    m_blocks, k_blocks, n_blocks = 4, 2, 2
    insns, image, layout, expected = build_matmul_relu(c, seed, m_blocks, k_blocks, n_blocks)
    words = encode_insns(c, insns)
    dram = Dram(len(image))
    dram.write(0, image)
    dram.write(layout["insn"], words)
    print(f"weft demo: config '{c.name}' ({c.batch}x{c.block_in}x{c.block_out} int{c.inp_width}"
          f"xint{c.wgt_width}->int{c.acc_width}, hash {c.hash})")
    print(f"C[{m_blocks * c.batch}x{n_blocks * c.block_out}] = relu((A[{m_blocks * c.batch}x"
          f"{k_blocks * c.block_in}] @ W^T) >> 6) as {len(insns)} instructions "
          f"({len(words)} bytes):\n")
    for i, line in enumerate(disassemble(insns).splitlines()):
        print(f"  {i:3d}  {line}")
    sim = FunctionalSimulator(c)
    start = time.perf_counter()
    stats = sim.run(dram, layout["insn"], len(insns))
    elapsed = time.perf_counter() - start
    n_rows = m_blocks * n_blocks
    out_bytes = n_rows * c.out_row_bits // 8
    got = _unpack_out(c, dram.read(layout["out"], out_bytes), n_rows)
    want = expected.reshape(m_blocks, c.batch, n_blocks, c.block_out)
    want = want.transpose(0, 2, 1, 3).reshape(n_rows, c.batch, c.block_out)
    match = bool(np.array_equal(got, want))
    print(f"\nfunctional simulator: {elapsed * 1e3:.2f} ms")
    print(f"  instructions: {dict(stats['insns'])}")
    print(f"  bytes moved:  {dict(stats['bytes'])}")
    print(f"  MACs: {stats['macs']}   ALU element ops: {stats['alu_ops']}")
    print(f"  result vs numpy int32 reference: {'bit-exact' if match else 'MISMATCH'}")
    return 0 if match else 1
