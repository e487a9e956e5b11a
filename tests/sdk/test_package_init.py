"""What importing cuvil sets up in a process before numpy loads: numpy's BLAS keeps to one thread."""

from __future__ import annotations

import os
import subprocess
import sys

CHILD = """
import os
import cuvil
import numpy as np
a = np.ones((400, 400), np.float32)
a @ a  # a BLAS call OpenBLAS would spread over its threads
print(os.environ.get("OPENBLAS_NUM_THREADS"), len(os.listdir("/proc/self/task")))
"""


def _child(**env: str) -> tuple[str, int]:
    clean = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", CHILD], env=clean | env, capture_output=True, text=True, check=True)
    value, threads = out.stdout.split()
    return value, int(threads)


def test_numpy_blas_keeps_to_one_thread_after_cuvil_is_imported():
    """OpenBLAS's threads spin on the cores Cuvil's workers use (see sdk/__init__.py): none are started."""
    assert _child() == ("1", 1)


def test_a_blas_thread_count_chosen_by_the_user_is_kept():
    value, threads = _child(OPENBLAS_NUM_THREADS="2")
    assert value == "2" and threads == min(2, len(os.sched_getaffinity(0)))
