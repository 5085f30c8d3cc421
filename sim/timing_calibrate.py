"""Calibration of the timing model against the RTL: the same streams through both, cycle counts side by side.

The streams are the ones the issue names, the random regression streams of :mod:`weft.sim.randprog` and
a convolution (:func:`weft.sim.bench.conv_workload`), plus directed programs that isolate one cost each
(fetch, a GEMM, a padded load, a store...). Each stream runs on the functional simulator with the timing
model (which also checks it) and on the generated Verilog (:mod:`weft.sim.cosim`, cocotb and the DRAM
model with the same :class:`weft.sim.dram_timing.DramTiming`); a comparison holds both sets of counters.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from weft.isa import MemId, ProgramBuilder, encode_uops, uops_from
from weft.isa.encoding import encode_insns, layout_of
from weft.isa.semantics import row_bytes
from weft.sim.bench import conv_workload
from weft.sim.cosim import check_job, job_from_program, run_jobs
from weft.sim.dram import Dram
from weft.sim.dram_timing import TIMINGS
from weft.sim.fsim import FunctionalSimulator, insn_region
from weft.sim.randprog import random_program
from weft.sim.timing import TimingModel

if TYPE_CHECKING:
    from weft.config import AcceleratorConfig

__all__ = ["Comparison", "Stream", "calibration_figures", "compare", "conv_stream", "directed_streams",
           "model_stream", "random_streams"]

#: Counters that follow from the stream alone: the model must reproduce them exactly.
EXACT_COUNTERS = ("insns", "mac_active", "alu_active", "rd_beats", "wr_beats")


@dataclass
class Stream:
    """A named instruction stream and the DRAM image it runs on (instructions not yet written)."""

    name: str
    insns: np.ndarray
    dram: Dram


@dataclass
class Comparison:
    """One stream on the RTL and on the timing model."""

    name: str
    rtl: dict[str, int]
    model: dict[str, int]
    problem: str = ""  # the RTL's result differs from the functional simulator's ('' when bit-exact)

    @property
    def error(self) -> float:
        """(model - RTL) / RTL cycles."""
        return (self.model["cycles"] - self.rtl["cycles"]) / self.rtl["cycles"]

    def mismatched(self) -> dict[str, tuple[int, int]]:
        """Counters of EXACT_COUNTERS that differ: name -> (model, RTL)."""
        return {k: (self.model[k], self.rtl[k]) for k in EXACT_COUNTERS if self.model[k] != self.rtl[k]}

    def to_dict(self) -> dict[str, Any]:
        return {"stream": self.name, "rtl_cycles": self.rtl["cycles"], "model_cycles": self.model["cycles"],
                "error": round(self.error, 4), "bit_exact": not self.problem,
                "rtl_mac_utilization": round(self.rtl["mac_active"] / self.rtl["cycles"], 4),
                "model_mac_utilization": round(self.model["mac_active"] / self.model["cycles"], 4)}


# ---- streams -----------------------------------------------------------------------------------------------
def random_streams(config: AcceleratorConfig, seeds: Sequence[int], n_insns: int = 120) -> list[Stream]:
    """The random regression streams (legal by construction) of :func:`weft.sim.randprog.random_program`."""

    return [Stream(f"random seed {seed}", *random_program(config, seed, n_insns)) for seed in seeds]


def conv_stream(config: AcceleratorConfig, size: int = 56, buffers: int = 2) -> Stream:
    """The conv workload of the fsim benchmark (3x3 conv + requantizing ReLU, tiled, double-buffered)."""

    work = conv_workload(config, size=size, buffers=buffers)
    return Stream(f"conv {size}x{size} buffers={buffers}", work.insns, work.dram)


def _directed(config: AcceleratorConfig) -> dict[str, Callable[[ProgramBuilder, Dram], None]]:
    c = config
    row = row_bytes(c)
    uop_rb = row[MemId.UOP]

    def uops(dram: Dram, count: int) -> int:
        addr = dram.alloc(count * uop_rb, align=64)
        dram.write(addr, np.frombuffer(encode_uops(c, uops_from((k, k, k) for k in range(count))), np.uint8))
        return addr // uop_rb

    def region(dram: Dram, mem: MemId, rows: int) -> int:
        """DRAM element address one element past an aligned region (so rows start mid-beat)."""
        rb = row[mem]
        return dram.alloc((rows + 1) * rb, align=max(64, rb)) // rb + 1

    def finish(p: ProgramBuilder, d: Dram) -> None:
        p.finish()

    def nops(unit_mem: MemId, count: int) -> Callable[[ProgramBuilder, Dram], None]:
        def build(p: ProgramBuilder, d: Dram) -> None:
            for k in range(count):
                last = k == count - 1 and unit_mem == MemId.INP
                p.load(unit_mem, 0, 0, 0, 0, deps=["push_next"] if last else [])
            p.finish(deps=["pop_prev"] if unit_mem == MemId.INP else [])
        return build

    def loop(op: str, count: int, iter_out: int, iter_in: int, reset: bool = False
             ) -> Callable[[ProgramBuilder, Dram], None]:
        def build(p: ProgramBuilder, d: Dram) -> None:
            p.load(MemId.UOP, 0, uops(d, count), 1, count)
            dst = (count * iter_in, count)
            if op == "gemm":
                p.gemm(0, count, iter_out, iter_in, dst=dst, reset=reset)
            else:
                p.alu("add", 0, count, iter_out, iter_in, dst=dst, imm=1)
            p.finish()
        return build

    def beside(p: ProgramBuilder, d: Dram) -> None:
        """A GEMM, an ALU instruction beside it, a GEMM beside that (spec "beside"): the two halves of the
        accumulator, where the formats have the bit."""
        half = c.acc_rows // 2
        addr = d.alloc(8 * uop_rb, align=64)
        d.write(addr, np.frombuffer(encode_uops(c, uops_from([(k, k, k) for k in range(4)]
                                                              + [(half + k, 0, 0) for k in range(4)])), np.uint8))
        p.load(MemId.UOP, 0, addr // uop_rb, 1, 8)
        can = {name: layout_of(c).formats[name].has("beside") for name in ("gemm", "alu")}
        p.gemm(0, 4, 3, 2, dst=(8, 4), reset=True)
        p.alu("add", 4, 8, 2, 2, dst=(8, 4), imm=1, beside=can["alu"])
        p.gemm(0, 4, 3, 2, dst=(8, 4), src=(1, 0), wgt=(1, 0), beside=can["gemm"])
        p.finish()

    def load(mem: MemId, y: int, x: int, stride: int, pad: tuple[int, int, int, int] = (0, 0, 0, 0)
             ) -> Callable[[ProgramBuilder, Dram], None]:
        def build(p: ProgramBuilder, d: Dram) -> None:
            addr = region(d, mem, (y - 1) * stride + x)
            on_load_unit = mem in (MemId.INP, MemId.WGT)
            p.load(mem, 0, addr, y, x, stride, pad=pad, deps=["push_next"] if on_load_unit else [])
            p.finish(deps=["pop_prev"] if on_load_unit else [])
        return build

    def store(y: int, x: int, stride: int) -> Callable[[ProgramBuilder, Dram], None]:
        def build(p: ProgramBuilder, d: Dram) -> None:
            rb = row[MemId.OUT]
            addr = d.alloc(((y - 1) * stride + x) * rb, align=max(64, rb)) // rb
            p.load(MemId.UOP, 0, 0, 0, 0, deps=["push_next"])
            p.store(0, addr, y, x, stride, deps=["pop_prev", "push_prev"])
            p.finish(deps=["pop_next"])
        return build

    return {
        "finish": finish,
        "load nops x40": nops(MemId.INP, 40),
        "compute nops x40": nops(MemId.UOP, 40),
        "gemm 4 uops x3x2": loop("gemm", 4, 3, 2),
        "gemm reset 4 uops x3x2": loop("gemm", 4, 3, 2, reset=True),
        "alu 4 uops x3x2": loop("alu", 4, 3, 2),
        "gemm, alu beside, gemm beside": beside,
        "load inp 1x1": load(MemId.INP, 1, 1, 1),
        "load inp 4x8": load(MemId.INP, 4, 8, 8),
        "load inp 4x8 padded": load(MemId.INP, 4, 8, 16, (1, 1, 2, 2)),
        "load inp 12x8 strided": load(MemId.INP, 12, 8, 16),
        "load wgt 2x3": load(MemId.WGT, 2, 3, 3),
        "load acc 2x3": load(MemId.ACC, 2, 3, 3),
        "load uop 1x100": load(MemId.UOP, 1, 100, 100),
        "store 1x1": store(1, 1, 1),
        "store 4x8": store(4, 8, 8),
        "store 12x16": store(12, 16, 16),
    }


def directed_streams(config: AcceleratorConfig) -> list[Stream]:
    """Programs that each isolate one cost of the design, named after what they do."""
    streams = []
    for name, build in _directed(config).items():
        p = ProgramBuilder()
        dram = Dram(1 << 16)
        build(p, dram)
        streams.append(Stream(name, p.insns, dram))
    return streams


# ---- running -----------------------------------------------------------------------------------------------
def _image(config: AcceleratorConfig, stream: Stream) -> tuple[Dram, int]:
    """A copy of the stream's DRAM with the instructions at the top (where the cosimulation puts them)."""

    words = np.frombuffer(encode_insns(config, stream.insns), dtype=np.uint8)
    image = Dram(stream.dram.size)
    image.data[:] = stream.dram.data
    addr = insn_region(image.size, len(stream.insns))
    image.data[addr:addr + words.size] = words
    return image, addr


