"""The board server: ``python -m weft.runtime.remote --device pynq --bitstream weft.bit --port 9091``.

Stdlib ``http.server``, threaded: each connection has a socket timeout and at most ``max_clients`` are
served at once (one over the bound gets 503); the device is used by one request at a time. It listens on
loopback unless told otherwise, and beyond loopback it refuses to start without a shared secret
(``--token`` or ``WEFT_REMOTE_TOKEN``), which every request must then carry as ``Authorization: Bearer``.
Every body size is checked before it is read or decompressed (:mod:`weft.runtime.bounded`).

``POST /load`` (body: a .weft file) makes the session on the server's device; ``POST /run`` (body: an .npz
of inputs) answers an .npz of outputs with the run's figures (seconds, cycles) in the ``X-Weft-Stats``
header; ``GET /health``. Errors answer JSON ``{"error": "one line"}``. The client is
:class:`~weft.runtime.remote_device.RemoteDevice` (``device="remote:HOST:PORT"``); this module registers
no device, so ``python -m`` can run it after ``weft.runtime`` has been imported.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import os
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

import numpy as np

from weft.core.artifact import Artifact
from weft.errors import WeftError
from weft.runtime.bounded import check_zip, read_npz
from weft.runtime.devices import DeviceError
from weft.runtime.remote_device import TOKEN_ENV, RemoteDevice, npz_bytes
from weft.runtime.session import InferenceSession

if TYPE_CHECKING:
    from weft.core.artifact import Artifact

__all__ = ["MAX_BODY", "RemoteDevice", "RemoteServer", "is_loopback", "main", "make_server"]

#: Largest request body the server reads (an artifact of ResNet-18 is ~12 MB).
MAX_BODY = 256 << 20
#: Largest an artifact may decompress to, all members together.
MAX_ARTIFACT_BYTES = 512 << 20
#: An artifact's arrays are stored, only its manifest is deflated: a body may decompress to this many times
#: its size (plus ARTIFACT_SLACK) and no more, so memory follows what the client actually sent.
ARTIFACT_RATIO, ARTIFACT_SLACK = 8, 16 << 20
#: Largest the inputs of one run may decompress to.
MAX_FEED_BYTES = 64 << 20
#: Bytes of request bodies held at once, all clients together (over it: 503).
MAX_INFLIGHT = 1 << 30
#: A body arriving slower than this (bytes/s, after the connection timeout) is dropped: a client that
#: drip-feeds one byte per timeout would otherwise hold its slot for ever.
MIN_UPLOAD_RATE = 64 << 10
#: An unread body up to this size is read and dropped before an error reply: closing with unread bytes
#: resets the connection, and the client would see the reset instead of the message.
DRAIN_LIMIT = 1 << 20


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class _HttpError(Exception):
    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


class RemoteServer:
    """Serves sessions made by ``make_session(artifact) -> InferenceSession`` on `host`:`port` (0: any).

    `token` is required when `host` is not a loopback address (DeviceError otherwise)."""

    def __init__(self, make_session: Callable[[Artifact], Any], host: str = "127.0.0.1", port: int = 0, *,
                 max_requests: int = 1000, idle_timeout_s: float = 600.0, token: str | None = None,
                 max_clients: int = 64, conn_timeout_s: float = 20.0):
        if not token and not is_loopback(host):
            raise DeviceError(f"refusing to listen on {host} without a token: pass --token or set {TOKEN_ENV}, "
                              "or listen on 127.0.0.1")
        self.make_session, self.max_requests, self.token = make_session, max_requests, token
        self.session: Any = None
        self.device_lock = threading.Lock()  # one board: one load or run at a time
        self.slots = threading.BoundedSemaphore(max_clients)
        self.clients = 0  # connections holding a slot (what the bound counts), for tests and monitoring
        self.inflight, self.inflight_lock = 0, threading.Lock()
        self.httpd = _Server(self, (host.strip("[]"), port), conn_timeout_s, 2 * max_clients,
                             socket.AF_INET6 if ":" in host else socket.AF_INET)
        self.httpd.timeout = idle_timeout_s
        self.address = self.httpd.server_address[:2]

    def authorized(self, header: str | None) -> bool:
        if not self.token:
            return True
        scheme, _, given = (header or "").partition(" ")
        return scheme == "Bearer" and hmac.compare_digest(given.encode(), self.token.encode())

    def reserve(self, nbytes: int) -> bool:
        """Count `nbytes` of body against MAX_INFLIGHT (False: over it); ``release`` them when done."""
        with self.inflight_lock:
            if self.inflight + nbytes > MAX_INFLIGHT:
                return False
            self.inflight += nbytes
            return True

    def release(self, nbytes: int) -> None:
        with self.inflight_lock:
            self.inflight -= nbytes

    def load(self, data: bytes | bytearray) -> dict[str, Any]:
        budget = min(MAX_ARTIFACT_BYTES, ARTIFACT_RATIO * len(data) + ARTIFACT_SLACK)
        check_zip(data, "the artifact", max_bytes=budget)
        art = Artifact.from_bytes(data, "the artifact sent to the server")
        with self.device_lock:
            if self.session is not None:
                close = getattr(self.session.device, "close", None)
                if close is not None:
                    close()
                self.session = None
            self.session = self.make_session(art)
            return {"device": self.session.device.name, "config_hash": self.session.device.config.hash}

    def run(self, body: bytes | bytearray) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        with self.device_lock:
            if self.session is None:
                raise DeviceError("no artifact is loaded: POST /load first")
            inputs = {i.name: i.shape for i in self.session.get_inputs()}
            feeds = read_npz(body, inputs, "the inputs", max_bytes=MAX_FEED_BYTES)
            start = time.perf_counter()
            outputs = self.session.run(None, feeds)
            seconds = time.perf_counter() - start
            names = [o.name for o in self.session.get_outputs()]
            stats = self.session.stats or {}
        return dict(zip(names, outputs, strict=True)), {"seconds": seconds, "cycles": stats.get("cycles"),
                                                        "device": stats.get("device")}

    def serve(self) -> int:
        """Accept up to `max_requests` connections; stop early when none arrives within the idle timeout
        while none is being answered. Returns how many were accepted; those still being answered are
        finished first."""
        answered = 0
        while answered < self.max_requests:
            self.httpd.got = False
            self.httpd.handle_request()  # returns after one accept, or after the timeout with none
            if self.httpd.got:
                answered += 1
            elif not self.httpd.active:
                break
        self.httpd.server_close()  # joins the handler threads
        return answered


class _Server(ThreadingHTTPServer):
    """One thread per connection; notes whether ``handle_request`` accepted one and how many are open."""

    request_queue_size = 128  # 64 clients connecting at once must not overflow the listen backlog
    daemon_threads = False  # server_close joins them: no request is cut off
    got = False

    def __init__(self, remote: RemoteServer, address: tuple[str, int], conn_timeout_s: float, max_open: int,
                 family: socket.AddressFamily):
        self.remote, self.address_family = remote, family
        self.conn_timeout_s, self.max_open = conn_timeout_s, max_open
        self.active, self.active_lock = 0, threading.Lock()
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        self.got = True
        request.settimeout(self.conn_timeout_s)
        with self.active_lock:
            flood = self.active >= self.max_open
            self.active += not flood
        if flood:  # past twice the client bound not even a 503 thread: the connection is closed
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self.active_lock:
                self.active -= 1

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that hangs up or times out is not the server's error: no traceback


class _Handler(BaseHTTPRequestHandler):
    """One connection of the board server: its client slot, then GET/POST answered through ``_answer``,
    which turns every failure into a one-line JSON error reply."""

    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # quiet: the caller reports
        pass

    def handle(self) -> None:
        self.remote = self.server.remote
        self.busy = not self.remote.slots.acquire(blocking=False)
        if self.busy:  # only a 503 to send: no long wait for the request
            self.connection.settimeout(min(2.0, self.connection.gettimeout() or 2.0))
        else:
            with self.remote.inflight_lock:
                self.remote.clients += 1
        try:
            super().handle()
        finally:
            if not self.busy:
                with self.remote.inflight_lock:
                    self.remote.clients -= 1
                self.remote.slots.release()

    def do_GET(self) -> None:
        self._answer(lambda: (json.dumps({"ok": True, "loaded": self.remote.session is not None}).encode(), {}),
                     {"/health"})

    def do_POST(self) -> None:
        self._answer(self._post, {"/load", "/run"})

    def _post(self) -> tuple[bytes, Mapping[str, str]]:
        body = self._body()
        if self.path == "/load":
            return json.dumps(self.remote.load(body)).encode(), {}
        outputs, stats = self.remote.run(body)
        return npz_bytes(outputs), {"X-Weft-Stats": json.dumps(stats, default=str)}

    def _answer(self, work: Callable[[], tuple[bytes, Mapping[str, str]]], paths: set[str]) -> None:
        self.body_read, self.reserved = False, 0
        try:
            if self.busy:
                raise _HttpError(503, "the server is busy: too many clients, try again")
            if not self.remote.authorized(self.headers.get("Authorization")):
                raise _HttpError(401, "unauthorized: send the server's token as 'Authorization: Bearer ...'")
            if self.path not in paths:
                raise _HttpError(404, f"no such path {self.path}")
            body, headers = work()
            self._reply(200, body, headers)
        except _HttpError as err:
            self._error(err.code, str(err))
        except WeftError as err:  # the client's input: LimitError, ArtifactError, FeedError
            self._error(400, f"{type(err).__name__}: {err}")
        except OSError:
            raise  # the connection is gone: nobody to answer
        except Exception as err:  # a fault on the server side: the client gets the message, no traceback
            self._error(500, f"{type(err).__name__}: {err}")
        finally:
            self.remote.release(self.reserved)

    def _body(self) -> bytearray:
        """The request body, after checking its declared length (a missing, negative or oversized
        Content-Length is refused before anything is read), arriving at MIN_UPLOAD_RATE or faster."""
        declared = self.headers.get("Content-Length")
        if declared is None:
            raise _HttpError(411, "Content-Length is required")
        if not declared.strip().isdigit():
            raise _HttpError(400, f"Content-Length must be a non-negative integer, got {declared[:40]!r}")
        length = int(declared)
        if length > MAX_BODY:
            raise _HttpError(413, f"request body of {length} bytes is over the {MAX_BODY}-byte limit")
        if not self.remote.reserve(length):
            raise _HttpError(503, "the server is busy: too many bytes in flight, try again")
        self.reserved = length
        self.body_read = True  # from here on an error closes the connection without draining
        body, got = bytearray(length), 0
        deadline = time.monotonic() + (self.connection.gettimeout() or 0) + length / MIN_UPLOAD_RATE
        while got < length:
            if time.monotonic() > deadline:
                raise _HttpError(408, f"request body too slow: {got} of {length} bytes in time")
            n = self.rfile.readinto1(memoryview(body)[got:got + (1 << 20)])
            if not n:
                raise _HttpError(400, f"request body ended after {got} of {length} bytes")
            got += n
        return body

    def _error(self, code: int, message: str) -> None:
        self.close_connection = True
        declared = self.headers.get("Content-Length", "")
        if not self.body_read and declared.isdigit() and int(declared) <= DRAIN_LIMIT:
            self.rfile.read(int(declared))
        line = " ".join(message.split())[:500]
        self._reply(code, json.dumps({"error": line}).encode())

    def _reply(self, code: int, body: bytes, headers: Mapping[str, str] | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "application/json" if code != 200 or self.path != "/run"
                         else "application/octet-stream")
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)


def make_server(device: str = "fsim", host: str = "127.0.0.1", port: int = 0, *, max_requests: int = 1000,
                idle_timeout_s: float = 600.0, token: str | None = None, max_clients: int = 64,
                conn_timeout_s: float = 20.0, **device_options: Any) -> RemoteServer:
    """A server whose sessions run on `device` (options go to the device)."""
    return RemoteServer(lambda art: InferenceSession(art, device=device, **device_options), host, port,
                        max_requests=max_requests, idle_timeout_s=idle_timeout_s, token=token,
                        max_clients=max_clients, conn_timeout_s=conn_timeout_s)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="weft remote server (run on the board)")
    parser.add_argument("--host", default="127.0.0.1", help="beyond loopback a token is required")
    parser.add_argument("--port", type=int, default=9091)
    parser.add_argument("--token", default=None, help=f"shared secret (better: the {TOKEN_ENV} environment variable)")
    parser.add_argument("--device", default="pynq")
    parser.add_argument("--bitstream", default=None, help="for --device pynq")
    parser.add_argument("--max-requests", type=int, default=10000)
    parser.add_argument("--max-clients", type=int, default=64)
    parser.add_argument("--idle-timeout", type=float, default=3600.0)
    args = parser.parse_args(argv)
    options = {"bitstream": args.bitstream} if args.bitstream else {}
    token = args.token or os.environ.get(TOKEN_ENV) or None
    try:
        server = make_server(args.device, args.host, args.port, max_requests=args.max_requests,
                             idle_timeout_s=args.idle_timeout, token=token, max_clients=args.max_clients,
                             **options)
    except (DeviceError, OSError) as err:
        print(f"weft server: {err}", file=sys.stderr, flush=True)
        return 2
    print(f"weft server on {server.address[0]}:{server.address[1]} (device {args.device}"
          f"{', token required' if token else ''})", flush=True)
    answered = server.serve()
    print(f"served {answered} requests", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
