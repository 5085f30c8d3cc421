"""weft.compiler.llvm: a loop-level IR for tensor expressions, lowered to LLVM with llvmlite.

Define what each output element is (:mod:`~weft.compiler.llvm.te`), schedule its loops
(:mod:`~weft.compiler.llvm.schedule`), lower (:mod:`~weft.compiler.llvm.lower`), render LLVM IR for the
host CPU, the boards' ARM cores or NVPTX, compile it (cached by the hash of the IR,
:mod:`~weft.compiler.llvm.jit`) and run it. Operator templates and whole float graphs build on these.
"""
