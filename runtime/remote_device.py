"""The client of a board server: ``InferenceSession(art, device="remote:HOST:PORT", token=...)``.

The artifact and inputs go to a :mod:`weft.runtime.remote` server over HTTP; the shared secret (option
``token``, else the ``WEFT_REMOTE_TOKEN`` environment variable) goes in an ``Authorization: Bearer``
header. A server that is gone or silent gives a :class:`~weft.runtime.devices.DeviceError` naming the
address. Imports the standard library and numpy.
"""

from __future__ import annotations

import http.client
import io
import json
import os
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from weft.runtime.devices import Device, DeviceError, register_device

if TYPE_CHECKING:
    from weft.config import AcceleratorConfig
    from weft.core.artifact import Artifact

__all__ = ["TOKEN_ENV", "RemoteDevice", "npz_bytes"]

#: The environment variable both the server and the client read the shared secret from.
TOKEN_ENV = "WEFT_REMOTE_TOKEN"


def npz_bytes(arrays: Mapping[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **{k: np.asarray(v) for k, v in arrays.items()})
    return buf.getvalue()


class RemoteDevice(Device):
    """``device="remote:HOST:PORT"``: the artifact and inputs go to a :class:`~weft.runtime.remote.RemoteServer`."""

    name = "remote"

    def __init__(self, config: AcceleratorConfig, *, target: str, timeout_s: float = 600.0,
                 token: str | None = None):
        super().__init__(config)
        host, sep, port = target.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise DeviceError(f"device 'remote:{target}': expected remote:HOST:PORT")
        self.host, self.port, self.timeout_s = host.strip("[]"), int(port), timeout_s
        self.token = token if token is not None else os.environ.get(TOKEN_ENV) or None
        self.last_stats: dict[str, Any] = {}

    def _request(self, method: str, path: str, body: bytes = b"") -> tuple[bytes, Mapping[str, str]]:
        where = f"{self.host}:{self.port}"
        headers = {"Content-Type": "application/octet-stream"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        try:
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
        except (OSError, http.client.HTTPException) as err:
            raise DeviceError(f"the remote server {where} is not answering ({type(err).__name__}: {err})") from None
        finally:
            conn.close()
        if resp.status != 200:
            try:
                message = json.loads(data)["error"]
            except (ValueError, KeyError, TypeError):
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
        data, headers = self._request("POST", "/run", npz_bytes(feeds))
        self.last_stats = json.loads(headers.get("X-Weft-Stats", "{}"))
        self.last_stats["round_trip_s"] = time.perf_counter() - start
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            outputs = {k: z[k] for k in z.files}
        return outputs, {"cycles": self.last_stats.get("cycles"), "layers": []}, {}


register_device("remote", RemoteDevice)
