"""Hostile and malformed ONNX models: each is one typed error (never a traceback, a hang, unbounded
memory or a file of the importing process's own), and names keep meaning what the model says."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from cuvil.compiler import run_reference
from cuvil.compiler.errors import CuvilError
from cuvil.compiler.frontends import onnx_control
from cuvil.compiler.frontends.onnx import OnnxImportError, import_onnx
from cuvil.compiler.frontends.onnx_node import MALFORMED

from .test_onnx_frontend import run_ort

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def vi(name, dtype=F, shape=(1, 4)):
    return helper.make_tensor_value_info(name, dtype, None if shape is None else list(shape))


def model(nodes, inputs, outputs, inits=(), opset=17):
    m = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, list(inits)),
                          opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def branch(value, out):
    return helper.make_graph([helper.make_node("Constant", [], [out], value=numpy_helper.from_array(
        np.array([value], np.float32)))], out, [], [vi(out, shape=[1])])


# --- control flow: malformed nodes are OnnxImportError -----------------------------------------------
def test_an_if_without_its_condition_is_an_import_error():
    m = model([helper.make_node("If", [], ["y"], then_branch=branch(1.0, "t"), else_branch=branch(2.0, "e"))],
              [vi("x", shape=[1])], [vi("y", shape=[1])])
    with pytest.raises(OnnxImportError, match="lacks its condition"):
        import_onnx(m)


@pytest.mark.parametrize("what", ["nan", "inf", "1.5", "cond-nan"])
def test_a_loop_trip_count_or_condition_must_be_an_integer_or_bool(what):
    """ONNX asks int64 and bool; a float was truncated (1.5 ran once) or had no integer (NaN, inf)."""
    body = helper.make_graph([helper.make_node("Identity", ["c"], ["co"]), helper.make_node("Add", ["v", "v"], ["vo"])],
                             "body", [vi("i", I64, []), vi("c", B, []), vi("v")], [vi("co", B, []), vi("vo")])
    if what == "cond-nan":
        inputs, inits = ["M", "C", "x"], [numpy_helper.from_array(np.array(2, np.int64), "M"),
                                          numpy_helper.from_array(np.array(np.nan, np.float32), "C")]
    else:
        inputs, inits = ["M", "", "x"], [numpy_helper.from_array(np.array(float(what), np.float32), "M")]
    m = model([helper.make_node("Loop", inputs, ["y"], body=body)], [vi("x")], [vi("y")], inits)
    with pytest.raises(OnnxImportError, match="(trip count 'M'|condition 'C') is float32"):
        import_onnx(m)


@pytest.mark.parametrize("error", MALFORMED)
def test_control_flow_reports_what_plain_ops_report_as_malformed(monkeypatch, error):
    """One list of exception classes for both: a control-flow translator's is no traceback either."""
    def broken(host, node, name, depth, version):
        raise error("bad node")

    monkeypatch.setitem(onnx_control.TRANSLATORS, "If", broken)
    m = model([helper.make_node("If", ["c"], ["y"], then_branch=branch(1.0, "t"), else_branch=branch(2.0, "e"))],
              [vi("c", B, [])], [vi("y", shape=[1])])
    with pytest.raises(OnnxImportError, match=f"node 'y' \\(If\\) is malformed \\({error.__name__}"):
        import_onnx(m)


# --- names in sub-graphs are checked as the main graph's ---------------------------------------------
def _if_model(then_g):
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [vi("e", shape=[1])])
    return model([helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)],
                 [vi("c", B, []), vi("x", shape=[1])], [vi("y", shape=[1])])


def _loop_model(body_input):
    """A body whose carried input ``body_input`` no node reads (it computes from the outer x)."""
    body = helper.make_graph([helper.make_node("Identity", ["c"], ["co"]), helper.make_node("Neg", ["x"], ["vo"])],
                             "body", [vi("i", I64, []), vi("c", B, []), vi(body_input)], [vi("co", B, []), vi("vo")])
    return model([helper.make_node("Loop", ["M", "", "x"], ["y"], body=body)], [vi("x")], [vi("y")],
                 [numpy_helper.from_array(np.array(2, np.int64), "M")])


