"""The ISA: layouts fit, encode/decode round trips, assembler, spec outputs."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from weft.config import PRESETS
from weft.isa import (
    INSN_DTYPE,
    AluOp,
    AsmError,
    EncodeError,
    MemId,
    Opcode,
    assemble,
    c_header,
    decode_insns,
    decode_uops,
    disassemble,
    encode_insns,
    encode_uops,
    isa_spec,
    layout_of,
    make_insns,
    markdown,
)
from weft.isa.layout import FORMAT_OF_OPCODE

from .test_config import configs


def _random_program(config, rng: np.random.Generator, count: int) -> np.ndarray:
    """Random instructions with every field inside its range (and only the fields of its format)."""
    layout = layout_of(config)
    insns = make_insns(count)
    opcodes = rng.choice([int(op) for op in Opcode], size=count)
    insns["opcode"] = opcodes
    for i, op in enumerate(opcodes):
        fmt = layout.formats[FORMAT_OF_OPCODE[Opcode(op)]]
        for f in fmt.fields:
            if f.name != "opcode":
                insns[i][f.name] = int(rng.integers(f.min, f.max, endpoint=True))
    return insns


@settings(max_examples=60, deadline=None)
@given(configs(), st.integers(0, 2**32 - 1))
def test_encode_decode_round_trip_on_random_configs(config, seed):
    assume(config is not None)
    layout = layout_of(config)
    for fmt in [*layout.formats.values(), layout.uop]:
        assert fmt.used_bits <= fmt.bits
        ends = [f.lsb + f.width for f in fmt.fields]
        assert [f.lsb for f in fmt.fields[1:]] == ends[:-1]  # contiguous, no overlap
    rng = np.random.default_rng(seed)
    insns = _random_program(config, rng, 64)
    words = encode_insns(config, insns)
    assert len(words) == 64 * layout.insn_bits // 8
    assert np.array_equal(decode_insns(config, words), insns)
    uops = np.zeros(32, dtype=decode_uops(config, b"").dtype)
    for f in layout.uop.fields:
        uops[f.name] = rng.integers(0, f.max, size=32, endpoint=True)
    assert np.array_equal(decode_uops(config, encode_uops(config, uops)), uops)


def test_field_extremes_and_signed_immediate():
    c = PRESETS["default"]
    insns = assemble("ALU add uop=0:1 iter=1x1 dst=0,0 src=0,0 imm=-32768\nALU add uop=0:1 imm=32767")
    again = decode_insns(c, encode_insns(c, insns))
    assert list(again["imm"]) == [-32768, 32767]
    with pytest.raises(EncodeError, match=r"instruction 0: field 'imm'"):
        encode_insns(c, assemble("ALU add uop=0:1 imm=40000"))
    with pytest.raises(EncodeError, match=r"instruction 1: field 'y_pad_0'"):
        encode_insns(c, assemble("FINISH\nLOAD inp sram=0 dram=0 y=1 x=1 pad=16,0,0,0"))
    bad = make_insns(1)
    bad["opcode"] = Opcode.FINISH
    bad["reset"] = 1
    with pytest.raises(EncodeError, match="FINISH instructions have no 'reset'"):
        encode_insns(c, bad)
    bad["opcode"] = 7
    with pytest.raises(EncodeError, match="unknown opcode 7"):
        encode_insns(c, bad)


def test_default_layout_matches_vta_widths():
    layout = layout_of(PRESETS["default"])
    gemm = layout.formats["gemm"]
    assert gemm.field("uop_bgn").width == 13 and gemm.field("uop_end").width == 14
    assert gemm.field("dst_factor_out").width == 11 and gemm.field("wgt_factor_in").width == 10
    assert [f.name for f in layout.uop.fields] == ["dst", "src", "wgt"]
    assert [f.width for f in layout.uop.fields] == [11, 11, 10]
    assert layout.formats["mem"].field("x_pad_1").width == 4


def _encode_one(config, insn: np.void) -> bytes:
    """One instruction, bit by bit with Python integers: the reference the vectorized encoder must equal."""
    layout = layout_of(config)
    word = 0
    for f in layout.formats[FORMAT_OF_OPCODE[Opcode(int(insn["opcode"]))]].fields:
        word |= (int(insn[f.name]) & ((1 << f.width) - 1)) << f.lsb
    return word.to_bytes(layout.insn_bits // 8, "little")


@pytest.mark.parametrize("name", ["default", "zcu104"])
def test_vectorized_encoder_equals_the_scalar_reference_on_a_large_stream(name):
    """Thousands of random instructions (every opcode, fields up to their extremes; the compiler emits
    streams this long) encode to the same words as one instruction at a time, 64-bit word crossings
    and signed fields included."""
    c = PRESETS[name]
    insns = _random_program(c, np.random.default_rng(1), 5000)
    words = encode_insns(c, insns)
    assert words == b"".join(_encode_one(c, insn) for insn in insns)
    assert np.array_equal(decode_insns(c, words), insns)


SOURCE = """\
# a small program
LOAD uop sram=0 dram=0 y=1 x=4
LOAD inp sram=0 dram=16 y=2 x=4 stride=8 pad=1,1,0,2 deps=push_next
GEMM uop=0:4 iter=2x3 dst=4,1 src=8,1 wgt=0,0 reset deps=pop_prev,push_next   ; trailing comment
ALU max uop=0:4 iter=2x3 dst=4,1 src=8,1 imm=-3
ALU mul uop=1:2 iter=1x1 dst=0,0 src=1,0
ALU max uop=0:4 iter=1x1 dst=0,0 src=0,0 inp
STORE out sram=0 dram=0 y=2 x=4 stride=4 deps=pop_prev,push_prev
FINISH deps=pop_next
"""


def test_assembler_round_trip():
    insns = assemble(SOURCE)
    assert len(insns) == 8
    assert insns[1]["mem_id"] == MemId.INP and insns[1]["x_pad_1"] == 2
    assert insns[3]["alu_op"] == AluOp.MAX and insns[3]["use_imm"] == 1
    assert insns[4]["use_imm"] == 0 and insns[4]["src_inp"] == 0
    assert insns[5]["src_inp"] == 1 and insns[5]["use_imm"] == 0
    text = disassemble(insns)
    assert np.array_equal(assemble(text), insns)
    assert disassemble(assemble(text)) == text
    c = PRESETS["tiny"]
    assert np.array_equal(decode_insns(c, encode_insns(c, insns)), insns)


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ("JUMP 3", "unknown instruction 'JUMP'"),
        ("LOAD foo sram=0", "unknown MemId 'foo'"),
        ("ALU div uop=0:1", "unknown AluOp 'div'"),
        ("GEMM uop=0:1 imm=3", "GEMM takes no 'imm'"),
        ("GEMM uop=0", "'uop' expects 2 values"),
        ("FINISH deps=pop_sideways", "unknown dependency flag 'pop_sideways'"),
        ("LOAD inp sram=x", "not an integer"),
    ],
)
def test_assembler_errors_name_the_line(line, words):
    with pytest.raises(AsmError) as err:
        assemble("FINISH\n\n" + line)
    assert err.value.line == 3 and words in str(err.value)


def test_spec_outputs_describe_every_field():
    c = PRESETS["default"]
    spec = isa_spec(c)
    json.dumps(spec)
    assert spec["config_hash"] == c.hash and spec["insn_bits"] == 128
    gemm = {f["name"]: f for f in spec["formats"]["gemm"]["fields"]}
    assert gemm["uop_bgn"]["lsb"] == 8 and gemm["uop_bgn"]["msb"] == 20
    assert spec["intrinsic"]["shape"] == {"batch": 1, "block_in": 16, "block_out": 16}
    assert spec["intrinsic"]["scopes"]["wgt"]["rows"] == 1024
    header = c_header(c)
    assert f'#define WEFT_CONFIG_HASH "{c.hash}"' in header
    assert "#define WEFT_GEMM_UOP_BGN_LSB 8" in header and "#define WEFT_ALU_IMM_WIDTH 16" in header
    md = markdown(c)
    assert "| [20:8] | uop_bgn | 13 |" in md


def test_insn_dtype_has_every_field_of_every_format():
    layout = layout_of(PRESETS["zcu104"])
    for fmt in layout.formats.values():
        for f in fmt.fields:
            assert f.name in INSN_DTYPE.names


def test_the_hazard_rule_names_the_first_execution_that_breaks_it():
    from weft.isa.semantics import Hazard, first_hazard, hazard_reach

    rows = np.array
    assert first_hazard(rows([0, 1, 0, 1])) is None  # a row revisited two executions on is fine
    assert first_hazard(rows([0, 1, 1, 2])) == Hazard("write", 2, 1)
    # an ALU operand from acc: reading the row the previous execution wrote; the earliest hit is reported
    assert first_hazard(rows([0, 1, 2]), rows([5, 0, 9])) == Hazard("read", 1, 1)
    assert first_hazard(rows([0, 0, 2]), rows([5, 6, 0])) == Hazard("write", 1, 1)
    assert first_hazard(rows([0, 1, 1]), rows([5, 0, 9])) == Hazard("read", 1, 1)
    # both at one execution: the write is named
    assert first_hazard(rows([3, 3]), rows([0, 3])) == Hazard("write", 1, 1)
    assert first_hazard(rows([3]), rows([3])) is None
    # SHR, MUL and RQ: the executions two and three before count too, the nearer one first
    assert [hazard_reach(Opcode.ALU, op) for op in AluOp] == [1, 1, 1, 3, 3, 3, 1]
    assert hazard_reach(Opcode.GEMM) == 1
    assert first_hazard(rows([0, 1, 0, 1]), reach=2) == Hazard("write", 2, 2)
    assert first_hazard(rows([0, 1, 2]), rows([7, 8, 0]), reach=2) == Hazard("read", 2, 2)
    assert first_hazard(rows([0, 1, 1]), rows([7, 8, 0]), reach=2) == Hazard("write", 2, 1)
    assert first_hazard(rows([0, 1, 2, 0]), rows([7, 8, 9, 0]), reach=2) is None  # three back: fine
    assert first_hazard(rows([0, 1, 2, 0]), reach=3) == Hazard("write", 3, 3)
    assert first_hazard(rows([0, 1, 2, 3, 0]), rows([7, 8, 9, 0, 1]), reach=3) == Hazard("read", 3, 3)
