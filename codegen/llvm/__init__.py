"""The LLVM backend: loop IR to LLVM IR, vector math, JIT and object emission."""
