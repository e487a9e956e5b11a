"""The zoo quantized by Cuvil's own post-training quantization, shared by the int8 zoo tests.

Calibration and evaluation inputs are drawn alike (standard normal, as the zoo's example inputs),
with different seeds. One model's graphs are kept at a time.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from cuvil.compiler.frontends.onnx import import_onnx
from cuvil.compiler.ir.graph import Graph
from cuvil.compiler.quantize import integer_form, quantize
from tests.qdq import draws
from tests.zoo import ZOO, export_onnx

CALIBRATION = 32
CALIBRATION_SEED = 100  # evaluation inputs take other seeds
CNN_AND_MLP = ("mlp", "small_cnn", "resnet18", "mobilenet_v2")


@dataclass(frozen=True)
class Int8Model:
    name: str
    shape: tuple[int, ...]  # one input, without the batch axis
    fp32: Graph  # as imported: what `cuvil import` signs
    int8: Graph  # integer form: what `cuvil import --int8 --calibration` signs and a device compiles
    qdq: Graph  # the quantized graph before its integer form (QuantizeLinear/DequantizeLinear pairs)

    def inputs(self, count: int, seed: int) -> np.ndarray:
        return np.stack(draws(self.shape, count, seed))


def calibration_inputs(shape: tuple[int, ...]) -> np.ndarray:
    """The zoo's calibration inputs for a model taking ``shape`` (without the batch axis)."""
    return np.stack(draws(shape, CALIBRATION, CALIBRATION_SEED))


@functools.lru_cache(maxsize=None)  # each test module asks for every model once per test: quantize each once
def int8_model(name: str, reduce_range: bool = False, **options) -> Int8Model:
    """``name`` quantized with full-range weights, or 7-bit ones (``reduce_range``); ``options`` go to
    ``quantize`` (``method``, ``bias_correction``, ...), its defaults otherwise."""
    model, example = ZOO[name]()
    return quantized(name, model, example, calibration_inputs(tuple(example[0].shape[1:])), reduce_range=reduce_range,
                     **options)


def quantized(name: str, model, example, calibration: np.ndarray, **options) -> Int8Model:
    """``model`` exported, imported and quantized from ``calibration`` (samples along axis 0)."""
    return quantized_graph(name, import_onnx(export_onnx(model, example, dynamic_batch=True)), calibration, **options)


def quantized_graph(name: str, fp32: Graph, calibration: np.ndarray, **options) -> Int8Model:
    """The imported float graph ``fp32`` quantized from ``calibration`` (samples along axis 0)."""
    done = quantize(fp32, {fp32.inputs[0]: calibration}, **options)
    return Int8Model(name, tuple(calibration.shape[1:]), fp32, integer_form(done.graph), done.graph)
