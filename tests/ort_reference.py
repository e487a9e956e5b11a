"""ONNX Runtime as the tests' reference: one set of session options.

On x86 CPUs without VNNI (AMD Zen 3, Intel before Cascade Lake) ONNX Runtime's default uint8 x int8
products go through ``vpmaddubsw``, which saturates a pair's sum to int16: a MatMulInteger of full-range
operands came out 4,507 off on a Zen 3 (and QLinearConv outputs up to 48 quanta). Its
``session.x64quantprecision`` option takes the exact uint8 x uint8 path there and changes nothing
elsewhere; a reference must be exact, so tests set it. Benchmarks time ONNX Runtime's default, the
fastest way it runs.
"""

from __future__ import annotations

import onnxruntime as ort


def session_options(threads: int = 1, exact_int8: bool = True) -> ort.SessionOptions:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    if exact_int8:
        so.add_session_config_entry("session.x64quantprecision", "1")
    return so
