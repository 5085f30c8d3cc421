"""Cosimulation of the generated Verilog (config `tiny`) against the functional simulator, through cocotb on
Icarus and Verilator: random legal programs, directed programs per instruction kind, and illegal
instructions (error code and index read back over AXI-Lite, then a clean next run)."""

from __future__ import annotations

import dataclasses
import functools
import re

import numpy as np
import pytest

from weft.config import PRESETS
from weft.hw.regs import ErrorCode
from weft.isa import AluOp, MemId, Opcode, ProgramBuilder, encode_insns, encode_uops, uops_from
from weft.isa.arith import pack
from weft.isa.constants import INSN_BYTES
from weft.isa.semantics import LATE_ALU_OPS, hazard_reach
from weft.sim.cosim import check_job, job_from_program, run_jobs, run_random
from weft.sim.dram import Dram
from weft.sim.fsim import FunctionalSimulator, SimError

CONFIG = PRESETS["tiny"]


@pytest.mark.parametrize(("sim", "seeds", "timing"), [
    pytest.param("icarus", [0, 1, 2], "stress", marks=pytest.mark.rtl("icarus")),
    pytest.param("verilator", [10, 11, 12], "pynq", marks=pytest.mark.rtl("verilator")),
])
def test_random_programs_match_the_functional_simulator(sim, seeds, timing):
    report = run_random(CONFIG, sim, seeds, n_insns=150, timing=timing)
    assert report.failed == 0, report.summary()["failures"]
    assert all(r.cycles > 0 for r in report.results)
    summary = report.summary()
    assert summary["unit_busy"]["load"] > 0 and summary["unit_busy"]["store"] > 0


class _Program:
    """A small directed program and its DRAM image, built bottom-up."""

    def __init__(self, size: int = 8192):
        self.p = ProgramBuilder()
        self.dram = Dram(size)
        self.rng = np.random.default_rng(size)

    def put(self, values: np.ndarray, width: int, row_bytes: int, offset_rows: int = 0) -> int:
        """Random-free placement of `values` (rows x elements) at an element address; returns it."""
        raw = pack(values, width).reshape(-1)
        addr = self.dram.alloc(raw.size + offset_rows * row_bytes, align=64) + offset_rows * row_bytes
        self.dram.write(addr, raw)
        return addr // row_bytes

    def data(self, rows: int, elems: int, width: int) -> np.ndarray:
        hi = 1 << (width - 1)
        return self.rng.integers(-hi, hi, (rows, elems))

    def uops(self, triples: list[tuple[int, int, int]]) -> int:
        raw = np.frombuffer(encode_uops(CONFIG, uops_from(triples)), dtype=np.uint8)
        addr = self.dram.alloc(raw.size, align=64)
        self.dram.write(addr, raw)
        return addr // (CONFIG.uop_bits // 8)

    def out(self, rows: int) -> int:
        rb = CONFIG.out_row_bits // 8
        return self.dram.alloc(rows * rb, align=64) // rb


