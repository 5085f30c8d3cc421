"""Cosimulation of the larger presets on Verilator, and the MAC-utilization target (slow: minutes each,
most of it the first Verilator build of a config). CI runs the bounded subset named in ``.ci/run`` (the
non-square, narrow-bus ``rect`` preset); ``make test-slow`` runs them all."""

from __future__ import annotations

import pytest

from weft.config import PRESETS
from weft.sim.bench_rtl import bench_rtl
from weft.sim.cosim import run_random

pytestmark = [pytest.mark.slow, pytest.mark.rtl]


@pytest.mark.parametrize(("name", "seeds", "timing"), [
    pytest.param("default", [0, 1, 2], "stress", id="default-stress"),
    pytest.param("rect", [0, 1, 2, 3], "stress", id="rect-stress"),
    pytest.param("rect", [4, 5], "pynq", id="rect-pynq"),
    # the largest preset: a 32x32 array on a 128-bit bus (a minute or two to build)
    pytest.param("zcu104", [0, 1, 2], "stress", id="zcu104-stress"),
])
def test_random_programs_match_the_functional_simulator(name, seeds, timing):
    report = run_random(PRESETS[name], "verilator", seeds, n_insns=150, timing=timing)
    assert report.failed == 0, report.summary()["failures"]


def test_gemm_bound_stream_keeps_the_macs_busy_on_default():
    figures = bench_rtl("default", speed_config="tiny")
    main = figures["utilization"]
    assert main["bit_exact"], main["problem"]
    assert main["mac_utilization"] >= 0.90, main
    assert figures["speed"]["verilator"]["sim_cycles_per_s"] > 0
