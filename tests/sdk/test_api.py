"""The public API: import dispatch, export/load round trip, run, inputs/outputs files, FLOP summary."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest

import cuvil
from cuvil import BundleError, CuvilError
from cuvil.compiler import DType, N, Node, TensorType, infer_graph_types
from cuvil.compiler.analysis import summarize
from cuvil.compiler.ops import get_op

from ..compiler.bundle.helpers import big_graph, small_graph


@pytest.fixture
def keys(tmp_path):
    return cuvil.keygen(tmp_path / "keys")


def test_public_names():
    for name in ("import_model", "run_reference", "export", "load", "keygen", "Graph", "CuvilError", "BundleError"):
        assert hasattr(cuvil, name)
    assert issubclass(BundleError, CuvilError)


def test_export_load_run_round_trip(tmp_path, keys):
    graph = small_graph()
    done = cuvil.export(graph, tmp_path / "m.cuvil", keys.private_path, name="small", version="2")
    assert done.size == (tmp_path / "m.cuvil").stat().st_size and done.signer == keys.fingerprint
    model = cuvil.load(done.path, trusted_keys=[keys.public_path])
    assert model.graph == graph and model.content_hash == done.content_hash
    assert model.producer == f"cuvil {cuvil.__version__}"
    x = {"x": np.linspace(-1, 1, 24, dtype=np.float32).reshape(3, 8)}
    want = cuvil.run_reference(graph, x)
    for got in (cuvil.run_reference(model, x), model.run(x)):
        assert all(got[k].tobytes() == want[k].tobytes() for k in want)


def test_two_exports_are_byte_identical(tmp_path, keys):
    a, b = tmp_path / "a.cuvil", tmp_path / "b.cuvil"
    cuvil.export(small_graph(), a, keys.private_path, version="1")
    cuvil.export(small_graph(), b, cuvil.compiler.bundle.load_private_key(keys.private_path), version="1")
    assert a.read_bytes() == b.read_bytes()


def test_bundle_overhead_is_within_one_percent_plus_64k(tmp_path, keys):
    graph = big_graph()
    done = cuvil.export(graph, tmp_path / "big.cuvil", keys.private_path)
    assert done.size <= graph.weight_bytes * 1.01 + 64 * 1024


def test_import_model_dispatch_errors(tmp_path):
    g = small_graph()
    assert cuvil.import_model(g) is g
    with pytest.raises(CuvilError, match="cannot import a int"):
        cuvil.import_model(3)
    with pytest.raises(CuvilError, match="bundle"):
        cuvil.import_model(tmp_path / "m.cuvil")
    with pytest.raises(CuvilError, match="format"):
        cuvil.import_model(tmp_path / "m.tflite")


def _tiny_onnx():
    onnx = pytest.importorskip("onnx")
    pytest.importorskip("cuvil.compiler.frontends.onnx")
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array((np.arange(12, dtype=np.float32).reshape(4, 3) - 6) / 7, "W")
    nodes = [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Relu", ["h"], ["y"])]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])], [w])
    return onnx, helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_import_onnx_path_bytes_and_proto(tmp_path):
    onnx, model = _tiny_onnx()
    path = tmp_path / "tiny.onnx"
    onnx.save(model, path)
    graphs = [cuvil.import_model(path), cuvil.import_model(str(path)), cuvil.import_model(model.SerializeToString()),
              cuvil.import_model(model)]
    assert all(g == graphs[0] for g in graphs)
    assert graphs[0].types[graphs[0].inputs[0]] == TensorType(DType.F32, (N, 4))


def test_import_torch_needs_example_inputs():
    torch = pytest.importorskip("torch")
    with pytest.raises(CuvilError, match="example_inputs"):
        cuvil.import_model(torch.nn.ReLU())


def test_read_inputs_and_save_outputs(tmp_path):
    g = small_graph()
    x = np.ones((2, 8), np.float32)
    np.save(tmp_path / "x.npy", x)
    np.savez(tmp_path / "in.npz", x=x)
    assert cuvil.read_inputs(g, npy=tmp_path / "x.npy")["x"].tobytes() == x.tobytes()
    assert list(cuvil.read_inputs(g, npz=tmp_path / "in.npz")) == ["x"]
    np.save(tmp_path / "obj.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(CuvilError, match="cannot read inputs"):
        cuvil.read_inputs(g, npy=tmp_path / "obj.npy")  # never unpickles
    (tmp_path / "junk.npz").write_bytes(b"junk")
    with pytest.raises(CuvilError, match="cannot read inputs"):
        cuvil.read_inputs(g, npz=tmp_path / "junk.npz")
    with pytest.raises(CuvilError, match="not an .npy"):
        cuvil.read_inputs(g, npy=tmp_path / "in.npz")
    import io
    import zipfile

    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f4", "fortran_order": False, "shape": (2**40,)})
    (tmp_path / "huge.npy").write_bytes(header.getvalue() + bytes(64))  # declares 4 TiB, holds 64 bytes
    with pytest.raises(CuvilError, match="declares 4398046511104 bytes of data and holds 64"):
        cuvil.read_inputs(g, npy=tmp_path / "huge.npy")
    with zipfile.ZipFile(tmp_path / "huge.npz", "w") as z:
        z.writestr("x.npy", header.getvalue() + bytes(64))
    with pytest.raises(CuvilError, match="declares 4398046511104 bytes"):
        cuvil.read_inputs(g, npz=tmp_path / "huge.npz")
    with zipfile.ZipFile(tmp_path / "extra.npz", "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("x.npy", (tmp_path / "x.npy").read_bytes())
        z.writestr("unused.npy", bytes(1 << 20))  # not an input: refused before it is inflated
    with pytest.raises(CuvilError, match="'unused.npy' is not an .npy of an input"):
        cuvil.read_inputs(g, npz=tmp_path / "extra.npz")
    with pytest.raises(CuvilError):
        cuvil.read_inputs(g)
    outs = {"file": np.arange(3), "a/b": np.zeros((2, 2), np.float16)}  # names np.savez(**kw) cannot take
    cuvil.save_outputs(tmp_path / "out.npz", outs)
    with np.load(tmp_path / "out.npz", allow_pickle=False) as back:
        assert {k: back[k].tobytes() for k in back.files} == {k: v.tobytes() for k, v in outs.items()}


def test_inspect_model_reports_trust(tmp_path, keys):
    done = cuvil.export(small_graph(), tmp_path / "m.cuvil", keys.private_path)
    assert cuvil.inspect_model(done.path, [keys.public_path]).bundle.trusted
    info = cuvil.inspect_model(done.path, [cuvil.keygen(tmp_path / "other").public_path])
    assert not info.bundle.trusted and info.summary.parameters == small_graph().parameter_count


def test_a_fifo_named_as_a_model_or_inputs_is_refused_at_once(tmp_path):
    """``open`` of a FIFO blocks until a writer comes: inspect and read_inputs refuse it before reading, in a
    child so that a block fails the test instead of hanging it."""
    import os
    import subprocess
    import sys

    for name in ("m.cuvil", "m.onnx", "x.npy", "in.npz"):
        os.mkfifo(tmp_path / name)
    code = ("import sys, cuvil\nfrom tests.compiler.bundle.helpers import small_graph\nd = sys.argv[1]\n"
            "calls = [lambda: cuvil.inspect_model(d + '/m.cuvil'), lambda: cuvil.inspect_model(d + '/m.onnx'),\n"
            "         lambda: cuvil.read_inputs(small_graph(), npy=d + '/x.npy'),\n"
            "         lambda: cuvil.read_inputs(small_graph(), npz=d + '/in.npz')]\n"
            "for call in calls:\n"
            "    try:\n        call()\n    except OSError as e:\n        print(e.strerror)\n")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=120,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert out.returncode == 0 and out.stdout.splitlines() == ["not a regular file"] * 4, out


def test_export_refuses_a_graph_every_loader_would_refuse(tmp_path, keys):
    """Past the limits a reader applies (here an activation of 2^44 floats): never signed."""
    from cuvil.compiler.errors import LimitError

    graph = infer_graph_types("huge", {"x": TensorType(DType.F32, (1 << 22, 1 << 22))}, {},
                              [Node.make("Relu", ["x"], ["y"])], ["y"])
    with pytest.raises(LimitError, match="activations"):
        cuvil.export(graph, tmp_path / "huge.cuvil", keys.private_path)
    assert not (tmp_path / "huge.cuvil").exists()


def _graph(nodes, inputs, constants=None):
    return infer_graph_types("g", inputs, constants or {}, nodes, [nodes[-1].outputs[0]])


def test_flop_rules_for_conv_gemm_matmul():
    f32 = DType.F32
    conv = _graph([Node.make("Conv", ["x", "w"], ["y"], strides=(1, 1), pads=(1, 1, 1, 1), dilations=(1, 1))],
                  {"x": TensorType(f32, (N, 3, 8, 8))}, {"w": np.zeros((16, 3, 3, 3), np.float32)})
    assert summarize(conv).flops == 2 * (16 * 8 * 8) * (3 * 3 * 3)
    gemm = _graph([Node.make("Gemm", ["a", "b", "c"], ["y"], transA=1)], {"a": TensorType(f32, (5, N))},
                  {"b": np.zeros((5, 7), np.float32), "c": np.zeros(7, np.float32)})
    assert summarize(gemm).flops == 2 * 7 * 5 + 7
    mm = _graph([Node.make("MatMul", ["a", "b"], ["y"])], {"a": TensorType(f32, (N, 2, 4, 6))},
                {"b": np.zeros((6, 3), np.float32)})
    assert summarize(mm, batch=2).flops == 2 * (2 * 2 * 4 * 3) * 6


def test_summary_counts():
    s = summarize(small_graph())
    g = small_graph()
    assert (s.parameters, s.weight_bytes) == (g.parameter_count, g.weight_bytes)
    assert s.flops == 4 * 8  # Mul, Add, Relu, Sigmoid: one per output element at batch 1
    assert s.inputs == (("x", "f32[N,8]"),) and s.outputs == (("y", "f32[N,8]"), ("z", "f32[N,8]"))
    assert dict(s.op_counts) == {"Mul": 1, "Add": 1, "Relu": 1, "Sigmoid": 1} and s.node_count == 4
    assert get_op("Reshape").flops({}, [], []) == 0


def test_fused_ops_count_like_the_ops_they_replace():
    f32 = TensorType(DType.F32, (N, 4))
    consts = {"b": np.zeros((4, 3), np.float32), "c": np.zeros(3, np.float32)}
    fused = _graph([Node.make("FusedGemm", ["a", "b", "c"], ["y"], has_bias=1, activation="Relu")], {"a": f32}, consts)
    plain = _graph([Node.make("Gemm", ["a", "b", "c"], ["y"]), Node.make("Relu", ["y"], ["z"])], {"a": f32}, consts)
    assert summarize(fused).flops == summarize(plain).flops == 2 * 3 * 4 + 3 + 3


def test_saved_outputs_replace_a_file_whole_and_never_a_fifo(tmp_path):
    """The .npz was written in place: a FIFO blocked forever, a full disk truncated the old file."""
    out = tmp_path / "out.npz"
    out.write_bytes(b"old")
    cuvil.save_outputs(out, {"y": np.arange(3, dtype=np.float32)})
    with np.load(out) as z:
        np.testing.assert_array_equal(z["y"], [0, 1, 2])
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    done = []
    worker = threading.Thread(target=lambda: done.append(pytest.raises(FileExistsError, cuvil.save_outputs, fifo,
                                                                       {"y": np.zeros(1)})), daemon=True)
    worker.start()
    worker.join(10)
    assert done and fifo.is_fifo(), "save_outputs blocked on a FIFO"
