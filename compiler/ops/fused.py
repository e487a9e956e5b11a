"""Fused ops: what ``passes/fuse.py`` produces and the code generator emits as one kernel each.

Each fused op is an ordinary op-table entry whose reference calls the references of the ops it
replaces (``get_op(name).reference``), so fusion cannot change the meaning of a graph.

``FusedConv(X, W[, B][, R])`` and ``FusedGemm(A, B[, C][, R])`` compute, in this order (as ResNet):

    y = Conv/Gemm(X, W[, B])  ->  y = y + R (if has_residual)  ->  y = activation(y)

Besides Conv's (``strides, pads, dilations, group``) or Gemm's (``alpha, beta, transA, transB``)
attributes they carry ``has_bias`` and ``has_residual`` (0/1; the inputs are X, W, then B when
has_bias, then R when has_residual, so a residual without bias is input 2), ``activation`` (a key
of :data:`ACTIVATIONS`, ``"none"`` for none) and ``act_alpha``/``act_beta``, the activation's
parameters as :data:`ACTIVATIONS` maps them (unused ones are 0.0). R has exactly the output's type.

``FusedElementwise(X0, X1, ...)`` runs a small program over its inputs, the STRING attribute
``program``: steps separated by ``;``, each ``Op(a,b,...)`` or ``Op{key=value,...}(a,...)``.
Slots ``0..n-1`` are the node's inputs; step ``j`` writes slot ``n+j``; the node's one output is the
last step's slot. Attributes are complete and sorted by key, floats printed with ``repr`` (``inf``,
``-inf`` allowed), strings bare (``[A-Za-z0-9_]+``). Example over inputs x, s, b:
``Mul(0,1);Add(3,2);Clip{max=6.0,min=0.0}(4)`` is ``clip(x*s + b, 0, 6)``. Every input is used;
operands broadcast as in the step's op. Inputs with the output's type may share its storage (the
memory planner does that), so a kernel must read element i of such an input before writing element i
of the output and never read another element of it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import ShapeError
from ..ir.types import TensorType
from .linalg import gemm_flops
from .nn import conv_flops
from .registry import OP_TABLE, AttrKind, AttrSpec, FlopRule, OpDef, get_op, register, require

I, F, S, INTS = AttrKind.INT, AttrKind.FLOAT, AttrKind.STRING, AttrKind.INTS


# activations --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Activation:
    """How a fused ``activation`` maps onto an elementwise op: its params come from alpha, beta."""

    op: str
    params: tuple[str, ...] = ()  # op attribute names fed by (act_alpha, act_beta), in order
    fixed: tuple[tuple[str, object], ...] = ()  # op attributes fixed by the activation name

    def op_attrs(self, alpha: float, beta: float) -> dict:
        return {**dict(zip(self.params, (alpha, beta))), **dict(self.fixed)}


ACTIVATIONS: Mapping[str, Activation] = {
    "Relu": Activation("Relu"),
    "Clip": Activation("Clip", ("min", "max")),
    "LeakyRelu": Activation("LeakyRelu", ("alpha",)),
    "Sigmoid": Activation("Sigmoid"),
    "Tanh": Activation("Tanh"),
    "SiLU": Activation("SiLU"),
    "HardSwish": Activation("HardSwish"),
    "HardSigmoid": Activation("HardSigmoid", ("alpha", "beta")),
    "Gelu": Activation("Gelu", fixed=(("approximate", "none"),)),
    "GeluTanh": Activation("Gelu", fixed=(("approximate", "tanh"),)),
}


def activation_of(op: str, attrs: Mapping) -> tuple[str, float, float] | None:
    """``(activation, act_alpha, act_beta)`` for an activation node, None if ``op`` is not one."""
    for name, act in ACTIVATIONS.items():
        if act.op == op and all(attrs.get(k) == v for k, v in act.fixed):
            vals = [float(attrs[p]) for p in act.params] + [0.0, 0.0]
            return name, vals[0], vals[1]
    return None


def _apply_activation(y: np.ndarray, a: Mapping) -> np.ndarray:
    if a["activation"] == "none":
        return y
    act = ACTIVATIONS[a["activation"]]
    opdef = get_op(act.op)
    return opdef.reference([y], opdef.normalize_attrs(act.op_attrs(a["act_alpha"], a["act_beta"])))[0]


# FusedConv / FusedGemm ----------------------------------------------------------------------------
FUSION_ATTRS = {
    "activation": AttrSpec(S, "none"),
    "act_alpha": AttrSpec(F, 0.0),
    "act_beta": AttrSpec(F, 0.0),
    "has_bias": AttrSpec(I, 0),
    "has_residual": AttrSpec(I, 0),
}
CONV_ATTRS = {"strides": AttrSpec(INTS), "pads": AttrSpec(INTS), "dilations": AttrSpec(INTS), "group": AttrSpec(I, 1)}
GEMM_ATTRS = {"alpha": AttrSpec(F, 1.0), "beta": AttrSpec(F, 1.0), "transA": AttrSpec(I, 0), "transB": AttrSpec(I, 0)}


def base_attrs(a: Mapping) -> dict:
    """The attributes of the fused op that belong to the base op (Conv or Gemm)."""
    return {k: v for k, v in a.items() if k not in FUSION_ATTRS}


def _check_fusion(op: str, n_inputs: int, a: Mapping) -> int:
    """Validate the fusion attributes; return how many inputs the base op takes."""
    require(a["has_bias"] in (0, 1) and a["has_residual"] in (0, 1), f"{op}: has_bias/has_residual must be 0 or 1")
    require(a["activation"] == "none" or a["activation"] in ACTIVATIONS,
            f"{op}: unknown activation {a['activation']!r} (known: none, {', '.join(ACTIVATIONS)})")
    want = 2 + a["has_bias"] + a["has_residual"]
    require(n_inputs == want, f"{op}: has_bias={a['has_bias']}, has_residual={a['has_residual']} need {want} inputs, got {n_inputs}")
    return 2 + a["has_bias"]


def residual_index(attrs: Mapping) -> int | None:
    """Input index of R in a fused node (after X, W and the optional bias), None without one."""
    return 2 + attrs["has_bias"] if attrs.get("has_residual") else None


def residual_input(attrs: Mapping, i: int) -> bool:
    """The in-place rule of FusedConv/FusedGemm: only R may share the output's bytes (R[i] enters y[i] only)."""
    return i == residual_index(attrs)


