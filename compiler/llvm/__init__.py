"""weft.compiler.llvm: host and GPU code generation through LLVM (llvmlite).

The loop-level IR, in the order code flows through it:

* :mod:`~weft.compiler.llvm.expr`: scalar expressions and buffers;
* :mod:`~weft.compiler.llvm.te`: tensor expressions (what each output element is) and kernels;
* :mod:`~weft.compiler.llvm.schedule`: split, reorder, fuse, tile, vectorize, unroll, parallel, bind,
  cache_write and cache_read (how the loops run);
* :mod:`~weft.compiler.llvm.lower`: schedules to loop statements;
* :mod:`~weft.compiler.llvm.codegen_cpu` / :mod:`~weft.compiler.llvm.codegen_nvptx` (with
  :mod:`~weft.compiler.llvm.emit`): render LLVM IR for a CPU or for NVPTX;
* :mod:`~weft.compiler.llvm.jit`: compile (cached by the hash of the IR, in memory and optionally on
  disk), JIT for the host, object files for the boards (:mod:`~weft.compiler.llvm.target`);
* :mod:`~weft.compiler.llvm.cuda`: PTX, ``ptxas``, the CUDA driver API.

On top: operator templates (:mod:`~weft.compiler.llvm.nn`, :mod:`~weft.compiler.llvm.depthwise`,
:mod:`~weft.compiler.llvm.winograd` for 3x3 stride-1 and :mod:`~weft.compiler.llvm.pointwise` for 1x1
convolutions, :mod:`~weft.compiler.llvm.norm`, :mod:`~weft.compiler.llvm.elementwise`,
:mod:`~weft.compiler.llvm.mathfn`, :mod:`~weft.compiler.llvm.gpu`), whole graphs (:mod:`~weft.compiler.llvm.graph` with
:mod:`~weft.compiler.llvm.host_float`, :mod:`~weft.compiler.llvm.host_ops` and
:mod:`~weft.compiler.llvm.host_quant`, and a numpy step for any op they have no kernel for), the "cpu" and "cuda"
devices (:mod:`weft.runtime.cpu_device`), ``weft bench cpu`` (:mod:`~weft.tools.bench_cpu`), and an
interpreter of lowered code with GPU thread semantics (:mod:`~weft.compiler.llvm.interp`).
"""
