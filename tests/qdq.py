"""QDQ models made the way users make them: ONNX Runtime's static quantization of an exported model.

Shared by tests and benchmarks. Calibration and evaluation inputs are drawn from one distribution
(standard normal, the zoo's example inputs' distribution) with different seeds.
"""

from __future__ import annotations

import io
import logging

import numpy as np
import onnx
import torch

from tests.zoo import export_onnx


def draws(shape: tuple[int, ...], count: int, seed: int) -> list[np.ndarray]:
    """``count`` inputs of ``shape`` drawn like the zoo's example inputs."""
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(np.float32) for _ in range(count)]


def quantize_static(model: onnx.ModelProto, calibration: list[np.ndarray], per_channel: bool = True,
                    activations: str = "QUInt8", reduce_range: bool = False) -> onnx.ModelProto:
    """``onnxruntime.quantization.quantize_static`` in QDQ format (int8 weights), in memory;
    ``reduce_range``: 7-bit weights, what ONNX Runtime advises for AVX2 CPUs without VNNI."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static as ort_qs

    name = model.graph.input[0].name

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter([{name: x} for x in calibration])

        def get_next(self):
            return next(self.it, None)

    logging.getLogger().setLevel(logging.ERROR)  # "please consider pre-processing" on every call
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "f32.onnx", Path(tmp) / "qdq.onnx"
        onnx.save(model, str(src))
        ort_qs(str(src), str(dst), Reader(), quant_format=QuantFormat.QDQ, per_channel=per_channel,
               activation_type=getattr(QuantType, activations), weight_type=QuantType.QInt8,
               reduce_range=reduce_range)
        return onnx.load(str(dst))


def draws_like(example: torch.Tensor, count: int, seed: int) -> list[np.ndarray]:
    """``count`` inputs like ``example``: standard normal floats, or integers (token ids) in
    ``[0, example.max()]``."""
    if example.dtype.is_floating_point:
        return draws(tuple(example.shape), count, seed)
    rng = np.random.default_rng(seed)
    high = int(example.max()) + 1
    return [rng.integers(0, high, tuple(example.shape)).astype(example.numpy().dtype) for _ in range(count)]


def qdq_model(module: torch.nn.Module, example: tuple[torch.Tensor, ...], calibration_count: int = 16,
              seed: int = 100, **options) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    """(fp32 ONNX, QDQ ONNX) of a torch module, calibrated on inputs drawn like ``example``."""
    f32 = export_onnx(module, example, dynamic_batch=True)
    calib = draws_like(example[0], calibration_count, seed)
    return f32, quantize_static(f32, calib, **options)


def ort_session(model: onnx.ModelProto, threads: int = 1, exact_int8: bool = True):
    """An ONNX Runtime session of ``model``; ``exact_int8=False``: its default int8 products, which
    saturate on x86 without VNNI (``tests.ort_reference``), as a benchmark times them."""
    import onnxruntime as ort

    from tests.ort_reference import session_options

    buf = io.BytesIO()
    onnx.save(model, buf)
    return ort.InferenceSession(buf.getvalue(), session_options(threads, exact_int8), providers=["CPUExecutionProvider"])