def _epilogue_flops(base: FlopRule) -> FlopRule:
    """The base op's multiply-adds plus one operation per output element per epilogue step."""

    def rule(a, ins, outs) -> int:
        steps = int(a.get("has_bias", 0)) + int(a.get("has_residual", 0)) + (a.get("activation", "none") != "none")
        return base(a, ins, outs) + steps * math.prod(outs[0].shape)

    return rule


def _fused(name: str, base: str, base_schema: Mapping[str, AttrSpec], base_flops: FlopRule) -> OpDef:
    def infer(ts: Sequence[TensorType], a):
        n = _check_fusion(name, len(ts), a)
        out = get_op(base).infer(list(ts[:n]), base_attrs(a))[0]
        if a["has_residual"]:
            require(ts[n] == out, f"{name}: residual is {ts[n]}, the output is {out}")
        if a["activation"] != "none":
            require(out.dtype.is_float, f"{name}: activation {a['activation']} needs a float result")
        return [out]

    def ref(xs: Sequence[np.ndarray], a):
        n = 2 + a["has_bias"]
        y = get_op(base).reference(list(xs[:n]), base_attrs(a))[0]
        if a["has_residual"]:
            y = get_op("Add").reference([y, xs[n]], {})[0]
        return [_apply_activation(y, a)]

    return OpDef(name, infer, ref, attrs={**base_schema, **FUSION_ATTRS}, min_inputs=2, max_inputs=4,
                 doc=f"{base} + bias + residual + activation in one kernel", float_only=True,
                 inplace=residual_input, flops=_epilogue_flops(base_flops))


# FusedElementwise (its steps are ops with the ``fusable`` trait) -----------------------------------
@dataclass(frozen=True)
class Step:
    op: str
    args: tuple[int, ...]
    attrs: tuple[tuple[str, object], ...] = ()  # complete, sorted (the op's canonical form)


