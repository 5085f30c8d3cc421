"""weft.hw: the accelerator generator (Amaranth 0.5) and its register map.

:mod:`weft.hw.top` builds ``weft_top`` from a config: fetch (:mod:`~weft.hw.fetch`), the load, compute and
store units (:mod:`~weft.hw.load`, :mod:`~weft.hw.compute`, :mod:`~weft.hw.store`) with their token queues
(:mod:`~weft.hw.unit`), the DMA engines (:mod:`~weft.hw.dma`), the GEMM core and ALU
(:mod:`~weft.hw.datapath`), the AXI4 read arbiter (:mod:`~weft.hw.axi`) and the AXI4-Lite register block
(:mod:`~weft.hw.control`), whose map is data in :mod:`weft.hw.regs`. Only ``regs`` imports without
amaranth; nothing is imported here, so a board driver can read the register map on its own.
"""
