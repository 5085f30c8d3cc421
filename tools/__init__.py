"""What compiles a model and then runs it, above both the compiler and the runtime: the benchmarks
(``weft bench compile|latency|cpu|cpu-tune|tune|zoo``), the ``weft tune`` command and its board measurer.
Neither :mod:`weft.compiler` nor :mod:`weft.runtime` imports this package."""
