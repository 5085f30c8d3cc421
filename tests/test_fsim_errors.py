"""Every program error the functional simulator reports names the instruction it is about."""

from __future__ import annotations

import re

import pytest

from weft.config import PRESETS, AcceleratorConfig
from weft.isa import ProgramBuilder, encode_insns, encode_uops, uops_from
from weft.sim.fsim import DeadlockError, Dram, FunctionalSimulator, RaceError, SimError, insn_region

C = PRESETS["tiny"]  # inp 256 rows, wgt 64, acc 256, uop 256; token and command queues of 16
#: (dst, src, wgt) micro-ops at DRAM address 0, loaded by UOPS.
UOP_TABLE = [(0, 0, 0), (1, 1, 1), (200, 0, 0), (0, 100, 0), (5, 0, 0), (6, 5, 0)]


def run(p: ProgramBuilder, config: AcceleratorConfig = C, words: bytes | None = None, size: int = 1 << 16,
        **options) -> dict:
    dram = Dram(size)
    dram.write(0, encode_uops(config, uops_from(UOP_TABLE)))
    insns = p.insns
    words = encode_insns(config, insns) if words is None else words
    addr = insn_region(size, len(words) // 16)
    dram.write(addr, words)
    return FunctionalSimulator(config, **options).run(dram, addr, len(words) // 16)


def expect(error: type[SimError], index: int, text: str, p: ProgramBuilder, **kwargs) -> SimError:
    with pytest.raises(error, match=rf"instruction {index}\b") as info:
        run(p, **kwargs)
    assert re.search(text, str(info.value)), str(info.value)
    assert info.value.index == index
    return info.value


def program(*steps: tuple) -> ProgramBuilder:
    """A program from (method, *args[, kwargs]) steps of ProgramBuilder calls."""
    p = ProgramBuilder()
    for method, *args in steps:
        kwargs = args.pop() if args and isinstance(args[-1], dict) else {}
        getattr(p, method)(*args, **kwargs)
    return p


UOPS = ("load", "uop", 0, 0, 1, len(UOP_TABLE))
FIN = ("finish",)


def patched(p: ProgramBuilder, index: int, opcode: int) -> bytes:
    """The encoded program with one instruction's opcode bits replaced (encoders refuse bad opcodes)."""
    words = bytearray(encode_insns(C, p.insns))
    words[16 * index] = (words[16 * index] & ~0x7) | opcode
    return bytes(words)


@pytest.mark.parametrize("opcode", [5, 6, 7])
def test_illegal_opcode(opcode):
    p = program(UOPS, UOPS, FIN)
    expect(SimError, 1, "illegal opcode", p, words=patched(p, 1, opcode))


@pytest.mark.parametrize(("method", "mem"), [("load", 4), ("load", 6), ("store", 2)])
def test_illegal_memory_id(method, mem):
    p = program(UOPS, ("load", "uop", 0, 0, 1, 1) if method == "load" else ("store", 0, 0, 1, 1), FIN)
    insns = p.insns
    insns[1]["mem_id"] = mem
    with pytest.raises(SimError, match=r"instruction 1\b.*illegal memory id"):
        run(p, words=encode_insns(C, insns))


@pytest.mark.parametrize(("step", "flag"), [
    (("load", "inp", 0, 0, 1, 1, {"deps": ["pop_prev"]}), "pop_prev"),
    (("load", "wgt", 0, 0, 1, 1, {"deps": ["push_prev"]}), "push_prev"),
    (("store", 0, 0, 1, 1, {"deps": ["push_next"]}), "push_next"),
    (("store", 0, 0, 1, 1, {"deps": ["pop_next"]}), "pop_next"),
])
def test_dependency_flag_illegal_for_unit(step, flag):
    expect(SimError, 1, f"flag {flag} is illegal", program(UOPS, step, FIN))


def test_illegal_alu_op():
    p = program(UOPS, ("alu", "add", 0, 1, {"imm": 1}), FIN)
    insns = p.insns
    insns[1]["alu_op"] = 7
    with pytest.raises(SimError, match=r"instruction 1\b.*illegal ALU op"):
        run(p, words=encode_insns(C, insns))


@pytest.mark.parametrize("step", [
    ("load", "wgt", 0, 0, 1, 1, {"pad": (0, 0, 1, 0), "deps": ["push_next"]}),
    ("load", "uop", 0, 0, 1, 1, {"pad": (1, 0, 0, 0)}),
])
def test_padding_not_allowed(step):
    expect(SimError, 1, "padding is only allowed", program(UOPS, step, FIN))


def test_padding_not_allowed_on_store():
    p = program(UOPS, ("store", 0, 0, 1, 1), FIN)
    insns = p.insns
    insns[1]["x_pad_1"] = 2
    with pytest.raises(SimError, match=r"instruction 1\b.*padding"):
        run(p, words=encode_insns(C, insns))


@pytest.mark.parametrize(("step", "what"), [
    (("load", "inp", 250, 0, 2, 3, {"pad": (0, 0, 1, 0)}), r"writes inp rows 250\.\.257"),
    (("load", "wgt", 60, 0, 1, 5), "writes wgt rows"),
    (("load", "uop", 255, 0, 1, 2), "writes uop rows"),
    (("load", "acc_narrow", 255, 0, 1, 2), "writes acc_narrow rows"),
    (("store", 250, 0, 2, 4), "reads out rows"),
])
def test_sram_rows_out_of_range_for_dma(step, what):
    expect(SimError, 1, what, program(UOPS, step, FIN))


@pytest.mark.parametrize("step", [
    ("load", "inp", 0, (1 << 16) // 4 - 3, 2, 2, {"stride": 2}),  # inp rows are 4 bytes on tiny
    ("load", "acc", 0, (1 << 16) // 16, 1, 1),
    ("store", 0, 1 << 20, 1, 1),
])
def test_dram_access_outside_image(step):
    expect(SimError, 1, "outside the 65536-byte image", program(UOPS, step, FIN))


def test_instruction_fetch_outside_image():
    dram = Dram(64)
    with pytest.raises(SimError, match="instruction fetch"):
        FunctionalSimulator(C).run(dram, 32, 4)


def test_loop_rows_in_range_run():
    run(program(UOPS, ("gemm", 2, 3, 1, 1), FIN))  # uop 2 writes acc row 200 of 256
    run(program(UOPS, ("alu", "add", 3, 4, 1, 1), FIN))  # uop 3 reads acc row 100


@pytest.mark.parametrize(("step", "text"), [
    (("gemm", 0, 2, 60, 1, {"dst": (5, 0)}),
     r"execution 103 \(i=51, j=0, uop 1\) dst row 256 is beyond the 256"),
    (("gemm", 0, 2, 1, 40, {"src": (0, 7)}), r"src row 2\d\d is beyond the 256 rows of inp"),
    (("gemm", 0, 2, 40, 1, {"wgt": (2, 0), "dst": (2, 0)}), r"wgt row 64 is beyond the 64 rows of wgt"),
    (("alu", "add", 3, 4, 20, 1, {"src": (10, 0), "dst": (1, 0)}),
     r"src row 2\d\d is beyond the 256 rows of acc"),
])
def test_loop_rows_out_of_range(step, text):
    expect(SimError, 1, text, program(UOPS, step, FIN))


def test_uop_span_empty_or_out_of_range():
    expect(SimError, 1, "empty micro-op range 2:2", program(UOPS, ("gemm", 2, 2), FIN))
    expect(SimError, 1, "beyond the 256 rows of the uop buffer",
           program(UOPS, ("alu", "min", 250, 300, {"imm": 0}), FIN))


def test_back_to_back_hazards():
    # uops 0 and 1 write rows 0 and 1; with dst factor (0, 0) and iter_in 2 uop 1 then uop 0 is fine,
    # but a single uop looped with a zero factor writes one row twice in a row.
    run(program(UOPS, ("gemm", 0, 2, 1, 2), FIN))
    expect(SimError, 1, r"execution 1 \(i=0, j=1, uop 0\) writes acc row 0 like the previous",
           program(UOPS, ("gemm", 0, 1, 1, 2), FIN))
    # ALU: uop 5 reads row 5, which uop 4 has just written.
    expect(SimError, 1, r"execution 1 \(i=0, j=0, uop 5\) reads acc row 5 that the previous execution writes",
           program(UOPS, ("alu", "add", 4, 6), FIN))
    # A row every second execution: fine for ADD, not for the ops whose result comes late (SHR, MUL, RQ).
    run(program(UOPS, ("alu", "add", 0, 2, 1, 2, {"imm": 1}), FIN))
    for op in ("shr", "mul", "rq"):
        expect(SimError, 1, rf"execution 2 \(i=0, j=1, uop 0\) writes acc row 0 like the execution 2 before it "
                            rf"\({op.upper()}'s result comes late\)",
               program(UOPS, ("alu", op, 0, 2, 1, 2, {"imm": 1}), FIN))


def test_missing_finish_and_instructions_after_finish():
    expect(SimError, 1, "without FINISH", program(UOPS, UOPS))
    expect(SimError, 2, "follows the FINISH at instruction 1", program(UOPS, FIN, UOPS, FIN))
    expect(SimError, 0, "without FINISH", ProgramBuilder())


def test_finish_before_last_store_or_load():
    # The store is never ordered before FINISH: compute reaches FINISH first.
    expect(SimError, 2, "store unit has not run instruction 1",
           program(UOPS, ("store", 0, 0, 1, 1), FIN))
    expect(SimError, 2, "load unit has not run instruction 1",
           program(UOPS, ("load", "inp", 0, 0, 1, 1), FIN))
    # The load runs while compute waits for the store, but no token orders it before FINISH.
    expect(SimError, 3, "no token orders the load unit's last instruction 0",
           program(("load", "inp", 0, 0, 1, 1), ("store", 0, 0, 0, 0, {"deps": ["push_prev"]}),
                   ("load", "uop", 0, 0, 0, 0, {"deps": ["pop_next"]}), FIN))


def test_deadlock_names_units_instructions_and_queues():
    p = program(("load", "inp", 0, 0, 1, 1), ("gemm", 0, 1, {"deps": ["pop_prev"]}), FIN)
    err = expect(DeadlockError, 1, r"compute unit blocked at instruction 1 .*pop l2g \(load->compute\), "
                 r"which is empty", p)
    assert "load unit done" in str(err) and "store unit done" in str(err)
    assert err.blocked == {"compute": {"index": 1, "waits": ["pop l2g (load->compute), which is empty"]}}

    small = C.replace(token_queue_depth=2)
    loads = [("load", "inp", 0, 0, 1, 1, {"deps": ["push_next"]})] * 3
    p = program(*loads, ("load", "uop", 0, 0, 0, 0, {"deps": ["pop_next"]}), FIN)
    expect(DeadlockError, 2, r"load unit blocked at instruction 2 .*push l2g \(load->compute\), which is "
           r"full \(2 tokens\).*compute unit blocked at instruction 3 .*pop s2g", p, config=small)


def test_deadlock_of_the_fetch_unit():
    """Load waits for compute, whose instruction sits behind a full load command queue."""
    tight = C.replace(cmd_queue_depth=2)
    p = program(("load", "inp", 0, 0, 1, 1, {"deps": ["pop_next"]}), ("load", "inp", 0, 0, 1, 1),
                ("load", "inp", 0, 0, 1, 1, {"deps": ["push_next"]}),
                ("load", "uop", 0, 0, 0, 0, {"deps": ["push_prev"]}),
                ("load", "uop", 0, 0, 0, 0, {"deps": ["pop_prev"]}), FIN)
    expect(DeadlockError, 0, r"compute unit blocked at instruction 3 .*fetch \(stalled at instruction 2: "
           r"the load command queue is full, 2 entries\)", p, config=tight)
    assert run(p, config=tight, model_fetch=False)["insns"]["load_inp"] == 3


def test_data_races_on_shared_sram():
    # WAR: the second load overwrites inp row 0 that the GEMM reads, with no token from compute.
    expect(RaceError, 3, r"overwrites inp row 0 that instruction 1 .* reads", _race_war_program())
    # RAW: the GEMM reads inp row 0 that a load wrote, but it waited for the store, not for the load.
    expect(RaceError, 3, r"reads inp row 0 written by instruction 0", _race_raw_program())
    # Out rows: the second GEMM rewrites rows the store has not been ordered to read first.
    expect(RaceError, 4, r"reads out row 0 written by instruction 3", _race_out_program())
    assert run(_race_out_program(), check_races=False)["insns"]["gemm"] == 2


def _race_war_program() -> ProgramBuilder:
    p = ProgramBuilder()
    p.load("inp", 0, 0, 1, 1, deps=["push_next"])  # 0
    p.gemm(0, 1, deps=["pop_prev"])  # 1
    p.load("uop", 0, 0, 0, 0, deps=["pop_prev"])  # 2: waits for the second load
    p.load("inp", 0, 0, 1, 1, deps=["push_next"])  # 3: overwrites row 0 with no token from compute
    p.finish()
    return p


def _race_raw_program() -> ProgramBuilder:
    p = ProgramBuilder()
    p.load("inp", 0, 0, 1, 1)  # 0: writes inp row 0
    p.store(0, 0, 0, 0, deps=["push_prev"])  # 1
    p.load("inp", 0, 0, 0, 0, deps=["push_next"])  # 2
    p.gemm(0, 1, deps=["pop_next"])  # 3: reads row 0, ordered after the store only
    p.load("uop", 0, 0, 0, 0, deps=["pop_prev"])  # 4
    p.finish()
    return p


def _race_out_program() -> ProgramBuilder:
    p = ProgramBuilder()
    p.load("uop", 0, 0, 1, 1)  # 0
    p.gemm(0, 1, reset=True, deps=["push_next"])  # 1: writes out row 0
    p.load("uop", 0, 0, 0, 0)  # 2
    p.gemm(0, 1, reset=True)  # 3: writes out row 0 again, no token from the store
    p.store(0, 0, 1, 1, deps=["pop_prev", "push_prev"])  # 4
    p.load("uop", 0, 0, 0, 0, deps=["pop_next"])  # 5
    p.finish()
    return p


def test_errors_are_user_errors():
    from weft.errors import is_user_error

    with pytest.raises(SimError) as info:
        run(ProgramBuilder())
    assert is_user_error(info.value)
    assert info.value.index == 0