_STEP = re.compile(r"^([A-Za-z][A-Za-z0-9]*)(?:\{([^{}]*)\})?\((\d+(?:,\d+)*)\)$")
_WORD = re.compile(r"[A-Za-z0-9_]+")


def _format_value(v) -> str:
    if isinstance(v, float):
        return "nan" if math.isnan(v) else repr(v)
    text = str(v)
    if isinstance(v, str) and not _WORD.fullmatch(text):
        raise ShapeError(f"FusedElementwise: string attribute {text!r} is not a bare word")
    return text


def _parse_value(op: str, key: str, kind: AttrKind, text: str):
    try:
        return text if kind is S else float(text) if kind is F else int(text)
    except ValueError:
        raise ShapeError(f"FusedElementwise: {op} attribute {key}={text!r} is not a {kind.value}") from None


def format_program(steps: Sequence[Step]) -> str:
    """The canonical ``program`` string of ``steps``."""
    parts = []
    for s in steps:
        attrs = ",".join(f"{k}={_format_value(v)}" for k, v in sorted(s.attrs))
        parts.append(s.op + (f"{{{attrs}}}" if attrs else "") + "(" + ",".join(map(str, s.args)) + ")")
    return ";".join(parts)


def parse_program(text: str) -> tuple[Step, ...]:
    """Parse a ``program`` into steps with canonical attributes; raise ShapeError when malformed."""
    steps = []
    for j, part in enumerate(text.split(";") if text else []):
        m = _STEP.match(part.strip())
        require(m is not None, f"FusedElementwise: step {j} {part!r} is not Op(a,b) or Op{{k=v}}(a)")
        op, attr_text, args = m.groups()
        require(op in OP_TABLE and OP_TABLE[op].fusable, f"FusedElementwise: step {j}: {op} is not a fusable elementwise op")
        spec = get_op(op).attrs
        given = {}
        for item in filter(None, (attr_text or "").split(",")):
            key, _, val = item.partition("=")
            require(key in spec, f"FusedElementwise: step {j}: {op} has no attribute {key!r}")
            given[key] = _parse_value(op, key, spec[key].kind, val)
        steps.append(Step(op, tuple(int(x) for x in args.split(",")), tuple(sorted(get_op(op).normalize_attrs(given).items()))))
    require(bool(steps), "FusedElementwise: empty program")
    return tuple(steps)


def _program_types(ts: Sequence[TensorType], program: str) -> list[TensorType]:
    steps = parse_program(program)
    canonical = format_program(steps)
    require(canonical == program, f"FusedElementwise: program {program!r} is not canonical; write {canonical!r}")
    slots = list(ts)
    used: set[int] = set()
    for j, s in enumerate(steps):
        require(all(a < len(slots) for a in s.args), f"FusedElementwise: step {j} reads a slot not yet written")
        opdef = get_op(s.op)
        opdef.check_arity(len(s.args))
        used.update(s.args)
        slots.append(opdef.infer([slots[a] for a in s.args], dict(s.attrs))[0])
    unused = sorted(set(range(len(ts))) - used)
    require(not unused, f"FusedElementwise: input(s) {unused} are never read")
    return slots


def _fe_infer(ts: Sequence[TensorType], a):
    return [_program_types(ts, a["program"])[-1]]


def _fe_ref(xs: Sequence[np.ndarray], a):
    slots = list(xs)
    for s in parse_program(a["program"]):
        slots.append(get_op(s.op).reference([slots[i] for i in s.args], dict(s.attrs))[0])
    return [slots[-1]]


def _fe_flops(a, ins, outs) -> int:
    """One operation per output element per step."""
    return math.prod(outs[0].shape) * (str(a.get("program", "")).count(";") + 1)


register(
    _fused("FusedConv", "Conv", CONV_ATTRS, conv_flops),
    _fused("FusedGemm", "Gemm", GEMM_ATTRS, gemm_flops),
    OpDef("FusedElementwise", _fe_infer, _fe_ref, attrs={"program": AttrSpec(S)}, min_inputs=1, max_inputs=None,
          doc="a chain of elementwise ops as one kernel; see the module docstring for `program`",
          elementwise=True, flops=_fe_flops),
)
