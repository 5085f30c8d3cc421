"""The timing model against the generated Verilog on Verilator (cocotb, the DRAM model with the same
DramTiming): cycle counts within 10% on the random regression streams and on a conv-shaped stream, and the
counters that follow from the stream alone (instructions, MAC/ALU cycles, DRAM beats) exactly equal."""

from __future__ import annotations

import pytest

from weft.config import PRESETS
from weft.sim.timing_calibrate import compare, conv_stream, directed_streams, random_streams

pytestmark = pytest.mark.rtl

TOLERANCE = 0.10


def check(comparisons) -> None:
    for c in comparisons:
        assert not c.problem, f"{c.name}: the RTL differs from the functional simulator: {c.problem}"
        assert not c.mismatched(), f"{c.name}: model vs RTL {c.mismatched()}"
        assert abs(c.error) <= TOLERANCE, (
            f"{c.name}: model {c.model['cycles']} cycles, RTL {c.rtl['cycles']} ({100 * c.error:+.1f}%)")


@pytest.mark.parametrize("timing", ["pynq", "ideal"])
def test_model_is_within_ten_percent_of_the_rtl_on_tiny(timing):
    config = PRESETS["tiny"]
    streams = [*random_streams(config, [0, 1, 2]), conv_stream(config, size=16)]
    if timing == "ideal":
        streams += directed_streams(config)
    check(compare(config, streams, timing=timing))


@pytest.mark.slow
def test_model_is_within_ten_percent_of_the_rtl_on_default():
    config = PRESETS["default"]
    check(compare(config, [*random_streams(config, [0, 1, 2]), conv_stream(config, size=28)], timing="pynq"))
