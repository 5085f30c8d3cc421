"""The board server as a process (``python -m weft.runtime.remote`` on loopback): it refuses to listen
beyond loopback without a token and refuses clients without it, serves while a connection idles, checks
every size before reading or decompressing, and answers 64 concurrent clients correctly."""

from __future__ import annotations

import functools
import http.client
import io
import json
import os
import select
import socket
import struct
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable, Iterator

import numpy as np
import pytest

import weft
from weft.runtime.devices import DeviceError
from weft.runtime.remote import make_server
from weft.runtime.remote_device import TOKEN_ENV

from .driver_util import compiled

GiB = 1 << 30


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop(TOKEN_ENV, None)
    return env


def _command(port: int, *args: str) -> list[str]:
    return [sys.executable, "-m", "weft.runtime.remote", "--device", "fsim", "--port", str(port), *args]


@pytest.fixture
def start_server() -> Iterator[Callable[..., tuple[subprocess.Popen, int]]]:
    """start(*args) -> (process, port): a server on a free port, once it accepts; killed afterwards, and
    checked to have printed no traceback."""
    procs: list[subprocess.Popen] = []

    def start(*args: str) -> tuple[subprocess.Popen, int]:
        port = _free_port()
        proc = subprocess.Popen(_command(port, *args), env=_env(), stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        procs.append(proc)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                return proc, port
            except OSError:
                time.sleep(0.1)
        raise AssertionError(f"the server did not start: {proc.poll()}")

    yield start
    for proc in procs:
        proc.kill()
        _, err = proc.communicate(timeout=30)
        assert "Traceback" not in err, err


def _request(port: int, method: str, path: str, body: bytes | None = None,
             headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.putrequest(method, path)
        for k, v in (headers or {}).items():
            conn.putheader(k, v)
        conn.endheaders(body)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _error(port: int, *args, **kwargs) -> tuple[int, str]:
    status, body = _request(port, *args, **kwargs)
    return status, json.loads(body)["error"]


def _healthy(port: int) -> bool:
    return _request(port, "GET", "/health")[0] == 200


def _peak_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))