SUB_GRAPH_NAMES = {  # the name nowhere in a node (those were checked already)
    "initializer": lambda: _if_model(helper.make_graph(
        [helper.make_node("Identity", ["x"], ["t"])], "then", [], [vi("t", shape=[1])],
        [numpy_helper.from_array(np.ones(1, np.float32), "NAMEMARKER")])),
    "output": lambda: _if_model(helper.make_graph(
        [helper.make_node("Identity", ["x"], ["t"])], "then", [], [vi("NAMEMARKER", shape=[1])])),
    "value_info": lambda: _if_model(helper.make_graph(
        [helper.make_node("Identity", ["x"], ["t"])], "then", [], [vi("t", shape=[1])], value_info=[vi("NAMEMARKER")])),
    "body input": lambda: _loop_model("NAMEMARKER"),
}


@pytest.mark.parametrize("where", sorted(SUB_GRAPH_NAMES))
def test_a_name_in_a_sub_graph_that_is_not_utf8_is_refused(where):
    data = SUB_GRAPH_NAMES[where]().SerializeToString()
    data = data.replace(b"NAMEMARKER", b"NAME\xff\xfeRKER")  # as long: protobuf keeps its lengths
    with pytest.raises(OnnxImportError, match="not valid UTF-8"):
        import_onnx(data)


# --- constant folding is bounded -------------------------------------------------------------------
def _doubling(steps):
    nodes, prev = [], "k"
    for i in range(steps):
        nodes.append(helper.make_node("Concat", [prev, prev], [f"k{i}"], axis=0))
        prev = f"k{i}"
    nodes += [helper.make_node("ReduceSum", [prev], ["s"], keepdims=1), helper.make_node("Add", ["x", "s"], ["y"])]
    return model(nodes, [vi("x", shape=[1])], [vi("y", shape=[1])], [numpy_helper.from_array(np.ones(1, np.float32), "k")])


def test_a_chain_of_doublings_stops_at_the_fold_budget_before_allocating_it():
    """34 Concats of a 1-element constant with itself: 2^34 floats (64 GiB) from a model of 1.4 kB."""
    with pytest.raises(CuvilError, match="folded at import exceed"):
        import_onnx(_doubling(34))


def test_a_loop_that_doubles_a_constant_stops_at_the_fold_budget():
    body = helper.make_graph([helper.make_node("Identity", ["c"], ["co"]),
                              helper.make_node("Concat", ["v", "v"], ["vo"], axis=0)],
                             "body", [vi("i", I64, []), vi("c", B, []), vi("v", shape=None)], [vi("co", B, []), vi("vo", shape=None)])
    m = model([helper.make_node("Loop", ["M", "", "k"], ["t"], body=body), helper.make_node("ReduceSum", ["t"], ["y"])],
              [vi("x", shape=[1])], [vi("y", shape=None)],
              [numpy_helper.from_array(np.array(40, np.int64), "M"), numpy_helper.from_array(np.ones(1, np.float32), "k")])
    with pytest.raises(CuvilError, match="folded at import exceed"):
        import_onnx(m)


# --- external data: only from the model's own directory ----------------------------------------------
def _external(location, as_attribute=False):
    """y = w, w a tensor whose 28 bytes live in the external file ``location``."""
    w = onnx.TensorProto(name="w", data_type=F, dims=[7], data_location=TensorProto.EXTERNAL)
    entry = w.external_data.add()
    entry.key, entry.value = "location", location
    if as_attribute:
        return model([helper.make_node("Constant", [], ["y"], value=w)], [], [vi("y", shape=[7])])
    return model([helper.make_node("Identity", ["w"], ["y"])], [], [vi("y", shape=[7])], [w])


