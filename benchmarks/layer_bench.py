"""One resampling layer against ONNX Runtime: a one-node ONNX model (Resize, or a ConvTranspose of random
weights), imported and compiled as a device does, timed interleaved with ORT at one thread.

Why: the layers whose rewrites or kernels a model's totals hide (a decoder's transposed convs, a
segmentation head's upsampling) are measured on their own, with the ratio and the largest difference
from ORT. The first line names the host.

    python benchmarks/layer_bench.py resize 64x16x16 --scale 2 [--mode linear|nearest|cubic]
    python benchmarks/layer_bench.py convtranspose 64x32x32 --out 32 --kernel 3 [--stride 2] [--pad 1]
        [--output-padding 1] [--rounds 15] [--block 20]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from cuvil.compiler.frontends.onnx import import_onnx  # noqa: E402
from cuvil.edge_runtime.compile import compile_graph  # noqa: E402
from tests.hosts import describe_host  # noqa: E402
from zoo_bench import time_block  # noqa: E402  (this folder is on sys.path)


def layer(args) -> tuple[helper.ModelProto, tuple[int, ...]]:
    """The one-node model and its input shape (batch 1)."""
    c, hh, ww = map(int, args.shape.split("x"))
    shape = (1, c, hh, ww)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    if args.op == "resize":
        inits = [numpy_helper.from_array(np.array([1, 1, args.scale, args.scale], np.float32), "scales")]
        node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode=args.mode,
                                coordinate_transformation_mode="half_pixel")
    else:
        w = np.random.default_rng(0).standard_normal((c, args.out, args.kernel, args.kernel)).astype(np.float32)
        inits = [numpy_helper.from_array(w * (2 / (c * args.kernel ** 2)) ** 0.5, "w")]
        node = helper.make_node("ConvTranspose", ["x", "w"], ["y"], strides=[args.stride] * 2, pads=[args.pad] * 4,
                                output_padding=[args.output_padding] * 2)
    graph = helper.make_graph([node], args.op, [x], [y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), shape


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("op", choices=["resize", "convtranspose"])
    ap.add_argument("shape", help="CxHxW of the input")
    ap.add_argument("--scale", type=float, default=2.0)
    ap.add_argument("--mode", default="linear", choices=["nearest", "linear", "cubic"])
    ap.add_argument("--out", type=int, default=32, help="output channels of a ConvTranspose")
    ap.add_argument("--kernel", type=int, default=3)
    ap.add_argument("--stride", type=int, default=2)
    ap.add_argument("--pad", type=int, default=1)
    ap.add_argument("--output-padding", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--block", type=int, default=20)
    args = ap.parse_args()
    model, shape = layer(args)
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    graph = import_onnx(model)
    sess = compile_graph(graph, threads=1)
    so = ort.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    ref = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    feeds = {graph.inputs[0]: x}
    diff = float(np.max(np.abs(sess.run(feeds)[graph.outputs[0]] - ref.run(None, {"x": x})[0])))
    runners = {"cuvil": lambda: sess.run(feeds), "onnxruntime": lambda: ref.run(None, {"x": x})}
    samples: dict[str, list[float]] = {k: [] for k in runners}
    for fn in runners.values():
        time_block(fn, 5)
    for _ in range(args.rounds):
        for key, fn in runners.items():
            samples[key] += time_block(fn, args.block)
    med = {k: float(np.median(v)) * 1e3 for k, v in samples.items()}
    what = f"{args.mode} x{args.scale:g}" if args.op == "resize" else \
        f"-> {args.out}, {args.kernel}x{args.kernel} stride {args.stride} pad {args.pad} output_padding {args.output_padding}"
    print(describe_host())
    print(f"{args.op} {args.shape} {what}: cuvil {med['cuvil']:.0f} us, ORT {med['onnxruntime']:.0f} us, "
          f"cuvil/ORT {med['cuvil'] / med['onnxruntime']:.2f}, max |diff| {diff:.1e}")


if __name__ == "__main__":
    main()
