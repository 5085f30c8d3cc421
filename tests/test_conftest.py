"""The `rtl` marker's simulator skip (tests/conftest.py), decided with a fake `installed`."""

from __future__ import annotations

import pytest

from weft.sim.simulators import SIMULATORS

from .conftest import missing_simulators

RTL = pytest.mark.rtl.mark
ICARUS = pytest.mark.rtl("icarus").mark
BOTH = pytest.mark.rtl("verilator", "icarus").mark


def _installed(*executables: str):
    return lambda sim: SIMULATORS[sim] in executables


@pytest.mark.parametrize(("marks", "installed", "missing"), [
    ([], (), []),                                      # not an rtl test: never skipped
    ([pytest.mark.slow.mark], (), []),
    ([RTL], ("verilator", "iverilog"), []),
    ([RTL], ("iverilog",), ["verilator"]),             # a bare mark needs Verilator
    ([RTL], ("verilator",), []),
    ([ICARUS], ("verilator",), ["iverilog"]),
    ([ICARUS], ("iverilog",), []),
    ([RTL, ICARUS], ("iverilog",), []),                # a module-wide bare mark and an Icarus parameter
    ([BOTH], ("verilator",), ["iverilog"]),
    ([BOTH], (), ["verilator", "iverilog"]),
    ([RTL, BOTH], ("verilator", "iverilog"), []),
])
def test_rtl_marks_name_the_simulators_a_test_needs(marks, installed, missing):
    assert missing_simulators(marks, installed=_installed(*installed)) == missing


def test_an_unknown_simulator_in_an_rtl_mark_is_refused():
    with pytest.raises(ValueError, match="modelsim"):
        missing_simulators([pytest.mark.rtl("modelsim").mark], installed=_installed())