@pytest.mark.parametrize("as_attribute", [False, True])
@pytest.mark.parametrize("form", ["bytes", "ModelProto"])
def test_a_model_without_a_directory_never_reads_external_data_from_the_current_one(tmp_path, monkeypatch,
                                                                                     form, as_attribute):
    (tmp_path / "secret.txt").write_bytes(b"API_KEY=hunter2-very-secret!")
    monkeypatch.chdir(tmp_path)
    m = _external("secret.txt", as_attribute)
    with pytest.raises(OnnxImportError, match="tensor 'w' keeps its data in the external file 'secret.txt'"):
        import_onnx(m.SerializeToString() if form == "bytes" else m)


def test_a_model_path_reads_external_data_beside_it_and_nowhere_else(tmp_path):
    """onnx's own checks still apply: no location outside the model's directory."""
    values = np.arange(7, dtype=np.float32)
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "w.bin").write_bytes(values.tobytes())
    (tmp_path / "secret.txt").write_bytes(b"API_KEY=hunter2-very-secret!")
    for location in ("w.bin", "../secret.txt", str(tmp_path / "secret.txt")):
        path = tmp_path / "models" / "m.onnx"
        onnx.save(_external(location), path)
        if location == "w.bin":
            graph = import_onnx(path)
            np.testing.assert_array_equal(run_reference(graph, {})["y"], values)
        else:
            with pytest.raises(OnnxImportError, match="not a valid ONNX model"):
                import_onnx(path)


def test_a_model_path_that_is_not_a_regular_file_is_refused_at_once(tmp_path):
    """A FIFO hung onnx.load until a writer came; a device never ends. In a child, so that a hang fails."""
    os.mkfifo(tmp_path / "fifo.onnx")
    (tmp_path / "dir.onnx").mkdir()
    code = ("import sys\nfrom cuvil.compiler.frontends.onnx import OnnxImportError, import_onnx\n"
            "for path in sys.argv[1:]:\n    try:\n        import_onnx(path)\n"
            "    except OnnxImportError as e:\n        print(e)\n")
    paths = [str(tmp_path / "fifo.onnx"), "/dev/null", str(tmp_path / "dir.onnx")]
    out = subprocess.run([sys.executable, "-c", code, *paths], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [f"cannot read ONNX model {paths[0]!r}: not a regular file",
                                       "cannot read ONNX model '/dev/null': not a regular file",
                                       f"cannot read ONNX model {paths[2]!r}: Is a directory"]


# --- interface names are kept verbatim -------------------------------------------------------------
def test_interface_names_are_kept_verbatim_so_none_holds_another_ones_values():
    """'y y' became 'y_y', and the ONNX output 'y_y' then 'y_y_1': reading 'y_y' gave Relu's values."""
    m = model([helper.make_node("Add", ["a b", "a_b"], ["s"]), helper.make_node("Relu", ["s"], ["y y"]),
               helper.make_node("Neg", ["s"], ["y_y"])], [vi("a b"), vi("a_b")], [vi("y y"), vi("y_y")])
    feeds = {"a b": np.array([[1, -2, 3, -4]], np.float32), "a_b": np.array([[0, 0, 0, 1]], np.float32)}
    graph = import_onnx(m)
    assert graph.inputs == ("a b", "a_b") and graph.outputs == ("y y", "y_y")
    got, want = run_reference(graph, feeds), run_ort(m, feeds)
    for name in graph.outputs:
        np.testing.assert_array_equal(got[name], want[name])


@pytest.mark.parametrize("run_time", [False, True])
def test_an_output_computed_by_control_flow_keeps_its_name(run_time):
    """The value is the branch's (named there), or a Where's while the branch reused the output's name."""
    inner = "y" if run_time else "t"
    then_g = helper.make_graph([helper.make_node("Neg", ["x"], [inner])], "then", [], [vi(inner)])
    else_g = helper.make_graph([helper.make_node("Relu", ["x"], ["e"])], "else", [], [vi("e")])
    m = model([helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)],
              [vi("c", B, []), vi("x")], [vi("y")])
    x = np.array([[1, -2, 3, -4]], np.float32)
    graph = import_onnx(m, constant_inputs=None if run_time else {"c": np.array(True)})
    assert graph.outputs == ("y",)
    feeds = {"x": x, "c": np.array(True)} if run_time else {"x": x}
    np.testing.assert_array_equal(run_reference(graph, feeds)["y"], -x)


