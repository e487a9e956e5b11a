"""The module optimizer's speed levels: apart from :mod:`.jit`, so that choosing a level (the kernel
stream, the tuner) does not load LLVM into a process whose LLVM work runs in helper processes."""

FULL_LEVEL = 2
"""Speed level 2 with the vectorizers on and the separate unrolling pass off (:data:`UNROLL_LOOPS`):
the GEMM/conv micro-kernels arrive already vectorized and unrolled, and the loop vectorizer
interleaves the plain loops itself. Measured on the zoo (ResNet-18, MobileNetV2, transformer): 30-45%
less LLVM time than level 3 with full unrolling, run time unchanged within noise."""
UNROLL_LOOPS = False
LIGHT_LEVEL = 0
"""Prevectorized kernels: no module optimizer, code generation at full level (same speed, measured)."""
