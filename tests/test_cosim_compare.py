"""How a cosimulation mismatch is reported: the first differing DRAM byte and the STORE that wrote it
(no simulator needed)."""

from __future__ import annotations

import numpy as np

from weft.config import PRESETS
from weft.isa import ProgramBuilder
from weft.sim.cosim import JobResult, check_job, compare

CONFIG = PRESETS["tiny"]
ROW = CONFIG.out_row_bits // 8


def _program() -> np.ndarray:
    p = ProgramBuilder()
    p.store(0, 10, 2, 3, stride=5)  # DRAM rows 10..12 and 15..17
    p.store(0, 16, 1, 4)  # rows 16..19: overwrites part of the first store
    p.finish()
    return p.insns


def test_compare_names_the_first_byte_and_the_last_store_covering_it():
    insns = _program()
    expected = np.zeros(4096, dtype=np.uint8)
    got = expected.copy()
    assert compare(CONFIG, expected, got, insns) is None
    got[17 * ROW + 1] = 0x5A
    got[11 * ROW] = 0x01
    mismatch = compare(CONFIG, expected, got, insns)
    assert mismatch.address == 11 * ROW and mismatch.got == 0x01 and mismatch.differing_bytes == 2
    assert mismatch.writer == 0
    got[11 * ROW] = 0
    mismatch = compare(CONFIG, expected, got, insns)
    assert mismatch.address == 17 * ROW + 1 and mismatch.writer == 1  # the later store wins
    assert "instruction 1 (STORE" in str(mismatch)
    got[:] = 0
    got[3000] = 7
    assert "not written by any STORE" in str(compare(CONFIG, expected, got, insns))


def test_check_job_reports_timeouts_errors_and_rule_violations_before_data():
    insns = _program()
    image = np.zeros(256, dtype=np.uint8)
    report = {"timed_out": False, "status": {"busy": 0, "done": 1, "error": 0}, "error_code": 0,
              "error_index": 0, "violations": [], "wrote_outside": None, "counters": {"cycles": 10}}
    assert check_job(CONFIG, JobResult(image, report), image, insns) == ""
    assert "timed out" in check_job(CONFIG, JobResult(image, report | {"timed_out": True, "sim_cycles": 9}),
                                    image, insns)
    failed = report | {"status": {"busy": 0, "done": 1, "error": 1}, "error_code": 2, "error_index": 1}
    assert "ILLEGAL_MEM_ID at instruction 1" in check_job(CONFIG, JobResult(image, failed), image, insns)
    broken = report | {"violations": ["read burst at 0x00000ff8 (2 beats): crosses a 4 KiB boundary"]}
    assert "4 KiB" in check_job(CONFIG, JobResult(image, broken), image, insns)
