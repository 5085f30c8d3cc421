"""File writes that readers never see half done, and the digest of a set of source files."""

from __future__ import annotations

import hashlib
import os
import secrets
from collections.abc import Iterable
from pathlib import Path

__all__ = ["sources_digest", "write_atomic"]


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


def sources_digest(paths: Iterable[Path], root: Path, *versions: str) -> str:
    """The sha256 (hex) of the files at `paths`, each with its path relative to `root` (a file renamed or moved
    counts as a change), and of `versions` (the tools the files' products also depend on): the key of a cache
    whose entries stand only while those files are what made them."""
    digest = hashlib.sha256()
    for version in versions:
        digest.update(version.encode() + b"\0")
    for path in paths:
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()
