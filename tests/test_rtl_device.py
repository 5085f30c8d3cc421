"""The "rtl" device: compiled models through the driver on the generated Verilog (Verilator), equal to
the functional simulator and the reference to the bit; the watchdog names a stuck unit and the session
runs again afterwards."""

from __future__ import annotations

import numpy as np
import pytest

import weft
from weft.runtime.driver import WatchdogError

from .driver_util import RTL_SIMULATORS, compiled

pytestmark = pytest.mark.rtl


@pytest.fixture(scope="module", params=RTL_SIMULATORS)
def mlp_rtl(request):
    art, feeds = compiled("mlp")
    sess = weft.InferenceSession(art, device="rtl", simulator=request.param, timing="pynq", read_latency=8)
    yield art, feeds, sess
    sess.device.close()


def test_rtl_equals_fsim_equals_ref(mlp_rtl):
    art, feeds, sess = mlp_rtl
    ref = weft.InferenceSession(art, device="ref").run(None, feeds)
    fsim = weft.InferenceSession(art, device="fsim").run(None, feeds)
    out = sess.run(None, feeds)
    for r, f, d in zip(ref, fsim, out, strict=True):
        np.testing.assert_array_equal(r, f)
        np.testing.assert_array_equal(f, d)
    stats = sess.stats
    assert stats["device"] == "rtl" and stats["cycles"] > 0


def test_watchdog_names_the_stuck_unit_and_the_session_recovers(mlp_rtl):
    _, feeds, sess = mlp_rtl
    driver = sess.device.driver
    backend = sess.device.hardware.backend
    expected = sess.run(None, feeds)

    def break_dram() -> None:
        backend.wait_irq(300)  # let fetch and the load unit get going, then stop answering reads
        backend.hold_dram()

    driver.on_start, driver.timeout_s = break_dram, 3.0
    with pytest.raises(WatchdogError, match="watchdog") as info:
        sess.run(None, feeds)
    report = info.value.report
    assert report["stuck"], report
    assert any(s["state"] in ("busy", "stalled", "waiting") for s in report["stuck"])
    assert "unit" in str(info.value)
    driver.on_start, driver.timeout_s = None, 600.0
    again = sess.run(None, feeds)  # the simulation was restarted: the session still works
    for a, b in zip(expected, again, strict=True):
        np.testing.assert_array_equal(a, b)


def test_small_cnn_on_rtl_equals_fsim_equals_ref():
    """The issue's bar: a compiled small CNN (the digits CNN: two convolutions, one stride 2, and a dense
    layer) on `tiny`, through the driver on Verilator, to the bit."""
    art, feeds = compiled("digits_cnn")
    ref = weft.InferenceSession(art, device="ref").run(None, feeds)
    fsim = weft.InferenceSession(art, device="fsim").run(None, feeds)
    sess = weft.InferenceSession(art, device="rtl", simulator="verilator", timing="pynq", read_latency=8)
    try:
        out = sess.run(None, feeds)
        assert sess.stats["cycles"] > 0
    finally:
        sess.device.close()
    assert len(out) == len(ref)
    for r, f, d in zip(ref, fsim, out, strict=True):
        np.testing.assert_array_equal(r, f)
        np.testing.assert_array_equal(f, d)
