"""Remote execution on loopback: the server runs the functional simulator (and the RTL), the client
gets outputs equal to the local run, timings, clean errors, and a bounded request loop."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import weft
from weft.runtime.devices import DeviceError
from weft.runtime.remote import make_server

from .driver_util import compiled


def _serving(device="fsim", max_requests=20, **options):
    server = make_server(device, max_requests=max_requests, idle_timeout_s=30.0, **options)
    answered: list[int] = []
    thread = threading.Thread(target=lambda: answered.append(server.serve()), daemon=True)
    thread.start()
    host, port = server.address
    return server, thread, answered, f"remote:{host}:{port}"


@pytest.mark.parametrize("device", [
    "fsim",
    pytest.param("rtl", marks=pytest.mark.rtl),
])
def test_remote_run_matches_local(device):
    art, feeds = compiled("mlp")
    local = weft.InferenceSession(art, device="fsim").run(None, feeds)
    server, thread, answered, name = _serving(device, max_requests=3)
    try:
        sess = weft.InferenceSession(art, device=name)  # request 1: load
        out = sess.run(None, feeds)  # request 2: run
        for a, b in zip(local, out, strict=True):
            np.testing.assert_array_equal(a, b)
        stats = sess.device.last_stats
        assert stats["seconds"] > 0 and stats["round_trip_s"] >= stats["seconds"] and stats["device"] == device
        with pytest.raises(DeviceError, match=r"remote server .*(FeedError|input)"):
            sess.run(None, {"nope": np.zeros(3, np.float32)})  # request 3: a clean error, server still up
        thread.join(timeout=60)
        assert answered == [3]  # the loop is bounded: it stopped after max_requests
        with pytest.raises(DeviceError, match="is not answering"):
            sess.run(None, feeds)  # the server is gone
    finally:
        if server.session is not None and hasattr(server.session.device, "close"):
            server.session.device.close()


def test_remote_needs_an_address():
    art, _ = compiled("mlp")
    with pytest.raises(DeviceError, match="remote:HOST:PORT"):
        weft.InferenceSession(art, device="remote:nowhere")


def test_idle_server_stops():
    server = make_server("fsim", max_requests=5, idle_timeout_s=0.2)
    assert server.serve() == 0


def test_beyond_loopback_needs_a_token():
    with pytest.raises(DeviceError, match="without a token"):
        make_server("fsim", host="0.0.0.0")