def test_refuses_to_listen_beyond_loopback_without_a_token():
    done = subprocess.run(_command(_free_port(), "--host", "0.0.0.0"), env=_env(), capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "token" in lines[0], done.stderr


def test_token_beyond_loopback(start_server, monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    _, port = start_server("--host", "0.0.0.0", "--token", "s3cret")
    art, feeds = compiled("mlp")
    assert _error(port, "GET", "/health")[0] == 401
    assert _error(port, "GET", "/health", headers={"Authorization": "Bearer wrong"})[0] == 401
    with pytest.raises(DeviceError, match="unauthorized"):
        weft.InferenceSession(art, device=f"remote:127.0.0.1:{port}")
    local = weft.InferenceSession(art, device="fsim").run(None, feeds)
    by_option = weft.InferenceSession(art, device=f"remote:127.0.0.1:{port}", token="s3cret").run(None, feeds)
    monkeypatch.setenv(TOKEN_ENV, "s3cret")  # the client reads the same variable
    by_env = weft.InferenceSession(art, device=f"remote:127.0.0.1:{port}").run(None, feeds)
    for out in (by_option, by_env):
        for a, b in zip(local, out, strict=True):
            np.testing.assert_array_equal(a, b)


def test_an_idle_connection_blocks_nobody(start_server):
    _, port = start_server()
    with socket.create_connection(("127.0.0.1", port)):  # never sends a byte
        start = time.monotonic()
        assert _healthy(port)
        assert time.monotonic() - start < 1.0


def test_content_length_is_checked_before_reading(start_server):
    _, port = start_server()
    for length, code in (("-1", 400), ("abc", 400), (str(1 << 40), 413)):
        status, message = _error(port, "POST", "/load", headers={"Content-Length": length})
        assert status == code and ("Content-Length" in message or "limit" in message), message
    status, message = _error(port, "POST", "/load")
    assert status == 411 and "Content-Length" in message
    assert _healthy(port)


@functools.cache
def _bomb(member: str, header: bytes = b"", mib: int = 1024) -> bytes:
    """A zip whose one member inflates to `header` and `mib` MiB of zeros (1 GiB: ~1 MiB), with an honest
    declared size (and no CRC: the server must refuse it before it gets that far). Built from one
    fully-flushed deflate block of 1 MiB of zeros repeated, which decodes on its own: compressing 1 GiB
    would take seconds."""
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    head = c.compress(header) + c.flush(zlib.Z_FULL_FLUSH)
    block = c.compress(bytes(1 << 20)) + c.flush(zlib.Z_FULL_FLUSH)
    data = head + block * mib + c.flush()
    name, size = member.encode(), len(header) + (mib << 20)
    local = struct.pack("<4s5H3L2H", b"PK\x03\x04", 20, 0, 8, 0, 0, 0, len(data), size, len(name), 0) + name
    central = struct.pack("<4s6H3L5H2L", b"PK\x01\x02", 20, 20, 0, 8, 0, 0, 0, len(data), size, len(name),
                          0, 0, 0, 0, 0, 0) + name
    end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 1, 1, len(central), len(local) + len(data), 0)
    return local + data + central + end


def _lying(data: bytes, size: int) -> bytes:
    """`data` (one member) with its declared uncompressed size rewritten to `size` in both headers."""
    out = bytearray(data)
    central = out.rindex(b"PK\x01\x02")
    out[22:26] = out[central + 24:central + 28] = size.to_bytes(4, "little")
    return bytes(out)


def _npy_header(name_shape: tuple[int, ...]) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": "<f4", "fortran_order": False, "shape": name_shape})
    return buf.getvalue()


def test_decompression_bombs_are_refused_in_bounded_memory(start_server):
    proc, port = start_server()
    art, feeds = compiled("mlp")
    (name, shape), = ((k, v.shape) for k, v in feeds.items())
    remote = weft.InferenceSession(art, device=f"remote:127.0.0.1:{port}")  # /run needs a loaded session
    load_bomb = _bomb("manifest.json")
    run_bomb = _bomb(f"{name}.npy", _npy_header((GiB // 4 - 32,)))
    # a member shaped like the input whose data runs on past the declared size (a lying header: zipfile stops
    # at the declared size and the CRC fails, or the guard's own count does)
    run_long = _lying(_bomb(f"{name}.npy", _npy_header(shape)), len(_npy_header(shape)) + 4 * int(np.prod(shape)))
    grown = {}
    for path, cases in (("/load", ((load_bomb, "declares"), (_lying(load_bomb, 1000), "corrupt|past"))),
                        ("/run", ((run_bomb, "declares|shape"), (_lying(run_bomb, 1000), "corrupt|shape"),
                                  (run_long, "corrupt|past")))):
        before = _peak_kib(proc.pid)
        for body, expect in cases:
            status, message = _error(port, "POST", path, body, {"Content-Length": str(len(body))})
            assert status == 400 and any(word in message for word in expect.split("|")), message
        grown[path] = (_peak_kib(proc.pid) - before) / 1024
    print(f"bombs of ~{len(load_bomb) >> 10} KiB inflating to 1 GiB: server peak memory (VmHWM) grew "
          f"{grown['/load']:.1f} MiB on /load, {grown['/run']:.1f} MiB on /run")
    assert max(grown.values()) < 64
    out = remote.run(None, feeds)  # still serving, with the session it had
    np.testing.assert_array_equal(out[0], weft.InferenceSession(art, device="fsim").run(None, feeds)[0])


def test_a_small_bomb_is_refused_by_its_ratio(start_server):
    _, port = start_server()
    body = _bomb("manifest.json", mib=200)  # under the artifact limit, but 1000 times its ~200 KiB
    status, message = _error(port, "POST", "/load", body, {"Content-Length": str(len(body))})
    assert status == 400 and "declares" in message, message


def test_64_concurrent_clients(start_server):
    _, port = start_server()
    art, feeds = compiled("mlp")
    local = weft.InferenceSession(art, device="fsim").run(None, feeds)
    results: list[object] = [None] * 64

    def client(i: int) -> None:
        try:
            results[i] = weft.InferenceSession(art, device=f"remote:127.0.0.1:{port}").run(None, feeds)
        except Exception as err:  # noted, checked below
            results[i] = err

    threads = [threading.Thread(target=client, args=(i,)) for i in range(64)]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    errors = [r for r in results if not isinstance(r, list)]
    print(f"64 clients (load + run each) in {time.monotonic() - start:.2f} s, {len(errors)} failed")
    assert not errors, errors[:3]
    for out in results:
        for a, b in zip(local, out, strict=True):
            np.testing.assert_array_equal(a, b)


def test_over_the_client_bound_answers_503():
    server = make_server("fsim", max_requests=3, idle_timeout_s=5.0, max_clients=1, conn_timeout_s=2.0)
    thread = threading.Thread(target=server.serve)
    thread.start()
    host, port = server.address
    try:
        with socket.create_connection((host, port)):  # holds the only slot, once the server has accepted it
            deadline = time.monotonic() + 10
            while server.clients < 1 and time.monotonic() < deadline:
                time.sleep(0.01)
            status, message = _error(port, "GET", "/health")
            assert status == 503 and "busy" in message
        while server.clients > 0 and time.monotonic() < deadline:  # the closed connection frees its slot
            time.sleep(0.01)
        assert _healthy(port)
    finally:
        thread.join(timeout=30)


def test_a_drip_fed_body_is_dropped():
    server = make_server("fsim", max_requests=2, idle_timeout_s=5.0, conn_timeout_s=0.5)
    thread = threading.Thread(target=server.serve)
    thread.start()
    host, port = server.address
    try:
        with socket.create_connection((host, port), timeout=10) as s:
            s.sendall(b"POST /load HTTP/1.0\r\nContent-Length: 100\r\n\r\n")
            reply = b""
            for _ in range(20):  # a byte every 0.2 s: each within the timeout, the whole far too slow
                if select.select([s], [], [], 0.2)[0]:
                    break  # the answer is there: stop sending, or the close would reset it
                s.sendall(b"x")
            while chunk := s.recv(4096):
                reply += chunk
        assert reply.startswith(b"HTTP/1.0 408") and b"too slow" in reply, reply
        assert _healthy(port)
    finally:
        thread.join(timeout=30)
