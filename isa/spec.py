"""The machine-readable ISA spec, the C header and the Markdown table, all generated from one layout.

The JSON spec is what the compiler, the runtime and the board read; it carries the config, its hash, every
format with each field's bit range, the micro-op format, the semantics that are not visible in bit
layouts (saturation, shifts, wrap-around), the tensor intrinsic and, where the hardware generator provides
it, the register map.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from weft.isa.constants import INSN_BYTES, AluOp, MemId, Opcode
from weft.isa.encoding import layout_of
from weft.isa.layout import FORMAT_OF_OPCODE
from weft.isa.semantics import TOKEN_QUEUES

if TYPE_CHECKING:
    from weft.config import AcceleratorConfig

__all__ = ["SPEC_VERSION", "c_header", "intrinsic", "isa_spec", "markdown"]

SPEC_VERSION = 1


def _dtype(bits: int) -> str:
    return f"int{bits}"


def intrinsic(config: AcceleratorConfig) -> dict[str, Any]:
    """The tensor intrinsic: what one GEMM micro-op computes, and where its operands live."""
    c = config
    return {
        "name": f"gemm_{c.batch}x{c.block_in}x{c.block_out}",
        "shape": {"batch": c.batch, "block_in": c.block_in, "block_out": c.block_out},
        "computes": "acc[b, o] += sum_i inp[b, i] * wgt[o, i]",
        "dtypes": {
            "inp": _dtype(c.inp_width), "wgt": _dtype(c.wgt_width),
            "acc": _dtype(c.acc_width), "out": _dtype(c.out_width),
        },
        "scopes": {
            "inp": {"rows": c.inp_rows, "row_shape": [c.batch, c.block_in], "row_bits": c.inp_row_bits},
            "wgt": {"rows": c.wgt_rows, "row_shape": [c.block_out, c.block_in], "row_bits": c.wgt_row_bits},
            "acc": {"rows": c.acc_rows, "row_shape": [c.batch, c.block_out], "row_bits": c.acc_row_bits},
            "out": {"rows": c.out_rows, "row_shape": [c.batch, c.block_out], "row_bits": c.out_row_bits},
            "uop": {"rows": c.uop_rows, "row_bits": c.uop_bits},
        },
        "macs_per_cycle": c.macs_per_cycle,
    }


SEMANTICS = {
    "dma": (
        "LOAD/STORE move y_size rows of x_size elements; DRAM row y starts at dram_base + y*x_stride "
        "(in elements of the memory's row size, byte address = element * row bytes); SRAM rows are "
        "consecutive from sram_base. Loads into INP, ACC and ACC_NARROW add y_pad_0/y_pad_1 zero rows "
        "and x_pad_0/x_pad_1 zero elements per row; other loads and stores must have zero padding. "
        "x_size == 0 makes a no-op that only carries dependency flags."
    ),
    "units": (
        "load runs LOAD INP/WGT; compute runs LOAD UOP/ACC/ACC_NARROW, GEMM, ALU, FINISH; store runs "
        "STORE OUT. Each runs its own instructions in order, synchronized only by four token queues: "
        f"{', '.join(q.doc for q in TOKEN_QUEUES)}. An instruction starts when every "
        "queue it pops holds a token and every queue it pushes has room; it pushes when done."
    ),
    "loop": (
        "GEMM/ALU: for i < iter_out, j < iter_in, k in [uop_bgn, uop_end): dst = uop[k].dst + "
        "i*dst_factor_out + j*dst_factor_in, and likewise src and wgt."
    ),
    "gemm": (
        "acc[dst] = 0 if reset, inp[src] . wgt[wgt]^T if overwrite, else acc[dst] + inp[src] . wgt[wgt]^T, "
        "wrapping at acc_width (executions in order: a row written twice keeps the last); then "
        "out[dst] = saturate(acc[dst], out_width)."
    ),
    "alu": (
        "acc[dst] = op(acc[dst], imm if use_imm else inp[src] if src_inp else acc[src]), wrapping at acc_width; "
        "then out[dst] = "
        "saturate(acc[dst], out_width). SHR shifts right arithmetically by the operand's low "
        "log2(acc_width)+1 bits read as signed; a negative amount shifts left. The immediate is "
        "sign-extended. RQ (requantize) reads its operand as a signed multiplier m (the low acc_width/2+2 bits), "
        "a shift s (the next log2(acc_width)+1 bits) and a ReLU flag (the bit above): acc = (acc * m + "
        "2**(s-1)) >> s with the product exact (no rounding constant when s = 0), wrapped at acc_width, then "
        "max(acc, 0) if the flag is set. MOV sets acc to the operand. inp[src] is sign-extended; lane o of a "
        "batch row reads inp lane o mod block_in (src then counts inp rows)."
    ),
    "beside": (
        "The compute unit runs GEMM and ALU instructions in two pipes, in stream order. An instruction waits "
        "for every earlier one, but one with beside set (a last bit of the GEMM and ALU formats where the word "
        "has room) only for the earlier ones of its own kind: it may start while the other pipe's last "
        "instruction runs. Every acc row it touches (dst, and an ALU's acc src) must then lie in the other "
        "half of the accumulator (rows below acc_rows/2, or the rest) than every row that one touches, and "
        "neither may be an ALU taking its operand from inp. Results are those of stream order; an "
        "instruction pushes its tokens when done, but not before the older one beside it."
    ),
    "narrowing": "out = clip(acc, -2**(out_width-1), 2**(out_width-1)-1): saturating, never truncating.",
    "hazard": (
        "Two consecutive micro-op executions of one GEMM/ALU instruction must not write the same acc row, "
        "and an ALU execution must not read (src) the acc row the previous one wrote. An ALU instruction "
        "with op SHR, MUL or RQ (results two pipeline stages later than the other ops') keeps the same "
        "distance from the three executions before: no execution writes or reads an acc row that any of the "
        "three before it wrote."
    ),
    "finish": "FINISH ends the program; load and store must have run all their instructions before it.",
}


def isa_spec(config: AcceleratorConfig, registers: dict[str, Any] | None = None) -> dict[str, Any]:
    """The whole ISA spec for a config as JSON-ready data."""
    layout = layout_of(config)

    def fmt_json(fmt: Any) -> dict[str, Any]:
        return {
            "bits": fmt.bits,
            "used_bits": fmt.used_bits,
            "fields": [
                {"name": f.name, "lsb": f.lsb, "msb": f.msb, "width": f.width, "signed": f.signed,
                 "doc": f.doc}
                for f in fmt.fields
            ],
        }

    spec: dict[str, Any] = {
        "spec_version": SPEC_VERSION,
        "config": config.to_dict(),
        "config_hash": config.hash,
        "bitstream_name": config.bitstream_name,
        "insn_bits": layout.insn_bits,
        "opcodes": {op.name: int(op) for op in Opcode},
        "mem_ids": {m.name: int(m) for m in MemId},
        "alu_ops": {a.name: int(a) for a in AluOp},
        "formats": {name: fmt_json(fmt) for name, fmt in layout.formats.items()},
        "format_of_opcode": {Opcode(op).name: name for op, name in FORMAT_OF_OPCODE.items()},
        "uop": fmt_json(layout.uop),
        "semantics": SEMANTICS,
        "intrinsic": intrinsic(config),
    }
    if registers is not None:
        spec["registers"] = registers
    return spec


def c_header(config: AcceleratorConfig, registers: dict[str, Any] | None = None) -> str:
    """A C header for bare-metal drivers: config values, enums, and LSB/WIDTH of every field."""
    layout = layout_of(config)
    c = config
    lines = [
        f"/* Generated by weft from config '{c.name}' (hash {c.hash}). Do not edit. */",
        f"#ifndef WEFT_SPEC_{c.hash.upper()}_H",
        f"#define WEFT_SPEC_{c.hash.upper()}_H",
        "",
        f'#define WEFT_CONFIG_HASH "{c.hash}"',
        f'#define WEFT_BITSTREAM_NAME "{c.bitstream_name}"',
        f"#define WEFT_INSN_BITS {layout.insn_bits}",
        f"#define WEFT_INSN_BYTES {INSN_BYTES}",
        f"#define WEFT_UOP_BITS {c.uop_bits}",
    ]
    for key, value in c.hw_dict().items():
        if key != "clock_mhz":
            lines.append(f"#define WEFT_{key.upper()} {value}")
    lines.append(f"#define WEFT_CLOCK_KHZ {round(c.clock_mhz * 1000)}")
    for mem in ("uop", "inp", "wgt", "acc", "out"):
        lines.append(f"#define WEFT_{mem.upper()}_ROWS {getattr(c, f'{mem}_rows')}")
    lines.append("")
    for prefix, enum in (("OPCODE", Opcode), ("MEM", MemId), ("ALU", AluOp)):
        for member in enum:
            lines.append(f"#define WEFT_{prefix}_{member.name} {int(member)}")
    lines.append("")
    for fmt in [*layout.formats.values(), layout.uop]:
        for f in fmt.fields:
            stem = f"WEFT_{fmt.name.upper()}_{f.name.upper()}"
            lines.append(f"#define {stem}_LSB {f.lsb}")
            lines.append(f"#define {stem}_WIDTH {f.width}")
    if registers:
        lines.append("")
        for reg in registers.get("registers", []):
            lines.append(f"#define WEFT_REG_{reg['name'].upper()} 0x{reg['offset']:04x}")
            for f in reg.get("fields", []):
                stem = f"WEFT_REG_{reg['name'].upper()}_{f['name'].upper()}"
                lines.append(f"#define {stem}_LSB {f['lsb']}")
                lines.append(f"#define {stem}_WIDTH {f['width']}")
        for name, err in registers.get("error_codes", {}).items():
            lines.append(f"#define WEFT_ERR_{name.upper()} {err['code']}")
    lines += ["", "#endif", ""]
    return "\n".join(lines)


def markdown(config: AcceleratorConfig) -> str:
    """Markdown tables of every format (for docs and reviews)."""
    layout = layout_of(config)
    out = [
        f"# weft ISA for config `{config.name}` (hash `{config.hash}`)",
        "",
        f"Instructions are {layout.insn_bits} bits; micro-ops are {config.uop_bits} bits. "
        f"GEMM intrinsic {config.batch}x{config.block_in}x{config.block_out}, "
        f"int{config.inp_width} x int{config.wgt_width} -> int{config.acc_width}, out int{config.out_width}.",
        "",
    ]
    for fmt in [*layout.formats.values(), layout.uop]:
        out += [f"## {fmt.name.upper()} ({fmt.used_bits} of {fmt.bits} bits)", "",
                "| bits | field | width | meaning |", "|---|---|---|---|"]
        for f in fmt.fields:
            bits = f"[{f.msb}:{f.lsb}]" if f.width > 1 else f"[{f.lsb}]"
            out.append(f"| {bits} | {f.name}{' (signed)' if f.signed else ''} | {f.width} | {f.doc} |")
        out.append("")
    out += ["## Semantics", ""] + [f"- **{k}**: {v}" for k, v in SEMANTICS.items()] + [""]
    return "\n".join(out)
