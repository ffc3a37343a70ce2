"""Code generation: schedules, loop IR, the LLVM and CUDA backends."""
