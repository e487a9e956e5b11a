"""Values to time kernels on: spread evenly, deterministic, and no numpy.random in the process."""

import math
import subprocess
import sys

import numpy as np

from cuvil.compiler.spread import spread


def test_values_are_finite_centred_unit_and_within_their_range():
    v = spread((64, 32, 3, 3))
    assert v.shape == (64, 32, 3, 3) and v.dtype == np.float32 and np.isfinite(v).all()
    assert abs(float(v.mean())) < 0.01 and abs(float(v.var()) - 1.0) < 0.01
    assert -math.sqrt(3) <= v.min() and v.max() < math.sqrt(3)
    assert len(np.unique(v)) == v.size  # no two elements alike: nothing a kernel could skip or cache


def test_the_same_seed_gives_the_same_values_and_another_seed_others():
    assert spread(1000).tobytes() == spread(1000).tobytes()
    assert not np.array_equal(spread(1000, seed=1), spread(1000))
    assert spread((2, 3), dtype=np.float64).dtype == np.float64 and spread(7).shape == (7,)


def test_making_them_imports_no_numpy_random():
    code = "import sys; from cuvil.compiler.spread import spread; spread(100); print('numpy.random' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