def model_stream(config: AcceleratorConfig, stream: Stream, timing: str = "pynq",
                 oracle: FunctionalSimulator | None = None) -> tuple[dict[str, Any], Dram]:
    """Run `stream` on the functional simulator (`oracle`, or a fresh one) with the timing model for the
    DRAM timing named `timing`; returns (stats, final DRAM)."""
    image, addr = _image(config, stream)
    sim = oracle or FunctionalSimulator(config, timing=TimingModel(config, TIMINGS[timing]))
    if sim.timing is None:
        raise ValueError("the functional simulator given as oracle has no timing model")
    return sim.run(image, addr, len(stream.insns)), image


def compare(config: AcceleratorConfig, streams: Sequence[Stream], *, sim: str = "verilator",
            timing: str = "pynq") -> list[Comparison]:
    """Run `streams` on the RTL (one simulator process, in order, as on the board) and on the timing model."""

    # One instance: the SRAMs carry over from stream to stream as they do in the RTL.
    oracle = FunctionalSimulator(config, timing=TimingModel(config, TIMINGS[timing]))
    jobs, expected = [], []
    for stream in streams:
        stats, image = model_stream(config, stream, timing, oracle)
        job = job_from_program(config, stream.insns, stream.dram, label=stream.name)
        job.timeout_cycles = 100_000 + 4 * stats["cycles"]
        jobs.append(job)
        expected.append((stats, image))
    results = run_jobs(config, sim, jobs, timing=timing)
    out = []
    for stream, result, (stats, image) in zip(streams, results, expected, strict=True):
        problem = check_job(config, result, image.data, stream.insns)
        out.append(Comparison(stream.name, dict(result.counters), dict(stats["counters"]), problem))
    return out


def calibration_figures(config: AcceleratorConfig, *, timing: str = "pynq", seeds: Sequence[int] = (0, 1, 2),
                        conv_size: int = 28, sim: str = "verilator") -> dict[str, Any]:
    """The issue's acceptance figures for `config`: the random regression streams `seeds` and a conv of
    `conv_size` x `conv_size` on the RTL and on the model, with each error (what `weft bench rtl` prints)."""
    started = time.perf_counter()
    comparisons = compare(config, [*random_streams(config, seeds), conv_stream(config, size=conv_size)],
                          sim=sim, timing=timing)
    return {
        "config": config.name,
        "dram_model": timing,
        "streams": [c.to_dict() for c in comparisons],
        "max_abs_error": round(max(abs(c.error) for c in comparisons), 4),
        "within_10_percent": all(abs(c.error) <= 0.10 for c in comparisons),
        "exact_counters": all(not c.mismatched() for c in comparisons),
        "bit_exact": all(not c.problem for c in comparisons),
        "wall_s": round(time.perf_counter() - started, 2),
    }
