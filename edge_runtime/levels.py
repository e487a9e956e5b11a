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
SLOTS_LEVEL = -1
"""Prevectorized kernels whose emitter keeps its sums in stack slots (the int8 convs with small outputs,
``rows``, and those reading their input in place): :data:`SLOTS_PASSES` put them in registers and clean
up, then code generation at full level; no loop optimizer, no vectorizer. The other int8 kernels
(im2col GEMMs, QAdd, quantize) need the loop vectorizer: level 2."""
SLOTS_PASSES = ("sroa", "instruction_combine", "simplify_cfg", "new_gvn", "loop_strength_reduce")
ENTRY_LEVEL = SLOTS_LEVEL
"""The entry points, a job's part dispatchers and the worker pool: calls, pointer offsets and atomics, nothing to
vectorize. The slots passes put their few variables in registers as level 2 does, at about 60% of its LLVM time
(ResNet-18's entry module at 2 threads: 44-54 against 74-82 ms, the last module a cold compile waits for; its pool's
code the same but for block order)."""