@pytest.mark.parametrize("outputs, why", [(["y", "y"], "is listed twice"), (["y", "x"], "is also a graph input")])
def test_an_output_name_that_cannot_be_kept_is_refused(outputs, why):
    m = model([helper.make_node("Relu", ["x"], ["y"])], [vi("x")], [vi(o) for o in outputs])
    with pytest.raises(OnnxImportError, match=f"graph output '{outputs[1]}' {why}"):
        import_onnx(m)


# --- every value is defined once in its scope --------------------------------------------------------
TWICE = {
    "two graph inputs": ([helper.make_node("Add", ["x", "x"], ["y"])], [vi("x"), vi("x", shape=[2, 2])], []),
    "two node outputs": ([helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Neg", ["x"], ["y"])], [vi("x")], []),
    "a node output that is an input": ([helper.make_node("Relu", ["x"], ["y"]), helper.make_node("Neg", ["y"], ["x"])],
                                       [vi("x")], []),
    "two initializers": ([helper.make_node("Add", ["x", "w"], ["y"])], [vi("x")],
                         [numpy_helper.from_array(np.ones(4, np.float32), "w"),
                          numpy_helper.from_array(np.full(4, 7, np.float32), "w")]),
}


@pytest.mark.parametrize("case", sorted(TWICE))
def test_a_value_defined_twice_is_refused(case):
    nodes, inputs, inits = TWICE[case]
    with pytest.raises(OnnxImportError, match="is defined twice"):
        import_onnx(model(nodes, inputs, [vi("y")], inits))


def test_a_value_defined_twice_in_a_sub_graph_is_refused():
    then_g = helper.make_graph([helper.make_node("Relu", ["x"], ["t"]), helper.make_node("Neg", ["x"], ["t"])],
                               "then", [], [vi("t")])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [vi("e")])
    m = model([helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)],
              [vi("c", B, []), vi("x")], [vi("y")])
    with pytest.raises(OnnxImportError, match="'t' is defined twice"):
        import_onnx(m)


@pytest.mark.parametrize("length, size, match", [
    (10**9, 1 << 30, "external data is 1000000000 bytes where \\[7\\] of its type take 28"),
    (None, 1 << 30, "does not hold what \\[7\\] of its type take \\(28 bytes\\)"),
    (27, 28, "external data is 27 bytes")])
def test_external_data_must_be_the_size_of_its_tensor_before_a_byte_is_read(tmp_path, monkeypatch, length, size,
                                                                            match):
    """A 142-byte model naming 10^9 bytes of a sparse file took 2 GB before its reshape failed."""
    (tmp_path / "w.bin").write_bytes(b"")
    os.truncate(tmp_path / "w.bin", size)
    m = _external("w.bin")
    if length is not None:
        entry = m.graph.initializer[0].external_data.add()
        entry.key, entry.value = "length", str(length)
    onnx.save(m, tmp_path / "m.onnx")
    read = []
    monkeypatch.setattr(onnx.external_data_helper, "load_external_data_for_tensor",
                        lambda *a, **k: read.append(a))
    with pytest.raises(OnnxImportError, match=match):
        import_onnx(tmp_path / "m.onnx")
    assert not read


def test_a_model_file_past_protobufs_limit_is_refused_by_its_size(tmp_path, monkeypatch):
    from cuvil.compiler.frontends import onnx_source

    path = tmp_path / "big.onnx"
    onnx.save(_external("w.bin"), path)
    monkeypatch.setattr(onnx_source, "MAX_MODEL_BYTES", 16)
    monkeypatch.setattr(onnx_source, "read_exactly", lambda fd, n: pytest.fail("read a file refused by its size"))
    with pytest.raises(OnnxImportError, match="larger than 16 bytes"):
        import_onnx(path)
