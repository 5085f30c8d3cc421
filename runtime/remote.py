"""Remote execution: a small HTTP server on the board runs artifacts the host sends.

Server (``python -m weft.runtime.remote --device pynq --bitstream weft.bit --port 9091``): stdlib
``http.server``, one request at a time, at most ``max_requests`` requests and ``idle_timeout_s`` seconds
between them, then it returns. ``POST /load`` (body: a .weft file) makes the session on the server's
device; ``POST /run`` (body: an .npz of inputs) answers an .npz of outputs with the run's figures
(seconds, cycles) in the ``X-Weft-Stats`` header; ``GET /health``. Errors answer JSON ``{"error": ...}``.

Client: ``InferenceSession(art, device="remote:HOST:PORT")``; a server that is gone or silent gives a
:class:`~weft.runtime.devices.DeviceError` naming the address. Imports the standard library and numpy.
"""

from __future__ import annotations

import http.client
import io
import json
import time
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import TYPE_CHECKING, Any

import numpy as np

from weft.runtime.devices import Device, DeviceError, register_device

if TYPE_CHECKING:
    from weft.config import AcceleratorConfig
    from weft.runtime.artifact import Artifact

__all__ = ["RemoteDevice", "RemoteServer", "main"]

#: Largest request body the server reads (an artifact of ResNet-18 is ~12 MB).
MAX_BODY = 512 << 20


