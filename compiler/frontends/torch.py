"""The PyTorch frontend: ``import_torch(module, example_inputs) -> Graph``.

Why torch.export and not ``torch.fx.symbolic_trace``: FX records module calls, ``F.*`` functions
and Tensor methods (thousands of spellings, in-place variants, Python control flow it cannot see
through), while ``torch.export`` hands back one functional ATen graph, with parameters and buffers
lifted to inputs named by their ``state_dict`` keys and every value's shape and dtype in
``node.meta["val"]``. ``run_decompositions`` then brings it down to the Core ATen set (in-place ops
removed, ``batch_norm`` → ``_native_batch_norm_legit_no_training``, ``dropout`` → ``clone``...),
except for a few composite ops kept whole because Cuvil has a better single op for them
(:data:`PRESERVED`: ``linear`` → Gemm on the named weight, SDPA → MatMul/Softmax (with eager's
guard that gives 0 for a fully masked row), SiLU/HardSwish/HardSigmoid as one op each, adaptive pooling
as one pool, instance norm and upsampling as one op each).

Shapes are static (those of the example inputs). Every translated node's Cuvil type is checked
against torch's own ``meta["val"]``, so a wrong mapping fails at import, not at run time.
``torch`` is imported only by this module and ``torch_ops``/``torch_nn``/``torch_index``; ``cuvil.compiler`` never imports them.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ..errors import CuvilError
from ..ir.dtypes import DType
from ..ir.graph import Graph
from ..ir.types import TensorType
from ..ir.verify import verify
from . import torch_index, torch_nn  # noqa: F401  (register their translators into TABLE)
from .builder import GraphBuilder, Unsupported
from .torch_ops import TABLE, TORCH_DTYPES, to_dtype

_aten = torch.ops.aten
PRESERVED = (_aten.linear.default, _aten.matmul.default, _aten.scaled_dot_product_attention.default,
             _aten.silu.default, _aten.hardswish.default, _aten.hardsigmoid.default,
             _aten.adaptive_avg_pool2d.default, _aten.instance_norm.default,
             *(getattr(getattr(_aten, name), o) for name in torch_nn.UPSAMPLE for o in ("vec", "default")))
_INPUT_KINDS = {"PARAMETER", "BUFFER", "CONSTANT_TENSOR"}


def import_torch(module: torch.nn.Module, example_inputs: Sequence[Any], name: str | None = None) -> Graph:
    """Capture ``module`` (switched to eval mode) on ``example_inputs`` and translate it."""
    ep = _export(module, tuple(example_inputs))
    return _Translator(ep, name or type(module).__name__).run()


def _export(module: torch.nn.Module, example_inputs: tuple) -> Any:
    table = torch.export.default_decompositions()
    for op in PRESERVED:
        table.pop(op, None)
    fastpath = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)  # else eval MHA becomes _transformer_encoder_layer_fwd
    try:
        ep = torch.export.export(module.eval(), example_inputs)
        return ep.run_decompositions(table)
    except Exception as e:  # torch raises many types here (UserError, Unsupported, RuntimeError...)
        raise CuvilError(f"torch.export could not capture {type(module).__name__}: {e}") from e
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)


def meta_type(val: Any) -> TensorType:
    return TensorType(to_dtype(val.dtype), tuple(int(d) for d in val.shape))


class Ctx:
    """What a translator sees: the builder, the current FX node, and small typed helpers."""

    def __init__(self, builder: GraphBuilder, node: Any):
        self.b, self.node = builder, node

    @property
    def out_type(self) -> TensorType:
        val = self.node.meta["val"]
        return meta_type(val[0] if isinstance(val, (tuple, list)) else val)

    @property
    def out_dtype(self) -> DType:
        return self.out_type.dtype

    @property
    def out_shape(self) -> tuple[int, ...]:
        return self.out_type.shape

    def shape(self, v: str) -> tuple[int, ...]:
        return tuple(self.b.type_of(v).shape)

    def rank(self, v: str) -> int:
        return self.b.type_of(v).rank

    def dtype(self, v: str) -> DType:
        return self.b.type_of(v).dtype

    def op(self, op: str, inputs: Sequence[str], **attrs: Any) -> str:
        return self.b.add1(op, inputs, name=self.node.name, **attrs)

    def ops(self, op: str, inputs: Sequence[str], n: int, **attrs: Any) -> list[str]:
        return self.b.add(op, inputs, name=self.node.name, n_outputs=n, **attrs)

    def const(self, value: Any, dtype: DType, hint: str | None = None) -> str:
        return self.b.constant(_scalar_array(value, dtype), hint=hint or f"{self.node.name}_c", dtype=dtype)

    def cast(self, v: str, dtype: DType) -> str:
        return v if self.dtype(v) is dtype else self.op("Cast", [v], to=dtype)

    def promote(self, x: Any, y: Any) -> list[str]:
        """Two operands (value names or Python scalars) to one dtype, by torch's own rule, which
        lets scalars and 0-d tensors widen only across kinds: asked of stand-in tensors."""
        def stand_in(v: Any) -> Any:
            return torch.empty((1,) * self.rank(v), dtype=_TORCH[self.dtype(v)]) if isinstance(v, str) else v

        dt = to_dtype(torch.result_type(stand_in(x), stand_in(y)))
        return [self.cast(v, dt) if isinstance(v, str) else self.const(v, dt) for v in (x, y)]


_TORCH = {v: k for k, v in TORCH_DTYPES.items()}


def _scalar_array(value: Any, dtype: DType) -> np.ndarray:
    """``value`` as ``dtype``; a Python int wraps into an integer dtype as torch wraps it (``u8 + 300``
    adds 44, ``u8 > -1`` compares with 255), where NumPy would raise OverflowError."""
    if isinstance(value, int) and not isinstance(value, bool) and not dtype.is_float and dtype is not DType.BOOL:
        return np.asarray(value % 2**64, dtype=np.uint64).astype(dtype.numpy)
    return np.asarray(value, dtype=dtype.numpy)


class _Translator:
    def __init__(self, ep: Any, name: str):
        self.ep, self.b = ep, GraphBuilder(name, source=f"torch model {name!r}")
        self.env: dict[Any, Any] = {}
        self.poisoned: set[str] = set()

    def run(self) -> Graph:
        specs = {s.arg.name: s for s in self.ep.graph_signature.input_specs if hasattr(s.arg, "name")}
        outputs: list[str] = []
        for node in self.ep.graph.nodes:
            if node.op == "placeholder":
                self.env[node] = self._placeholder(node, specs[node.name])
            elif node.op == "call_function":
                self.env[node] = self._call(node)
            elif node.op == "output":
                outputs = self._outputs(node)
            else:
                raise CuvilError(f"unexpected FX node {node.op} {node.name!r} in an exported program")
        graph = self.b.build(outputs, parameters=set(self.ep.state_dict) | set(self.ep.constants))
        return _rename_outputs(graph)

    # inputs and outputs ----------------------------------------------------------------------------
    def _placeholder(self, node: Any, spec: Any) -> Any:
        kind = spec.kind.name
        if kind == "USER_INPUT":
            val = node.meta.get("val")
            if not isinstance(val, torch.Tensor):
                return val  # a non-tensor input: static, used as a Python value
            if val.dtype not in TORCH_DTYPES:
                self.b.unsupported(f"dtype {val.dtype}", node.name)
                return self._poison(node.name, val)
            return self.b.input(node.name, meta_type(val))
        if kind not in _INPUT_KINDS:
            raise CuvilError(f"exported input {node.name!r} of kind {kind} is not supported")
        store = self.ep.state_dict if spec.target in self.ep.state_dict else self.ep.constants
        tensor = store[spec.target]
        tensor = tensor.detach().cpu().contiguous()
        if tensor.dtype not in TORCH_DTYPES:
            self.b.unsupported(f"dtype {tensor.dtype}", spec.target)
            return self._poison(spec.target, tensor)
        return self.b.weight(tensor.numpy(), hint=spec.target, dtype=to_dtype(tensor.dtype))

    def _outputs(self, node: Any) -> list[str]:
        kinds = [s.kind.name for s in self.ep.graph_signature.output_specs]
        values = [self.env[a] if hasattr(a, "op") else a for a in node.args[0]]
        outs = [v for k, v in zip(kinds, values) if k == "USER_OUTPUT"]
        bad = [v for v in outs if not isinstance(v, str)]
        if bad:
            raise CuvilError(f"model outputs must be tensors, got {bad!r}")
        return outs

    # nodes -----------------------------------------------------------------------------------------
    def _call(self, node: Any) -> Any:
        target = node.target
        if target is operator.getitem:
            value = self.env[node.args[0]][node.args[1]]
            if value is None:
                self.b.unsupported(f"{node.args[0].target} output {node.args[1]}", node.name)
                return self._poison(node.name, node.meta.get("val"))
            return value
        label = str(target)
        fn = TABLE.get(getattr(getattr(target, "overloadpacket", None), "__name__", None))
        args = _bind(node, self.env)
        tainted = any(isinstance(v, str) and v in self.poisoned for v in _flat(args.values()))
        if tainted and not isinstance(node.meta.get("val"), torch.Tensor):
            return self._poison(node.name, node.meta.get("val"))  # size checks on a stand-in: not ops to report
        if fn is None:
            self.b.unsupported(label, node.name)
            return self._poison(node.name, node.meta.get("val"))
        try:
            result = fn(Ctx(self.b, node), args)
        except Unsupported as e:
            self.b.unsupported(f"{label} ({e})", node.name)
            return self._poison(node.name, node.meta.get("val"))
        except Exception:
            if not tainted:  # a stand-in's consumer may fail in any way; the model is rejected anyway
                raise
            return self._poison(node.name, node.meta.get("val"))
        if tainted:  # translated from stand-ins: poisoned too, so its own consumers are not type-checked
            return self._poison(node.name, node.meta.get("val"))
        self._check(node, result)
        return result

    def _check(self, node: Any, result: Any) -> None:
        vals = node.meta.get("val")
        pairs = zip(result, vals) if isinstance(result, tuple) else [(result, vals)]
        for value, val in pairs:
            if isinstance(value, str) and isinstance(val, torch.Tensor) and self.b.type_of(value) != meta_type(val):
                raise CuvilError(f"torch frontend: {node.name} ({node.target}) became {self.b.type_of(value)}, "
                                 f"torch computes {meta_type(val)}")

    def _poison(self, name: str, val: Any) -> Any:
        """A typed stand-in for an unsupported node's result, so translation goes on and finds
        every other unsupported op; ``build`` raises before any stand-in reaches a Graph.
        A Python number computed from a tensor (``.item()``: a SymFloat) gets a 0-d stand-in, so its
        consumers are poisoned as well; a size known only at run time (``nonzero``) stands in as 1.
        """
        if isinstance(val, (tuple, list)):
            return tuple(self._poison(f"{name}:{i}", v) for i, v in enumerate(val))
        if isinstance(val, torch.Tensor):
            ttype = TensorType(TORCH_DTYPES.get(val.dtype, DType.F32), tuple(_static_size(d) for d in val.shape))
        elif isinstance(val, tuple(_SYMBOLIC)):
            ttype = TensorType(_SYMBOLIC[type(val)], ())
        else:
            return None
        stand_in = self.b.unique(f"{name}?")
        self.b.types[stand_in] = ttype
        self.poisoned.add(stand_in)
        return stand_in


_SYMBOLIC = {torch.SymFloat: DType.F32, torch.SymInt: DType.I64, torch.SymBool: DType.BOOL}


def _static_size(d: Any) -> int:
    return d if isinstance(d, int) else 1


def _bind(node: Any, env: dict) -> dict[str, Any]:
    """The node's arguments by schema name, defaults filled, FX nodes replaced by their values."""
    def resolve(v: Any) -> Any:
        if hasattr(v, "op") and hasattr(v, "meta"):
            return env[v]
        if isinstance(v, (list, tuple)):
            return type(v)(resolve(x) for x in v)
        return v

    schema = getattr(node.target, "_schema", None)
    if schema is None:  # a Python builtin (operator.ge on sizes): positional
        return {str(i): resolve(v) for i, v in enumerate(node.args)}
    bound: dict[str, Any] = {}
    for i, arg in enumerate(schema.arguments):
        if i < len(node.args) and not arg.kwarg_only:
            bound[arg.name] = resolve(node.args[i])
        elif arg.name in node.kwargs:
            bound[arg.name] = resolve(node.kwargs[arg.name])
        elif arg.has_default_value():
            bound[arg.name] = arg.default_value
    return bound


def _flat(values: Any) -> list[Any]:
    out: list[Any] = []
    for v in values:
        out.extend(_flat(v) if isinstance(v, (list, tuple)) else [v])
    return out


def _rename_outputs(graph: Graph) -> Graph:
    """Name the outputs ``output`` (or ``output_0``...) as the ONNX exporter does."""
    new = ["output"] if len(graph.outputs) == 1 else [f"output_{i}" for i in range(len(graph.outputs))]
    produced = {o for n in graph.nodes for o in n.outputs}
    mapping = {old: nw for old, nw in zip(graph.outputs, new)
               if old in produced and nw not in graph.types and old not in graph.inputs}
    if not mapping:
        return graph
    ren = lambda vs: tuple(mapping.get(v, v) for v in vs)  # noqa: E731
    nodes = [n.replace(inputs=ren(n.inputs), outputs=ren(n.outputs)) for n in graph.nodes]
    types = {mapping.get(k, k): t for k, t in graph.types.items()}
    return verify(graph.replace(nodes=tuple(nodes), outputs=ren(graph.outputs), types=types))
