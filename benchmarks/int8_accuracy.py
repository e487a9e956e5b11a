"""Cuvil's int8 quantization of the zoo against fp32, one form beside the other: each calibration
method, bias correction, 7-bit weights.

Per model: Cuvil's own quantization (32 calibration inputs) in each form, compiled; 1,000 evaluation
inputs drawn like the calibration data (``tests/int8_zoo.py``). Printed per form: top-1 agreement
with fp32 (the issue's goal: >= 99%), the largest and the mean absolute output error against fp32
(in the output's units and, for the largest, as a share of the fp32 outputs' standard deviation),
and whether the compiled int8 output equals its int8 reference interpreter exactly (first inputs;
``close`` where a layer kept in float rounds its float32 sums in another order; ``step`` where such
a layer feeds int8 ones, whose requantization that rounding can move by one step, so the output
differs by more than float rounding on a few inputs).
Top-1 agreement moves by whole inputs (0.1% each of 1,000); the mean error ranks the forms more
finely. The zoo's models are randomly initialised, and some give the same fp32 top-1 class for
every input (ResNet-18, MobileNetV2; MobileNetV2's outputs barely depend on the input at all): their
top-1 agreement only says that the fp32 output's fixed margin survives quantization. So each model's
line first tells how many fp32 top-1 classes the inputs reach and how much of the output depends on
the input (the across-input standard deviation over the outputs' RMS), and each form also prints
the centred top-1 agreement: the argmax of each output minus the mean output over the inputs, that
is, which class this input raises most, which does depend on the input. Not a timing benchmark:
``int8_bench.py --reduce-range`` times the 7-bit form.

A form is a calibration method (``minmax``, ``percentile``, ``mse``, ``entropy``), optionally with
``+bc`` (bias correction), ``+7bit`` (``reduce_range``), ``+float=LAYER`` (kept in float) and
``+agree=T`` (``target_agreement``: the fewest leading layers in float for top-1 agreement T on check
inputs). The check inputs are never the ones a form is scored on: the evaluation inputs are halved,
each half's output comes from the quantization checked on the other half (two-fold), and the line
tells how many layers each half's search kept in float; or
``ort``: ONNX Runtime's own static quantization of the same exported model from the same calibration
inputs (per-channel int8 weights, u8 activations, min/max), run by ONNX Runtime, the reference for
what post-training quantization of that model gives elsewhere.

``--trained``: each model is first trained on scikit-learn's digits (``tests/digits_zoo.py``: 797
digits train, 32 of them calibrate, 1,000 held-out digits evaluate), so fp32 is right on most inputs
and top-1 agreement means what it says; each form then also prints its accuracy on those digits.

    python benchmarks/int8_accuracy.py [--models mlp,small_cnn,resnet18,mobilenet_v2] [--count 1000]
        [--forms minmax,percentile,mse,entropy,minmax+bc,minmax+7bit] [--trained]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from cuvil.compiler.frontends.onnx import import_onnx  # noqa: E402
from cuvil.compiler.interpreter import run_reference  # noqa: E402
from cuvil.compiler.quantize import integer_form, quantize  # noqa: E402
from cuvil.edge_runtime.compile import compile_graph  # noqa: E402
from tests.hosts import describe_host  # noqa: E402
from tests.digits_zoo import TEST, digit_data, trained as trained_model  # noqa: E402
from tests.int8_zoo import CALIBRATION, CNN_AND_MLP, calibration_inputs, quantized_graph  # noqa: E402
from tests.qdq import draws, ort_session, quantize_static  # noqa: E402
from tests.zoo import ZOO, export_onnx  # noqa: E402

BATCH, SEED, CHECKED = 100, 7, 4
FORMS = "minmax,percentile,mse,entropy,minmax+bc,minmax+7bit,ort"


def outputs(graph, xs: np.ndarray, target: str, exact_check: bool, mixed: bool = False) -> tuple[np.ndarray, str]:
    """``graph``'s compiled outputs for ``xs`` (in batches) and whether the first ones equal the
    reference: ``True``, or ``close`` (float32 rounding; a layer kept in float sums in its own order)."""
    sess = compile_graph(graph, target=target, batch=BATCH, use_cache=False)
    name, out = graph.inputs[0], graph.outputs[0]
    ys = np.concatenate([sess.run({name: xs[i:i + BATCH]})[out] for i in range(0, len(xs), BATCH)])
    if not exact_check:
        return ys, "-"
    want = run_reference(graph, {name: xs[:CHECKED]})[out]
    if np.array_equal(ys[:CHECKED], want):
        return ys, "True"
    return ys, "close" if np.allclose(ys[:CHECKED], want, rtol=1e-4, atol=1e-6) else "step" if mixed else "False"


def options(form: str) -> dict:
    """``quantize`` options of a form such as ``mse+bc+7bit``, ``minmax+bc+float=/0/Gemm`` or
    ``minmax+bc+agree=0.99``."""
    method, *flags = form.split("+")
    valued = {f.split("=", 1)[0]: f.split("=", 1)[1] for f in flags if "=" in f}
    floats = tuple(f.split("=", 1)[1] for f in flags if f.startswith("float="))
    unknown = {f for f in flags if "=" not in f} - {"bc", "7bit"} | set(valued) - {"float", "agree"}
    if unknown:
        raise SystemExit(f"unknown form flags {sorted(unknown)} in {form!r}")
    return {"method": method, "bias_correction": "bc" in flags, "reduce_range": "7bit" in flags,
            "float_layers": floats} | ({"target_agreement": float(valued["agree"])} if "agree" in valued else {})


def two_fold(fp32, calibration: np.ndarray, xs: np.ndarray, target: str, **opts) -> tuple[np.ndarray, str]:
    """Outputs for ``xs`` where each half comes from the quantization whose agreement search checked
    the other half (printing how many leading layers each search kept in float), and their exactness."""
    half = len(xs) // 2 // BATCH * BATCH
    parts, kept = [], []
    for check, scored in ((slice(half, None), slice(0, half)), (slice(0, half), slice(half, None))):
        done = quantize(fp32, {fp32.inputs[0]: calibration}, check_inputs={fp32.inputs[0]: xs[check]}, **opts)
        parts.append(outputs(integer_form(done.graph), xs[scored], target, exact_check=True,
                             mixed=bool(done.report.float_layers)))
        kept.append(str(done.report.float_search.chosen))
    exact = next(e for e in ("False", "step", "close", "True") if e in {e for _, e in parts})
    print(f"{'':13} {opts['target_agreement']:.1%} target: the halves' searches kept {' and '.join(kept)} leading "
          f"layers in float", flush=True)
    return np.concatenate([ys for ys, _ in parts]), exact


def ort_outputs(proto, calibration: np.ndarray, xs: np.ndarray) -> np.ndarray:
    """ONNX Runtime's static quantization of the exported model ``proto`` from ``calibration``, run by
    ONNX Runtime on ``xs``, as its users run it (on x86 without VNNI its default int8 products saturate)."""
    sess = ort_session(quantize_static(proto, [x[None] for x in calibration]), exact_int8=False)
    name = sess.get_inputs()[0].name
    return np.concatenate([sess.run(None, {name: xs[i:i + BATCH]})[0] for i in range(0, len(xs), BATCH)])


def compare(name: str, count: int, target: str, forms: list[str], trained: bool) -> None:
    if trained:
        module, example = trained_model(name)
        train_x, _, xs, labels = digit_data(tuple(example[0].shape[1:]))
        xs, labels, calibration = xs[:count], labels[:count], train_x[:CALIBRATION]
    else:
        module, example = ZOO[name]()
        shape = tuple(example[0].shape[1:])
        xs, labels, calibration = np.stack(draws(shape, count, SEED)), None, calibration_inputs(shape)
    proto = export_onnx(module, example, dynamic_batch=True)  # once: every form quantizes this export
    fp32 = import_onnx(proto)
    ref, _ = outputs(fp32, xs, target, exact_check=False)
    spread = float(ref.std()) or 1.0
    print(input_dependence(name, ref) + ("" if labels is None else
          f"; fp32 accuracy on {len(labels)} held-out digits {(ref.argmax(-1) == labels).mean():.1%}"), flush=True)
    for form in forms:
        if form == "ort":
            ys, exact = ort_outputs(proto, calibration, xs), "-"
        elif "target_agreement" in options(form):
            ys, exact = two_fold(fp32, calibration, xs, target, **options(form))
        else:
            ys, exact = outputs(quantized_graph(name, fp32, calibration, **options(form)).int8, xs, target,
                                exact_check=True, mixed=bool(options(form)["float_layers"]))
        err = np.abs(ys.astype(np.float64) - ref)
        agree = float((ys.argmax(-1) == ref.argmax(-1)).mean())
        centred = float((centred_top1(ys) == centred_top1(ref)).mean())
        accuracy = "" if labels is None else f" {(ys.argmax(-1) == labels).mean():8.1%}"
        print(f"{name:13} {form[:24]:24} {agree:7.1%} {centred:7.1%} {err.max():8.4f} {err.max() / spread:6.3f} "
              f"{err.mean():9.5f} {exact:>5}{accuracy}", flush=True)


def centred_top1(ys: np.ndarray) -> np.ndarray:
    """The class each input raises most above the mean output over all inputs."""
    return (ys - ys.mean(0)).argmax(-1)


def input_dependence(name: str, ref: np.ndarray) -> str:
    """How far top-1 agreement can mean anything for this model's fp32 outputs ``ref``."""
    classes = np.bincount(ref.argmax(-1), minlength=ref.shape[-1])
    share = float(ref.std(0).mean() / (np.sqrt((ref ** 2).mean()) or 1.0))
    return (f"{name:13} fp32 top-1: {np.count_nonzero(classes)} classes, the commonest {classes.max() / len(ref):.1%} "
            f"of inputs; input-dependent share of the output {share:.2e}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=",".join(CNN_AND_MLP))
    ap.add_argument("--count", type=int, default=1000)
    ap.add_argument("--target", default="host")
    ap.add_argument("--forms", default=FORMS)
    ap.add_argument("--trained", action="store_true",
                    help="train each model on the digits first (tests/digits_zoo.py; minutes for ResNet-18 and "
                         "MobileNetV2), calibrate on training digits, evaluate on held-out ones")
    args = ap.parse_args()
    if args.count <= 0 or args.count % BATCH:
        ap.error(f"--count must be a positive multiple of {BATCH} (the compiled batch)")
    if args.trained and args.count > TEST:
        ap.error(f"--trained evaluates on the {TEST} held-out digits: --count at most {TEST}")
    print(f"{describe_host()}; target {args.target}; {args.count} inputs; errors against Cuvil fp32 "
          f"(max/std: the largest error over the fp32 outputs' standard deviation)")
    print(f"{'model':13} {'form':24} {'top-1':>7} {'centred':>7} {'max err':>8} {'/std':>6} {'mean err':>9} "
          f"{'exact':>5}{' accuracy' if args.trained else ''}")
    for name in args.models.split(","):
        compare(name, args.count, args.target, args.forms.split(","), args.trained)


if __name__ == "__main__":
    main()
