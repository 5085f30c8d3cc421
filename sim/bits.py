"""Bit-packed rows now live in :mod:`weft.isa.arith`; this name is kept only for ``runtime/qkernels.py`` and
``runtime/dram_runner.py``, which import it and are outside this change. Delete it once they import
:mod:`weft.isa.arith`."""

from weft.isa.arith import int_dtype, pack, unpack, wrap

__all__ = ["int_dtype", "pack", "unpack", "wrap"]