def _npz(arrays: Mapping[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **{k: np.asarray(v) for k, v in arrays.items()})
    return buf.getvalue()


def _from_npz(data: bytes) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


class RemoteServer:
    """Serves sessions made by ``make_session(artifact) -> InferenceSession`` on `host`:`port` (0: any)."""

    def __init__(self, make_session: Callable[[Artifact], Any], host: str = "127.0.0.1", port: int = 0, *,
                 max_requests: int = 1000, idle_timeout_s: float = 600.0):
        self.make_session, self.max_requests = make_session, max_requests
        self.session: Any = None
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # quiet: the caller reports
                pass

            def do_GET(self) -> None:
                if self.path == "/health":
                    self._reply(200, json.dumps({"ok": True, "loaded": server.session is not None}).encode())
                else:
                    self._reply(404, json.dumps({"error": f"no such path {self.path}"}).encode())

            def do_POST(self) -> None:
                try:
                    length = int(self.headers.get("Content-Length", 0))
                    if length > MAX_BODY:
                        raise ValueError(f"request body of {length} bytes is over the {MAX_BODY}-byte limit")
                    body = self.rfile.read(length)
                    if self.path == "/load":
                        self._reply(200, json.dumps(server.load(body)).encode())
                    elif self.path == "/run":
                        outputs, stats = server.run(_from_npz(body))
                        self._reply(200, _npz(outputs), {"X-Weft-Stats": json.dumps(stats, default=str)})
                    else:
                        self._reply(404, json.dumps({"error": f"no such path {self.path}"}).encode())
                except Exception as err:  # the client gets the message; the server keeps serving
                    self._reply(400, json.dumps({"error": f"{type(err).__name__}: {err}"}).encode())

            def _reply(self, code: int, body: bytes, headers: Mapping[str, str] | None = None) -> None:
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body)

        self.httpd = _Server((host, port), Handler)
        self.httpd.timeout = idle_timeout_s
        self.address = self.httpd.server_address[:2]

    def load(self, data: bytes) -> dict[str, Any]:
        from weft.runtime.artifact import Artifact

        art = Artifact.from_bytes(data, "the artifact sent to the server")
        if self.session is not None:
            close = getattr(self.session.device, "close", None)
            if close is not None:
                close()
        self.session = self.make_session(art)
        return {"device": self.session.device.name, "config_hash": self.session.device.config.hash}

    def run(self, feeds: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        if self.session is None:
            raise DeviceError("no artifact is loaded: POST /load first")
        start = time.perf_counter()
        outputs = self.session.run(None, feeds)
        seconds = time.perf_counter() - start
        names = [o.name for o in self.session.get_outputs()]
        stats = self.session.stats or {}
        return dict(zip(names, outputs, strict=True)), {"seconds": seconds, "cycles": stats.get("cycles"),
                                                        "device": stats.get("device")}

    def serve(self) -> int:
        """Answer up to `max_requests` requests; stop early when none arrives within the idle timeout.
        Returns how many were answered."""
        answered = 0
        while answered < self.max_requests:
            self.httpd.got = False
            self.httpd.handle_request()  # returns after one request, or after the timeout with none
            if not self.httpd.got:
                break
            answered += 1
        self.httpd.server_close()
        return answered


class _Server(HTTPServer):
    """Notes whether ``handle_request`` answered a request or timed out."""

    got = False

    def finish_request(self, request: Any, client_address: Any) -> None:
        self.got = True
        super().finish_request(request, client_address)


class RemoteDevice(Device):
    """``device="remote:HOST:PORT"``: the artifact and inputs go to a :class:`RemoteServer`."""

    name = "remote"

    def __init__(self, config: AcceleratorConfig, *, target: str, timeout_s: float = 600.0):
        super().__init__(config)
        host, sep, port = target.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise DeviceError(f"device 'remote:{target}': expected remote:HOST:PORT")
        self.host, self.port, self.timeout_s = host, int(port), timeout_s
        self.last_stats: dict[str, Any] = {}

    def _request(self, method: str, path: str, body: bytes = b"") -> tuple[bytes, Mapping[str, str]]:
        where = f"{self.host}:{self.port}"
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        try:
            conn.request(method, path, body=body, headers={"Content-Type": "application/octet-stream"})
            resp = conn.getresponse()
            data = resp.read()
        except (OSError, http.client.HTTPException) as err:
            raise DeviceError(f"the remote server {where} is not answering ({type(err).__name__}: {err})") from None
        finally:
            conn.close()
        if resp.status != 200:
            try:
                message = json.loads(data)["error"]
            except (ValueError, KeyError):
                message = data[:200].decode(errors="replace")
            raise DeviceError(f"remote server {where}: {message}")
        return data, resp.headers

    def load(self, artifact: Artifact) -> None:
        super().load(artifact)
        self._request("POST", "/load", artifact.to_bytes())

    def run(self, feeds: Mapping[str, np.ndarray], *, keep_intermediates: bool = False
            ) -> tuple[dict[str, np.ndarray], dict[str, Any], dict[str, np.ndarray]]:
        if self.artifact is None:
            raise DeviceError("load an artifact before running")
        start = time.perf_counter()
        data, headers = self._request("POST", "/run", _npz(feeds))
        self.last_stats = json.loads(headers.get("X-Weft-Stats", "{}"))
        self.last_stats["round_trip_s"] = time.perf_counter() - start
        outputs = _from_npz(data)
        return outputs, {"cycles": self.last_stats.get("cycles"), "layers": []}, {}


def make_server(device: str = "fsim", host: str = "127.0.0.1", port: int = 0, *, max_requests: int = 1000,
                idle_timeout_s: float = 600.0, **device_options: Any) -> RemoteServer:
    """A server whose sessions run on `device` (options go to the device)."""
    from weft.runtime.session import InferenceSession

    return RemoteServer(lambda art: InferenceSession(art, device=device, **device_options), host, port,
                        max_requests=max_requests, idle_timeout_s=idle_timeout_s)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="weft remote server (run on the board)")
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=9091)
    parser.add_argument("--device", default="pynq")
    parser.add_argument("--bitstream", default=None, help="for --device pynq")
    parser.add_argument("--max-requests", type=int, default=10000)
    parser.add_argument("--idle-timeout", type=float, default=3600.0)
    args = parser.parse_args(argv)
    options = {"bitstream": args.bitstream} if args.bitstream else {}
    server = make_server(args.device, args.host, args.port, max_requests=args.max_requests,
                         idle_timeout_s=args.idle_timeout, **options)
    print(f"weft server on {server.address[0]}:{server.address[1]} (device {args.device})", flush=True)
    answered = server.serve()
    print(f"served {answered} requests", flush=True)
    return 0


register_device("remote", RemoteDevice)

if __name__ == "__main__":
    raise SystemExit(main())
