"""Resource limits: the parser stops where a limit is passed, check_graph at load and before lowering."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from cuvil.compiler import DType, N, Node, TensorType, infer_graph_types, parse_graph, print_graph
from cuvil.compiler.codegen.lower import lower
from cuvil.compiler.errors import LimitError, ParseError
from cuvil.compiler.ir.limits import DEFAULT_LIMITS, Limits, activation_bytes, check_graph, compile_work
from cuvil.compiler.target import Target


def relu_chain_text(n: int, width: int = 4) -> str:
    lines = [f'graph "g" (x: f32[N,{width}]) -> (v{n}) {{']
    prev = "x"
    for i in range(1, n + 1):
        lines.append(f"  v{i}: f32[N,{width}] = Relu @n{i} ({prev})")
        prev = f"v{i}"
    return "\n".join(lines + ["}"]) + "\n"


def concat_text(k: int) -> str:
    return (f'graph "g" (x: f32[1,4]) -> (y) {{\n  y: f32[1,{4 * k}] = Concat @c ({", ".join(["x"] * k)}) '
            f"{{axis=1}}\n}}\n")


def test_the_parser_stops_at_the_node_limit_before_reading_the_rest():
    text = relu_chain_text(11).replace("\n}\n", "\n  this is not graph text at all ))) \n}\n")
    with pytest.raises(ParseError):
        parse_graph(text)  # without a limit in the way, the junk is reached
    with pytest.raises(LimitError, match="more than 10 nodes"):
        parse_graph(text, limits=Limits(max_nodes=10))
    assert len(parse_graph(relu_chain_text(10), limits=Limits(max_nodes=10)).nodes) == 10


def test_operands_rank_and_dimensions_are_bounded_while_parsing():
    with pytest.raises(LimitError, match="257 inputs"):
        parse_graph(concat_text(257))
    assert len(parse_graph(concat_text(256)).nodes[0].inputs) == 256
    outs = ", ".join(f"o{i}: f32[1]" for i in range(5))
    with pytest.raises(LimitError, match="5 outputs"):
        parse_graph(f'graph "g" (x: f32[5]) -> (o0) {{\n  {outs} = Split @s (x)\n}}\n', limits=Limits(max_node_outputs=4))
    rank = ",".join(["1"] * 33)
    with pytest.raises(LimitError, match="rank 33"):
        parse_graph(f'graph "g" (x: f32[{rank}]) -> (x) {{\n}}\n')
    with pytest.raises(LimitError, match="dimension"):
        parse_graph(f'graph "g" (x: f32[{2**48 + 1}]) -> (x) {{\n}}\n')
    pads = ",".join(["0"] * (DEFAULT_LIMITS.max_attr_items + 1))
    with pytest.raises(LimitError, match="list attribute"):
        parse_graph(f'graph "g" (x: f32[1]) -> (y) {{\n  y: f32[1] = Pad @p (x) {{pads=[{pads}]}}\n}}\n')


def test_values_and_outputs_are_bounded_while_parsing_and_at_load():
    """A million one-element inputs were 15 MB of text and 219 MB parsed: inputs, constants and node outputs
    count together against ``max_values`` as they are read (the junk after the limit is never reached)."""
    small = Limits(max_values=3)
    junk = "\n  this is not graph text at all )))"
    three_inputs = 'graph "g" (a: f32[1], b: f32[1], c: f32[1]) -> (a) {\n}\n'
    assert parse_graph(three_inputs, limits=small).inputs == ("a", "b", "c")
    cases = {
        "inputs": 'graph "g" (a: f32[1], b: f32[1], c: f32[1], d: f32[1]) -> (a) {' + junk + "\n}\n",
        "constants": 'graph "g" (a: f32[1]) -> (a) {\n  const b: f32[0]\n  const c: f32[0]\n  const d: f32[0]' + junk,
        "node outputs": 'graph "g" (a: f32[1]) -> (c) {\n  b: f32[1] = Relu @r (a)\n  c: f32[1] = Relu @s (b)\n'
                        '  d: f32[1] = Relu @t (c)' + junk,
    }
    for what, text in cases.items():
        with pytest.raises(LimitError, match="more than 3 named values"):
            parse_graph(text, limits=small)
        with pytest.raises(ParseError):
            parse_graph(text, limits=Limits(max_values=4))  # what the limit kept it from: the junk
    with pytest.raises(LimitError, match="more than 3 outputs"):
        parse_graph('graph "g" (a: f32[1]) -> (a, a, a, a) {' + junk, limits=small)
    graph = parse_graph(relu_chain_text(3))  # 4 values: x, v1..v3
    assert check_graph(graph, limits=Limits(max_values=4)) is graph
    with pytest.raises(LimitError, match="more than 3 named values"):
        check_graph(graph, limits=small)


def test_the_nodes_operands_together_are_bounded_while_parsing_and_at_load():
    """65,536 nodes of 256 operands each are within the per-node limits and took the parser 37 s."""
    small = Limits(max_operands=5)
    text = relu_chain_text(5)  # five nodes of one operand
    assert len(parse_graph(text, limits=small).nodes) == 5
    with pytest.raises(LimitError, match="more than 4 operands"):
        parse_graph(text.replace("\n}\n", "\n  this is not graph text at all ))) \n}\n"), limits=Limits(max_operands=4))
    with pytest.raises(LimitError, match="more than 3 operands"):
        parse_graph(concat_text(4), limits=Limits(max_operands=3))
    assert check_graph(parse_graph(text), limits=small)
    with pytest.raises(LimitError, match="more than 4 operands"):
        check_graph(parse_graph(text), limits=Limits(max_operands=4))


def test_per_channel_scales_of_a_wide_layer_fit_and_a_writer_checks_the_parsers_limit():
    """An int8 layer of 1,280 or 2,048 output channels keeps a scale per channel in a list attribute: the
    limit was 1,024, which the writer did not check, so it signed bundles every device refused at load."""
    assert DEFAULT_LIMITS.max_attr_items >= 65_536
    g = _graph([Node.make("Pad", ["x"], ["y"], pads=[0] * 2)], {"x": TensorType(DType.F32, (1,))})
    check_graph(g)
    with pytest.raises(LimitError, match="list attribute of 2 items"):
        check_graph(g, limits=Limits(max_attr_items=1))


def test_parsing_memory_is_that_of_the_graph_it_builds():
    """Streaming: the peak while parsing is the graph itself plus a little, never a list of every token
    (the tokenizer that listed them first peaked at 3.7x the graph it built)."""
    text = relu_chain_text(3000)
    tracemalloc.start()
    try:
        graph = parse_graph(text)
        kept, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(graph.nodes) == 3000
    assert peak < 1.5 * kept, (peak, kept)


def _graph(nodes, inputs, constants=None):
    return infer_graph_types("g", inputs, constants or {}, nodes, [nodes[-1].outputs[0]])


def test_activation_bytes_are_checked_at_the_batch_size():
    g = _graph([Node.make("Relu", ["x"], ["y"])], {"x": TensorType(DType.F32, (N, 1024))})
    assert activation_bytes(g, 3) == 2 * 3 * 1024 * 4
    check_graph(g, 1000)
    limit = DEFAULT_LIMITS.max_activation_bytes
    with pytest.raises(LimitError, match="activations"):
        check_graph(g, limit // (2 * 1024 * 4) + 1)
    huge = _graph([Node.make("Relu", ["x"], ["y"])], {"x": TensorType(DType.F32, (2**40,))})
    with pytest.raises(LimitError, match="activations"):
        check_graph(huge)


def test_compile_work_counts_each_distinct_kernel_once():
    x = {"x": TensorType(DType.F32, (1, 4))}
    same = _graph([Node.make("Relu", [f"v{i}" if i else "x"], [f"v{i + 1}"], name=f"n{i}") for i in range(50)], x)
    assert compile_work(same) == 16  # one kernel, 2 operands (counted as at least 4)
    wide = parse_graph(concat_text(200))
    assert compile_work(wide) == 201 ** 2
    with pytest.raises(LimitError, match="units of work"):
        check_graph(wide, limits=Limits(max_compile_work=201 ** 2 - 1))
    check_graph(wide)


def test_lowering_refuses_before_it_starts(monkeypatch):
    g = _graph([Node.make("Relu", ["x"], ["y"])], {"x": TensorType(DType.F32, (N, 1 << 20))})
    from cuvil.compiler.codegen import driver

    monkeypatch.setattr(driver, "plan_memory", lambda *a, **k: pytest.fail("planned past a limit"))
    host = Target("t", "x86_64-unknown-linux-gnu", "x86-64", (), 128)
    with pytest.raises(LimitError, match="activations"):
        lower(g, host, batch=4096)


def test_default_limits_admit_a_large_ordinary_graph():
    text = relu_chain_text(2000, width=64)
    g = parse_graph(text)
    assert check_graph(g, 64) is g and print_graph(g, data=False) == text
    assert np.isfinite(activation_bytes(g, 64))
