"""Cosimulation of the larger presets on Verilator, whole networks on the RTL device, and the MAC-utilization
target (slow: minutes each, most of it the first Verilator build of a config). CI runs the bounded subset
named in ``.ci/run`` (the non-square, narrow-bus ``rect`` preset, and a small network end to end);
``make test-slow`` runs them all."""

from __future__ import annotations

import numpy as np
import pytest

from weft.compiler import models
from weft.config import PRESETS
from weft.sim.bench_rtl import bench_rtl
from weft.sim.cosim import run_random

from .driver_util import rtl_equals_fsim
from .test_e2e import _compile, _shape
from .test_frontend_util import rand

pytestmark = [pytest.mark.slow, pytest.mark.rtl]

#: The random regression's programs per preset and DRAM model, run in batches of one simulator process each.
REGRESSION_PROGRAMS = 1000
REGRESSION_BATCH = 100
#: Where `weft demo` puts the torchvision ResNet-18.


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
    # the DRAM model inside the design against AxiRam on the same stream: same cycles, far less wall time
    dpi, axiram = figures["speed"]["verilator_main"], figures["speed"]["verilator_main_axiram"]
    assert dpi["cycles"] == axiram["cycles"] and dpi["bit_exact"] and axiram["bit_exact"]
    assert dpi["sim_cycles_per_s"] > 5 * axiram["sim_cycles_per_s"]


@pytest.mark.parametrize("dram_model", ["dpi", "axiram"])
@pytest.mark.parametrize("name", ["tiny", "default", "rect", "zcu104"])
def test_a_thousand_random_programs_per_preset_under_stress_timing(name, dram_model):
    """The issue's regression: 1,000 random programs per preset, on the DRAM model inside the design and on
    AxiRam, under random stalls; 0 mismatches."""
    for first in range(0, REGRESSION_PROGRAMS, REGRESSION_BATCH):
        report = run_random(PRESETS[name], "verilator", range(first, first + REGRESSION_BATCH), n_insns=150,
                            timing="stress", dram_model=dram_model)
        assert report.failed == 0, report.summary()["failures"]


def _rtl_against_fsim(art, feeds: dict[str, np.ndarray], chains: bool = True) -> list[tuple[str, int, int]]:
    """Runs `art` on fsim and on the RTL (Verilator, the dpi DRAM model, Pynq timing), asserts the outputs
    are bit-exact and the total cycles within 1% of the timing model's; returns (layer, RTL cycles, model
    cycles) per accelerator program (a layer, or a chain of them by its first layer), printed as a table."""
    fsim, stats = rtl_equals_fsim(art, feeds, chains=chains)
    # A chain of layers runs as one program (weft.compiler.backend.chain): the RTL counts it as a whole (on
    # its first layer), the model splits it by layer; a row per program.
    model: dict[str, int] = {}
    for layer in fsim.stats["layers"]:
        if layer["cycles"] is not None:
            key = layer.get("chain", layer["name"])
            model[key] = model.get(key, 0) + layer["cycles"]
    rows = [(layer["name"], layer["cycles"], model[layer["name"]]) for layer in stats["layers"]
            if layer["cycles"] is not None and layer.get("chain", layer["name"]) == layer["name"]]
    print(f"\n{'layer':<28} {'RTL cycles':>12} {'model':>12} {'error':>8}")
    for name, cycles, predicted in rows:
        print(f"{name:<28} {cycles:>12,} {predicted:>12,} {(predicted - cycles) / cycles:>8.2%}")
    total, predicted = stats["cycles"], fsim.stats["cycles"]
    print(f"{'total':<28} {total:>12,} {predicted:>12,} {(predicted - total) / total:>8.2%}")
    assert total == sum(r[1] for r in rows)
    assert abs(predicted - total) <= 0.01 * total
    return rows


def test_small_network_end_to_end_on_the_rtl():
    """The CI subset's network: the small ResNet compiled for default, bit-exact on the RTL and within 1% of
    the timing model, its accelerator layers as one chain's program and layer by layer."""
    model = models.MODELS["small_resnet"]()
    input_name, shape = _shape(model)
    art, feeds = _compile(model, "default"), {input_name: rand(*shape, seed=3)}
    assert len(_rtl_against_fsim(art, feeds)) == 1
    assert len(_rtl_against_fsim(art, feeds, chains=False)) > 3


def test_resnet18_on_the_rtl():
    """The whole ResNet-18 (the graph ``weft demo`` runs, built as torchvision exports it) on default through
    the RTL device: bit-exact with fsim, total cycles within 1% of the timing model, as the runtime runs it
    (its accelerator layers as one chain's program) and layer by layer, with a per-layer table (pytest -s
    shows it)."""
    model = models.MODELS["resnet18"]()
    input_name, shape = _shape(model)
    art, feeds = _compile(model, "default"), {input_name: rand(*shape, seed=0)}
    assert len(_rtl_against_fsim(art, feeds)) == 1
    assert len(_rtl_against_fsim(art, feeds, chains=False)) >= 20
