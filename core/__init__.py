"""weft.core: what the compiler and the runtime both build on, so that neither imports the other.

The IR (:mod:`~weft.core.ir`), the float kernels every host layer runs (:mod:`~weft.core.float_ops`), the
integer kernels and the epilogue of quantized layers (:mod:`~weft.core.qkernels`, :mod:`~weft.core.epilogue`)
with the accelerator's tensor layout (:mod:`~weft.core.layout`), the graph walker and the reference
interpreter (:mod:`~weft.core.walker`, :mod:`~weft.core.reference`), and the ``.weft`` artifact with its
schema and its typed accelerator section (:mod:`~weft.core.artifact`, :mod:`~weft.core.accel_section`).
Imports with numpy alone: the board runtime uses it.
"""
