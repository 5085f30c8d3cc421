"""The cocotb test module the cosimulation driver runs: every job of a manifest, in order, on one
accelerator instance (its buffers keep their contents between jobs, as on the board).

The manifest (JSON, path in ``WEFT_COSIM_MANIFEST``) holds the config, the DRAM model's size and timing,
its image file and log when the design is ``weft_sim`` (``dpi``), and the jobs: each names an input
``.npz`` (``dram``, ``insn_addr``, ``insn_count``) where to write the final DRAM (``.npy``) and the run's
registers (``.json``), and optionally DRAM byte ranges that answer with bus errors (``faults``). Checking
is the driver's job.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import cocotb
import numpy as np

from weft.config import load_config
from weft.sim.cocotb_tb.dram import DramTiming
from weft.sim.cocotb_tb.tb import Testbench


@cocotb.test()
async def run_manifest(dut: object) -> None:
    manifest = json.loads(Path(os.environ["WEFT_COSIM_MANIFEST"]).read_text())
    config = load_config(manifest["config"])
    tb = Testbench(dut, config, dram_size=manifest["dram_size"], timing=DramTiming(**manifest["timing"]),
                   dpi=manifest.get("dpi"))
    await tb.reset()
    for job in manifest["jobs"]:
        with np.load(job["input"], allow_pickle=False) as z:
            image, insn_addr, insn_count = z["dram"], int(z["insn_addr"]), int(z["insn_count"])
        tb.load_dram(image)
        tb.dram.set_faults([(lo, hi) for lo, hi in job.get("faults", [])])
        started = time.perf_counter()
        result = await tb.run(insn_addr, insn_count, job["timeout_cycles"])
        wall = time.perf_counter() - started
        final = tb.read_dram(len(tb.dram.mem))
        np.save(job["dram_out"], final[:image.size], allow_pickle=False)
        outside = np.flatnonzero(final[image.size:])
        report = {
            **result.to_dict(), "wall_s": wall,
            "violations": tb.dram.take_violations(),
            "wrote_outside": int(image.size + outside[0]) if outside.size else None,
            "read_bursts": tb.dram.read_bursts, "write_bursts": tb.dram.write_bursts,
        }
        Path(job["report_out"]).write_text(json.dumps(report))
