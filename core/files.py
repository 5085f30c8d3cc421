"""File writes that readers never see half done."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

__all__ = ["write_atomic"]


def write_atomic(path: str | Path, data: bytes) -> Path:
    """Write `data` to `path` through a temporary file in the same folder and a rename, so readers see
    the old file or the whole new one, and a failure leaves nothing behind."""
    path = Path(path)
    tmp = path.parent / f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    try:
        with open(tmp, "xb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
