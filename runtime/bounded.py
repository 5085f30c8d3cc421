"""Reading zip archives from the network with every size checked before it is read or decompressed.

A request body is attacker-sized: a few hundred KiB of deflate can expand to gigabytes. The declared
(header) sizes are summed and bounded first, then every member is streamed in chunks and its actual
decompressed bytes are counted, so a zip whose headers lie is refused too. Imports the standard library
and numpy.
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Mapping, Sequence

import numpy as np

from weft.errors import WeftError

__all__ = ["LimitError", "check_zip", "read_npz"]

_CHUNK = 1 << 20


class LimitError(WeftError, ValueError):
    """A body that is over a limit or malformed; the message is one line, safe to send to the client."""


def _open(data: bytes | bytearray, what: str) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError) as err:
        raise LimitError(f"{what} is not a zip file ({err})") from None


def _declared(zf: zipfile.ZipFile, what: str, max_bytes: int, max_members: int) -> None:
    infos = zf.infolist()
    if len(infos) > max_members:
        raise LimitError(f"{what} has {len(infos)} members, over the limit of {max_members}")
    total = sum(info.file_size for info in infos)
    if total > max_bytes:
        raise LimitError(f"{what} declares {total} bytes uncompressed, over the limit of {max_bytes}")


def _stream(zf: zipfile.ZipFile, info: zipfile.ZipInfo, budget: int, what: str, sink: bytearray | None) -> int:
    """Decompress `info` in chunks, stopping as soon as it exceeds `budget` or its declared size."""
    limit = min(budget, info.file_size)
    seen = 0
    try:
        with zf.open(info) as member:
            while chunk := member.read(min(_CHUNK, limit - seen + 1)):
                seen += len(chunk)
                if seen > limit:
                    raise LimitError(f"{what}: member '{info.filename}' decompresses past its declared "
                                     f"{info.file_size} bytes or the {budget}-byte limit")
                if sink is not None:
                    sink += chunk
    except (zipfile.BadZipFile, EOFError, OSError, NotImplementedError, RuntimeError) as err:
        raise LimitError(f"{what}: member '{info.filename}' is corrupt ({err})") from None
    if seen != info.file_size:
        raise LimitError(f"{what}: member '{info.filename}' has {seen} bytes, not the declared {info.file_size}")
    return seen


def check_zip(data: bytes | bytearray, what: str, *, max_bytes: int, max_members: int = 10000) -> None:
    """Refuse `data` unless it is a zip whose members decompress to at most `max_bytes` in all (checked on
    the headers, then on the bytes themselves, one chunk at a time, keeping none of them)."""
    with _open(data, what) as zf:
        _declared(zf, what, max_bytes, max_members)
        left = max_bytes
        for info in zf.infolist():
            left -= _stream(zf, info, left, what, None)


def read_npz(data: bytes | bytearray, inputs: Mapping[str, Sequence[int]], what: str, *, max_bytes: int
             ) -> dict[str, np.ndarray]:
    """The arrays of an .npz of feeds, each one's header checked against `inputs` (name -> shape) and
    its numeric dtype before any of its data is decompressed; at most `max_bytes` of data in all."""
    arrays: dict[str, np.ndarray] = {}
    with _open(data, what) as zf:
        _declared(zf, what, max_bytes, max_members=max(len(inputs), 1))
        left = max_bytes
        for info in zf.infolist():
            name = info.filename.removesuffix(".npy")
            if name not in inputs:
                raise LimitError(f"{what}: '{name}' is not an input of the model (inputs: {', '.join(inputs)})")
            if name in arrays:
                raise LimitError(f"{what}: input '{name}' is given twice")
            shape, dtype, header_len = _npy_header(zf, info, what)
            if list(shape) != list(inputs[name]):
                raise LimitError(f"{what}: input '{name}' must have shape {list(inputs[name])}, got {list(shape)}")
            nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            if info.file_size != header_len + nbytes:
                raise LimitError(f"{what}: input '{name}' declares {info.file_size} bytes, not the "
                                 f"{header_len + nbytes} its header implies")
            buf = bytearray()
            left -= _stream(zf, info, left, what, buf)
            arrays[name] = np.frombuffer(bytes(buf[header_len:]), dtype=dtype).reshape(shape)
    return arrays


def _npy_header(zf: zipfile.ZipFile, info: zipfile.ZipInfo, what: str) -> tuple[tuple[int, ...], np.dtype, int]:
    """(shape, dtype, header length) of an .npy member, reading only its header (a few hundred bytes)."""
    fmt = np.lib.format
    try:
        with zf.open(info) as member:
            version = fmt.read_magic(member)
            read = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
            shape, fortran, dtype = read(member, max_header_size=4096)
            header_len = member.tell()
    except (zipfile.BadZipFile, EOFError, OSError, NotImplementedError, RuntimeError) as err:
        raise LimitError(f"{what}: member '{info.filename}' is corrupt ({err})") from None
    except ValueError as err:
        raise LimitError(f"{what}: member '{info.filename}' is not an .npy array ({err})") from None
    if fortran or dtype.kind not in "biuf" or dtype.hasobject:
        raise LimitError(f"{what}: member '{info.filename}' must be a C-ordered numeric array, got {dtype}")
    return tuple(shape), dtype, header_len
