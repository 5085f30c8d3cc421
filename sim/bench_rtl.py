"""`weft bench rtl`: MAC utilization and simulation speed of the generated RTL.

The workload is a GEMM-bound stream: a weight-stationary matrix product ``Y[n] = X[n] . W^T`` over many
blocks of input rows. The weights (``icb x ocb`` tiles) are loaded once; then, per block of ``rows`` input
rows (alternating between the two halves of the input and accumulator buffers):

* load: one LOAD INP of the block's ``rows x icb`` input tiles;
* compute: a GEMM reset of the block's ``rows x ocb`` accumulator rows, then one GEMM of ``rows x ocb x
  icb`` micro-op executions (output blocks innermost, so an accumulator row is revisited every ``ocb``
  executions: the read-after-write distance the pipeline must forward);
* store: one STORE of the block's output rows.

Tokens let the load of block k+1 and the store of block k-1 overlap the GEMMs of block k. The DRAM timing
is the Pynq-Z1-like one (:data:`weft.sim.dram_timing.TIMINGS`, "pynq"); on Verilator the DRAM model is the
one inside the design ("dpi", :mod:`weft.sim.dram_model`), and the main stream runs again on the AxiRam
model ("axiram") for its speed beside. The final DRAM image is checked against the functional simulator,
so the figures come from a run that is also bit-exact; each run's cycles stand beside the timing model's
prediction for the same stream (``model_cycles``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from weft.config import AcceleratorConfig, load_config
from weft.errors import UsageError
from weft.isa import MemId, ProgramBuilder, encode_uops, uops_from
from weft.isa.arith import pack
from weft.isa.constants import INSN_BYTES
from weft.isa.semantics import UNIT_NAMES, named_row_bytes
from weft.progress import Progress
from weft.sim.cosim import check_job, job_from_program, run_jobs, simulator_available
from weft.sim.dram import Dram
from weft.sim.dram_model import choose
from weft.sim.dram_timing import TIMINGS
from weft.sim.fsim import FunctionalSimulator
from weft.sim.timing import TimingModel
from weft.sim.timing_calibrate import calibration_figures

__all__ = ["bench_rtl", "gemm_stream"]


def _shape(c: AcceleratorConfig) -> tuple[int, int, int]:
    """(icb, ocb, rows): the largest tiles (up to 32 x 4 x 16) that fit twice in the buffers."""
    ocb = 4
    icb = 32
    while icb > 1 and (icb * ocb > c.wgt_rows or 2 * (icb * ocb + ocb) > c.uop_rows):
        icb //= 2
    rows = 16
    while rows > 1 and (rows * icb > c.inp_rows // 2 or rows * ocb > c.acc_rows // 2):
        rows //= 2
    return icb, ocb, rows


def gemm_stream(config: AcceleratorConfig, blocks: int, seed: int = 0) -> tuple[np.ndarray, Dram, dict[str, Any]]:
    """The benchmark program for `config` (see the module docstring): (instructions, DRAM image, shape)."""
    c = config
    icb, ocb, rows = _shape(c)
    rng = np.random.default_rng(seed)
    rb = named_row_bytes(c)
    inp_half, acc_half = c.inp_rows // 2, c.acc_rows // 2
    # Micro-ops per half: the accumulate loop body (ic outer, oc inner), then the reset body.
    tables = []
    for half in range(2):
        body = [(half * acc_half + oc, half * inp_half + ic, oc * icb + ic) for ic in range(icb) for oc in range(ocb)]
        reset = [(half * acc_half + oc, 0, 0) for oc in range(ocb)]
        tables += body + reset
    uops = encode_uops(c, uops_from(tables))
    span = icb * ocb + ocb

    chunks: list[tuple[int, bytes]] = []
    top = 0

    def place(data: bytes, row_bytes: int) -> int:
        nonlocal top
        align = max(64, row_bytes)
        addr = -(-top // align) * align
        chunks.append((addr, data))
        top = addr + len(data)
        return addr // row_bytes

    lo_i, hi_i = -(1 << (c.inp_width - 1)), 1 << (c.inp_width - 1)
    lo_w, hi_w = -(1 << (c.wgt_width - 1)), 1 << (c.wgt_width - 1)
    wgt = rng.integers(lo_w, hi_w, (icb * ocb, c.block_out * c.block_in))
    inp = rng.integers(lo_i, hi_i, (blocks * rows * icb, c.batch * c.block_in))
    uop_addr = place(uops, rb["uop"])
    wgt_addr = place(pack(wgt, c.wgt_width).tobytes(), rb["wgt"])
    inp_addr = place(pack(inp, c.inp_width).tobytes(), rb["inp"])
    out_addr = place(bytes(blocks * rows * ocb * rb["out"]), rb["out"])

    p = ProgramBuilder()
    loads, computes, stores = [], [], []
    for k in range(blocks):
        half = k % 2
        block_loads = []
        if k == 0:
            block_loads.append(dict(mem=MemId.WGT, sram=0, dram=wgt_addr, y=1, x=icb * ocb))
        block_loads.append(dict(mem=MemId.INP, sram=half * inp_half, dram=inp_addr + k * rows * icb, y=1,
                                x=rows * icb))
        loads.append(block_loads)
        computes.append(half)
        stores.append(dict(sram=half * acc_half, dram=out_addr + k * rows * ocb, y=1, x=rows * ocb))

    def emit_load(k: int) -> None:
        for n, spec in enumerate(loads[k]):
            deps = []
            if n == 0 and k >= 2:
                deps.append("pop_next")
            if n == len(loads[k]) - 1:
                deps.append("push_next")
            p.load(spec["mem"], spec["sram"], spec["dram"], spec["y"], spec["x"], deps=deps)

    p.load(MemId.UOP, 0, uop_addr, 1, 2 * span)
    emit_load(0)
    for k in range(blocks):
        if k + 1 < blocks:
            emit_load(k + 1)  # prefetch: the next block's inputs load while this one computes
        half = computes[k]
        base = half * span
        p.gemm(base + icb * ocb, base + span, iter_out=rows, dst=(ocb, 0), reset=True,
               deps=["pop_prev"] + (["pop_next"] if k >= 2 else []))
        p.gemm(base, base + icb * ocb, iter_out=rows, dst=(ocb, 0), src=(icb, 0),
               deps=["push_next"] + (["push_prev"] if k + 2 < blocks else []))
        s = stores[k]
        p.store(s["sram"], s["dram"], s["y"], s["x"], deps=["pop_prev", "push_prev"])
    for _ in range(min(blocks, 2)):
        p.load(MemId.UOP, 0, 0, 0, 0, deps=["pop_next"])
    p.finish()
    insns = p.insns
    size = -(-top // 64) * 64 + len(insns) * INSN_BYTES + 64
    dram = Dram(size)
    for addr, data in chunks:
        dram.write(addr, np.frombuffer(data, dtype=np.uint8))
    shape = {"icb": icb, "ocb": ocb, "rows_per_block": rows, "blocks": blocks,
             "gemm_executions": blocks * rows * ocb * icb, "reset_executions": blocks * rows * ocb,
             "weight_bytes": icb * ocb * rb["wgt"], "input_bytes_per_block": rows * icb * rb["inp"]}
    return insns, dram, shape


def _measure(config: AcceleratorConfig, sim: str, blocks: int, timing: str, dram_model: str | None = None
             ) -> dict[str, Any]:
    insns, dram, shape = gemm_stream(config, blocks)
    job = job_from_program(config, insns, dram, label="gemm stream")
    expected = Dram(job.dram.size)
    expected.data[:] = job.dram
    model = TimingModel(config, TIMINGS[timing])
    stats = FunctionalSimulator(config, timing=model).run(expected, job.insn_addr, job.insn_count)
    job.timeout_cycles = 50 * (stats["gemm_execs"] + sum(stats["bytes"].values())) + 100_000
    dram_model = choose(sim, dram_model)
    result = run_jobs(config, sim, [job], timing=timing, dram_model=dram_model)[0]
    problem = check_job(config, result, expected.data, insns)
    counters = result.counters
    cycles = counters["cycles"]
    wall = result.report["wall_s"]
    bus_bytes = config.bus_width // 8
    return {
        "config": config.name,
        "workload": shape | {"instructions": len(insns), "macs": stats["macs"]},
        "bit_exact": not problem,
        "problem": problem,
        "cycles": cycles,
        "mac_active_cycles": counters["mac_active"],
        "mac_utilization": round(counters["mac_active"] / cycles, 4) if cycles else 0.0,
        "effective_gops": round(config.peak_gops * counters["mac_active"] / cycles, 2) if cycles else 0.0,
        "peak_gops": config.peak_gops,
        "busy": {u: counters[f"busy_{u}"] for u in UNIT_NAMES},
        "stall": {u: counters[f"stall_{u}"] for u in ("load", "compute", "store", "fetch")},
        "dram": {"read_beats": counters["rd_beats"], "write_beats": counters["wr_beats"],
                 "read_MBps": round(counters["rd_beats"] * bus_bytes * config.clock_mhz / cycles, 1),
                 "write_MBps": round(counters["wr_beats"] * bus_bytes * config.clock_mhz / cycles, 1)},
        "model_cycles": stats["cycles"],
        "model_error": round((stats["cycles"] - cycles) / cycles, 4) if cycles else None,
        "simulator": sim,
        "dram_model": dram_model,
        "sim_wall_s": round(wall, 2),
        "sim_cycles_per_s": round(cycles / wall) if wall else None,
    }


def bench_rtl(config_name: str = "default", *, blocks: int = 96, speed_config: str = "tiny",
              timing: str = "pynq", repeat: int = 1, **options: Any) -> dict[str, Any]:
    """MAC utilization of `config_name` on Verilator with the Pynq-like DRAM, and RTL simulation speed: of
    that run (``verilator_main``, the dpi DRAM model) beside the same stream on the AxiRam model
    (``verilator_main_axiram``), and on `speed_config` (small enough for Icarus; the median of `repeat`
    runs) on Verilator (dpi), Verilator with AxiRam (``verilator_axiram``) and Icarus.

    Cycle counts are deterministic; only the speeds vary from run to run. Other options of `weft bench`
    (``model``) do not apply and are refused. A progress bar on stderr (a terminal only) follows the runs.
    """

    if options:
        raise UsageError(f"bench rtl takes no option {', '.join(sorted(options))}")
    if repeat < 1:
        raise UsageError(f"repeat must be at least 1, got {repeat}")
    if not simulator_available("verilator"):
        raise UsageError("verilator is not installed: the RTL benchmark needs it")
    config = load_config(config_name)
    figures: dict[str, Any] = {"dram_model": {"name": timing, **TIMINGS[timing].to_dict()}}
    speed = load_config(speed_config)
    # (name in figures["speed"], simulator, DRAM model)
    runs_of = [("verilator", "verilator", "dpi"), ("verilator_axiram", "verilator", "axiram")]
    if simulator_available("icarus"):
        runs_of.append(("icarus", "icarus", "axiram"))
    calibrated = list({c.hash: c for c in (config, speed)}.values())
    with Progress(2 + len(runs_of) * repeat + len(calibrated), "bench rtl") as bar:
        figures["utilization"] = _measure(config, "verilator", blocks, timing, "dpi")
        bar.advance(note=f"{config.name} utilization: {figures['utilization']['cycles']:,} cycles")
        axiram = _measure(config, "verilator", blocks, timing, "axiram")
        bar.advance(note=f"{config.name} on AxiRam: {axiram['sim_cycles_per_s'] or 0:,} cycles/s")
        figures["speed"] = {}
        for name, sim, dram_model in runs_of:
            runs = []
            for _ in range(repeat):
                runs.append(_measure(speed, sim, 8, timing, dram_model))
                bar.advance(note=f"{speed.name} speed on {name}: {runs[-1]['sim_cycles_per_s'] or 0:,} cycles/s")
            runs.sort(key=lambda r: r["sim_cycles_per_s"] or 0)
            figures["speed"][name] = runs[len(runs) // 2] | {"repeats": repeat}
        # The timing model against the RTL on the random regression streams and a conv (weft.sim.timing).
        figures["timing_model"] = {}
        for c in calibrated:
            figures["timing_model"][c.name] = calibration_figures(c, timing=timing)
            bar.advance(note=f"{c.name} timing model against the RTL")
    keys = ("config", "dram_model", "cycles", "model_cycles", "model_error", "bit_exact", "sim_wall_s",
            "sim_cycles_per_s")
    figures["speed"]["verilator_main"] = {key: figures["utilization"][key] for key in keys}
    figures["speed"]["verilator_main_axiram"] = {key: axiram[key] for key in keys}
    return figures
