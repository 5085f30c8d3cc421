"""Helpers shared by the artifact tests (no tests here): an artifact's zip members, and zipping them back."""

from __future__ import annotations

import io
import zipfile

__all__ = ["members_of", "rezip"]


def members_of(data: bytes) -> dict[str, bytes]:
    """Every member of an artifact's bytes, by name."""
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        return {n: zf.read(n) for n in zf.namelist()}


def rezip(members: dict[str, bytes]) -> bytes:
    """Members zipped back into artifact bytes, in the order given (no checksums recomputed)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buf.getvalue()