def _gemm_program() -> _Program:
    """Padded input load at an odd (sub-bus) element address, weights, GEMM reset + accumulate with a
    read-after-write at distance 2, saturating store with a DRAM stride."""
    c, g = CONFIG, _Program()
    inp = g.put(g.data(7, c.batch * c.block_in, c.inp_width), c.inp_width, c.inp_row_bits // 8, offset_rows=1)
    wgt = g.put(g.data(4, c.block_out * c.block_in, c.wgt_width), c.wgt_width, c.wgt_row_bits // 8)
    uops = g.uops([(0, 0, 0), (1, 1, 1), (0, 2, 2), (1, 3, 3), (2, 4, 0)])  # dst 0,1,0,1: distance 2
    reset = g.uops([(0, 0, 0), (1, 0, 0), (2, 0, 0)])
    out = g.out(12)
    p = g.p
    p.load("inp", 0, inp, 2, 3, stride=4, pad=(1, 1, 1, 0))  # a 4 x 4 padded tile: rows 0..15
    p.load("wgt", 0, wgt, 1, 4, deps=["push_next"])
    p.load("uop", 0, uops, 1, 5)
    p.load("uop", 8, reset, 1, 3)
    p.gemm(8, 11, iter_out=3, dst=(3, 0), reset=True, deps=["pop_prev"])
    p.gemm(0, 5, iter_out=3, iter_in=2, dst=(3, 0), src=(5, 1), deps=["push_next"])
    p.store(0, out, 3, 3, stride=4, deps=["pop_prev", "push_prev"])
    p.finish(deps=["pop_next"])
    return g


def _reads_back(distance: int) -> list[tuple[int, int, int]]:
    """Four micro-ops, execution k writing row k and reading row (k - distance) mod 4: the last ones read the
    rows written `distance` executions before them."""
    return [(k, (k - distance) % 4, 0) for k in range(4)]


def _alu_program() -> _Program:
    """Accumulator loads (wide and narrow, padded), every ALU op with an immediate and with an acc source
    (reading rows written as few executions before as spec "hazard" allows: two, four for SHR, MUL and RQ),
    and stores of the saturated results."""
    c, g = CONFIG, _Program()
    acc = g.data(10, c.batch * c.block_out, c.acc_width)
    acc[:5] = np.clip(acc[:5], -400, 400) // 1000 + g.data(5, c.batch * c.block_out, 10)
    acc_addr = g.put(acc, c.acc_width, c.acc_row_bits // 8, offset_rows=3)
    narrow = g.put(g.data(6, c.batch * c.block_out, c.out_width), c.out_width, c.out_row_bits // 8,
                   offset_rows=1)
    chain = g.uops(_reads_back(hazard_reach(Opcode.ALU, AluOp.ADD) + 1))
    chain3 = g.uops(_reads_back(hazard_reach(Opcode.ALU, AluOp.SHR) + 1))
    out = g.out(40)
    p = g.p
    p.load("acc", 0, acc_addr, 2, 5, stride=5, pad=(0, 1, 1, 0))  # rows 0..17
    p.load("acc_narrow", 20, narrow, 3, 2, pad=(1, 0, 0, 1))  # rows 20..31
    p.load("uop", 0, chain, 1, 4)
    p.load("uop", 4, chain3, 1, 4)
    for op, imm in zip(AluOp, (-5, 7, 1000, 3, -3, 300, -77), strict=True):  # RQ by an immediate: m = 300, s = 0
        p.alu(op, 0, 4, iter_out=2, dst=(4, 0), imm=imm)
        first = 4 if op in LATE_ALU_OPS else 0
        p.alu(op, first, first + 4, iter_out=2, iter_in=2, dst=(8, 4), src=(8, 4))
    for amount in (-2, 31, -32, 33, 0, -33):  # right, left, and amounts that wrap to 6 bits
        p.alu("shr", 0, 4, dst=(0, 0), imm=amount)
    p.alu("add", 0, 4, iter_out=3, dst=(20, 0), deps=["push_next"])
    p.store(0, out, 4, 8, stride=9, deps=["pop_prev", "push_prev"])
    p.finish(deps=["pop_next"])
    return g


def _dma_program() -> _Program:
    """Transfers that cross a 4 KiB boundary and need many bursts, overlapping DRAM rows in a store
    (later rows win), no-op loads and stores that only carry tokens."""
    c, g = CONFIG, _Program(size=12288)
    g.dram.alloc(4096 - 200)
    inp = g.put(g.data(120, c.batch * c.block_in, c.inp_width), c.inp_width, c.inp_row_bits // 8)
    wgt = g.put(g.data(40, c.block_out * c.block_in, c.wgt_width), c.wgt_width, c.wgt_row_bits // 8)
    uops = g.uops([(k, k, k % 40) for k in range(100)])
    g.dram.alloc(8192 - g.dram._top - 100)
    out = g.out(130)
    p = g.p
    p.load("inp", 0, inp, 1, 120)
    p.load("wgt", 0, wgt, 1, 40)
    p.load("inp", 0, 0, 0, 0, deps=["push_next"])  # a no-op that carries the token
    p.load("uop", 0, uops, 1, 100)
    p.gemm(0, 100, reset=True, deps=["pop_prev"])
    p.gemm(0, 100, deps=["push_next"])
    p.store(0, 0, 0, 0, deps=["pop_prev"])  # a no-op
    p.store(0, out, 1, 100)
    p.store(0, out + 105, 3, 10, stride=4)  # rows overlap in DRAM: later rows win
    p.store(0, 0, 0, 0, deps=["push_prev"])
    p.finish(deps=["pop_next"])
    return g


DIRECTED = {"gemm": _gemm_program, "alu": _alu_program, "dma": _dma_program}


@pytest.mark.rtl("icarus")
def test_directed_programs_per_instruction_kind():
    programs = {name: build() for name, build in DIRECTED.items()}
    oracle = FunctionalSimulator(CONFIG)
    jobs, expected = [], []
    for name, g in programs.items():
        job = job_from_program(CONFIG, g.p.insns, g.dram, label=name)
        image = Dram(job.dram.size)
        image.data[:] = job.dram
        oracle.run(image, job.insn_addr, job.insn_count)
        jobs.append(job)
        expected.append(image.data)
    results = run_jobs(CONFIG, "icarus", jobs, timing="stress", seed=3)
    for (name, g), result, want in zip(programs.items(), results, expected, strict=True):
        assert check_job(CONFIG, result, want, g.p.insns) == "", name
        assert result.report["violations"] == []
    dma = results[list(DIRECTED).index("dma")]
    assert dma.report["read_bursts"] >= 8 and dma.report["write_bursts"] >= 4


@pytest.mark.rtl("icarus")
def test_buffers_never_use_a_read_of_a_row_written_in_its_cycle(tmp_path, monkeypatch):
    """Yosys is told that the buffers' reads never use a row a write port writes in the read's cycle
    (weft.hw.rams: no block RAM collision logic): the RTL with every such read's data inverted gives the
    directed programs' and random programs' results unchanged."""
    import weft.hw.top

    garbled = functools.partial(weft.hw.top.generate_verilog, garble_collisions=True)
    monkeypatch.setattr(weft.hw.top, "generate_verilog", garbled)
    garbled_reads = set(re.findall(r"reg (?:\[\S+\] )?(\S*_collided)", garbled(CONFIG)))
    assert garbled_reads == {"acc_bank0_collided", "acc_bank1_collided", "out_bank0_collided", "out_bank1_collided",
                             "inp_collided", "wgt_collided"}
    programs = {name: build() for name, build in DIRECTED.items()}
    jobs = [job_from_program(CONFIG, g.p.insns, g.dram, label=name) for name, g in programs.items()]
    oracle = FunctionalSimulator(CONFIG)
    results = run_jobs(CONFIG, "icarus", jobs, timing="stress", seed=4, build_root=tmp_path)
    for job, result, g in zip(jobs, results, programs.values(), strict=True):
        image = Dram(job.dram.size)
        image.data[:] = job.dram
        oracle.run(image, job.insn_addr, job.insn_count)
        assert check_job(CONFIG, result, image.data, g.p.insns) == "", job.label
    report = run_random(CONFIG, "icarus", [20, 21], n_insns=150, timing="stress", build_root=tmp_path)
    assert report.failed == 0, report.summary()["failures"]


def _patched(program: _Program, index: int, opcode: int) -> np.ndarray:
    """The program's words with instruction `index`'s opcode field replaced (encoders refuse bad ones)."""
    words = np.frombuffer(encode_insns(CONFIG, program.p.insns), dtype=np.uint8).copy()
    words[16 * index] = (int(words[16 * index]) & 0xF8) | opcode
    return words


def _illegal_cases() -> list[tuple[str, _Program, ErrorCode, int | None]]:
    cases = []
    for name, code, mutate in (
        ("opcode", ErrorCode.ILLEGAL_OPCODE, None),
        ("mem_id", ErrorCode.ILLEGAL_MEM_ID, lambda p: p.load(MemId.OUT, 0, 0, 1, 1)),
        ("flag", ErrorCode.ILLEGAL_DEP_FLAG, lambda p: p.store(0, 0, 1, 1, deps=["pop_next"])),
        ("padding", ErrorCode.BAD_PADDING, lambda p: p.load("wgt", 0, 0, 1, 1, pad=(0, 0, 1, 0))),
        ("sram", ErrorCode.SRAM_RANGE, lambda p: p.load("inp", 250, 0, 2, 4)),
        ("uops", ErrorCode.UOP_RANGE, lambda p: p.gemm(4, 4)),
        ("loop", ErrorCode.LOOP_RANGE, lambda p: p.gemm(0, 1, iter_out=200, dst=(2, 0), reset=True)),
        ("deadlock", ErrorCode.DEADLOCK, lambda p: p.gemm(0, 1, reset=True, deps=["pop_prev"])),
    ):
        g = _Program()
        uops = g.uops([(0, 0, 0)])
        g.p.load("uop", 0, uops, 1, 1)
        g.p.load("uop", 0, uops, 1, 1)
        if mutate is not None:
            mutate(g.p)
        else:
            g.p.load("uop", 0, uops, 1, 1)  # its opcode is patched below
        g.p.finish()
        cases.append((name, g, code, 2))
    g = _Program()
    g.p.load("uop", 0, 0, 0, 0)
    g.p.finish()
    g.p.load("uop", 0, 0, 0, 0)
    cases.append(("finish_not_last", g, ErrorCode.FINISH_NOT_LAST, 2))
    g = _Program()
    g.p.load("uop", 0, 0, 0, 0)
    cases.append(("no_finish", g, ErrorCode.NO_FINISH, 0))
    g = _Program()
    g.p.store(0, 0, 0, 0, deps=["pop_prev"])  # waits for a token nobody pushes
    g.p.finish()
    cases.append(("finish_early", g, ErrorCode.FINISH_EARLY, 1))
    return cases


@pytest.mark.rtl("verilator")
def test_illegal_instructions_stop_with_an_error_code_read_over_axi_lite():
    cases = _illegal_cases()
    jobs = []
    for name, g, _, _ in cases:
        job = job_from_program(CONFIG, g.p.insns, g.dram, label=name, timeout_cycles=20_000)
        if name == "opcode":
            job.dram[job.insn_addr:job.insn_addr + 16 * job.insn_count] = _patched(g, 2, 0b111)
        image = Dram(job.dram.size)
        image.data[:] = job.dram
        with pytest.raises(SimError) as err:  # the oracle rejects every one of them
            FunctionalSimulator(CONFIG).run(image, job.insn_addr, job.insn_count)
        job.label = f"{name}: {err.value}"
        jobs.append((job, err.value.index))
    follow_up = _gemm_program()  # after all the errors the accelerator must still run a program cleanly
    good = job_from_program(CONFIG, follow_up.p.insns, follow_up.dram)
    image = Dram(good.dram.size)
    image.data[:] = good.dram
    FunctionalSimulator(CONFIG).run(image, good.insn_addr, good.insn_count)

    results = run_jobs(CONFIG, "verilator", [job for job, _ in jobs] + [good], timing="pynq")
    for (name, _, code, index), (job, oracle_index), result in zip(cases, jobs, results, strict=False):
        rep = result.report
        assert not rep["timed_out"], name
        assert rep["status"] == {"busy": 0, "done": 1, "error": 1}, name
        assert rep["error_code"] == code, (name, ErrorCode(rep["error_code"]).name, job.label)
        assert rep["error_index"] == index == oracle_index, (name, rep["error_index"], job.label)
        assert rep["violations"] == [], name
    assert check_job(CONFIG, results[-1], image.data, follow_up.p.insns) == ""
    assert results[-1].report["status"] == {"busy": 0, "done": 1, "error": 0}


@pytest.mark.rtl("verilator")
def test_a_misaligned_or_empty_stream_stops_at_launch():
    """Fetch's launch checks (worked out in START's cycle): INSN_ADDR off the instruction size and INSN_COUNT
    0 each stop the run at index 0 with their code; the same program aligned then runs cleanly."""
    g = _gemm_program()
    good = job_from_program(CONFIG, g.p.insns, g.dram)
    misaligned = dataclasses.replace(good, insn_addr=good.insn_addr + INSN_BYTES // 2, label="misaligned")
    empty = dataclasses.replace(good, insn_count=0, label="empty")
    image = Dram(good.dram.size)
    image.data[:] = good.dram
    FunctionalSimulator(CONFIG).run(image, good.insn_addr, good.insn_count)
    results = run_jobs(CONFIG, "verilator", [misaligned, empty, good], timing="pynq")
    for job, result, code in zip((misaligned, empty), results, (ErrorCode.INSN_ADDR_MISALIGNED, ErrorCode.NO_FINISH),
                                 strict=False):
        rep = result.report
        assert rep["status"] == {"busy": 0, "done": 1, "error": 1}, job.label
        assert (rep["error_code"], rep["error_index"]) == (code, 0), job.label
    assert results[2].report["status"] == {"busy": 0, "done": 1, "error": 0}
    assert check_job(CONFIG, results[2], image.data, g.p.insns) == ""


@pytest.mark.rtl("icarus")
def test_weft_cosim_command_prints_a_summary(capsys):
    import json

    from weft.cli import main

    code = main(["cosim", "--config", "tiny", "--sim", "icarus", "--seed", "40", "--count", "2", "--insns", "60"])
    summary = json.loads(capsys.readouterr().out)
    assert code == 0
    assert summary["passed"] == 2 and summary["failed"] == 0 and summary["cycles"] > 0
    assert 0 <= summary["mac_utilization"] < 1


@pytest.mark.rtl("verilator", "icarus")
def test_rtl_benchmark_reports_utilization_and_simulation_speed():
    from weft.sim.bench_rtl import bench_rtl

    figures = bench_rtl("tiny", blocks=4)
    main = figures["utilization"]
    assert main["bit_exact"], main["problem"]
    assert main["mac_active_cycles"] == main["workload"]["gemm_executions"]
    assert 0 < main["mac_utilization"] < 1
    assert main["busy"]["compute"] >= main["mac_active_cycles"]
    for sim in ("verilator", "icarus"):
        assert figures["speed"][sim]["sim_cycles_per_s"] > 0 and figures["speed"][sim]["bit_exact"]


@pytest.mark.rtl("icarus")
def test_bus_errors_stop_the_run_and_name_the_instruction():
    c = CONFIG
    read = _Program()
    inp = read.put(read.data(4, c.batch * c.block_in, c.inp_width), c.inp_width, c.inp_row_bits // 8)
    read.p.load("inp", 0, 0, 0, 0)
    read.p.load("inp", 0, inp, 1, 4, deps=["push_next"])  # instruction 1 reads a faulty range
    read.p.gemm(0, 1, reset=True, deps=["pop_prev"])
    read.p.finish()
    write = _Program()
    out = write.out(8)
    uops = write.uops([(0, 0, 0)])
    write.p.load("uop", 0, uops, 1, 1)
    write.p.gemm(0, 1, reset=True, deps=["push_next"])
    write.p.store(0, out, 1, 4, deps=["pop_prev", "push_prev"])  # instruction 2 writes a faulty range
    write.p.finish(deps=["pop_next"])
    jobs = [job_from_program(c, g.p.insns, g.dram, timeout_cycles=20_000) for g in (read, write)]
    jobs[0].faults = [(inp * (c.inp_row_bits // 8), inp * (c.inp_row_bits // 8) + 8)]
    jobs[1].faults = [(out * (c.out_row_bits // 8), out * (c.out_row_bits // 8) + 4)]
    follow_up = _gemm_program()
    jobs.append(job_from_program(c, follow_up.p.insns, follow_up.dram))
    image = Dram(jobs[-1].dram.size)
    image.data[:] = jobs[-1].dram
    FunctionalSimulator(c).run(image, jobs[-1].insn_addr, jobs[-1].insn_count)

    results = run_jobs(c, "icarus", jobs, timing="stress")
    for result, index in zip(results, (1, 2), strict=False):
        rep = result.report
        assert rep["status"] == {"busy": 0, "done": 1, "error": 1}
        assert (rep["error_code"], rep["error_index"]) == (ErrorCode.BUS_ERROR, index)
    assert check_job(c, results[-1], image.data, follow_up.p.insns) == ""
