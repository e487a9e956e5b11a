import numpy as np

from .ort_check import assert_close, run_cuvil, run_ort


def test_add_broadcasts_like_onnxruntime(rng):
    a = rng.standard_normal((2, 3, 4), dtype=np.float32)
    b = rng.standard_normal((3, 1), dtype=np.float32)
    assert_close(run_cuvil("Add", [a, b]), run_ort("Add", [a, b]))
