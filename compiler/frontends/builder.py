"""GraphBuilder: what both frontends share — unique names, eager type inference, constant folding.

A frontend translates one source node at a time through :meth:`GraphBuilder.add`. Every node whose
inputs are all constants is folded on the spot with the reference interpreter, so Shape,
ConstantOfShape and shape arithmetic disappear whenever shapes are static. Unsupported source ops
are collected with :meth:`unsupported` and reported together by :meth:`build`.

Folding is bounded (hostile models): ``swells`` keeps one result near the size of its inputs, but a
chain of doublings (34 Concats of a constant with itself: 64 GiB from a 2 kB file) passes it at
every step. So no folded result exceeds :data:`MAX_FOLDED_ELEMENTS` (it stays an op, computed at run
time), and all results of one import together stay within a :class:`FoldBudget`: a LimitError is
raised before the allocation that would pass it.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Sequence
from typing import Any

import numpy as np

from .. import ops
from ..errors import LimitError, UnsupportedModelError
from ..ir.dtypes import DType
from ..ir.graph import Graph, Node
from ..ir.infer import infer_op
from ..ir.types import TensorType
from ..ir.verify import verify
from ..passes.fold_constants import swells
from ..passes.share_constants import share_constants

MAX_FOLDED_ELEMENTS = 1 << 26  # one folded (or frontend-built) constant at most: no unbounded allocation
FOLD_BUDGET_BYTES = 256 << 20  # all folded results of one import, besides FOLD_WEIGHT_FACTOR x the model's weights
FOLD_WEIGHT_FACTOR = 4  # folding a weight (a Transpose, a Cast to f32, a reshaped copy) may take a few times its bytes


class FoldBudget:
    """The bytes one import may fold, all results together; shared by the builders of one import (the
    scratch builders that evaluate batch probes charge it too). The model's own weights raise it
    (:meth:`GraphBuilder.weight`), so a large model folds as much of them as it needs."""

    def __init__(self, base: int = FOLD_BUDGET_BYTES):
        self.limit, self.used = base, 0

    def grant(self, weight_bytes: int) -> None:
        self.limit += FOLD_WEIGHT_FACTOR * weight_bytes

    def charge(self, nbytes: int, what: str) -> None:
        if self.used + nbytes > self.limit:
            raise LimitError(f"folding {what!r} would make the constants folded at import exceed {self.limit} "
                             f"bytes ({self.used} so far, {nbytes} more)")
        self.used += nbytes


class Unsupported(Exception):
    """A translator's signal that this node (or this form of it) cannot be imported: the frontend records
    it with :meth:`GraphBuilder.unsupported`, and the user sees one UnsupportedModelError naming all."""

    def __init__(self, reason: str = ""):
        super().__init__(reason)
        self.reason = reason


class GraphBuilder:
    def __init__(self, name: str, source: str = "model", hints: dict[str, str] | None = None,
                 budget: FoldBudget | None = None):
        """``hints``: op -> what the user can do instead, appended to the unsupported-op error;
        ``budget``: what folding may take, shared with other builders of the same import."""
        self.name = name
        self.budget = FoldBudget() if budget is None else budget
        self.source = source
        self.hints = hints or {}
        self.inputs: list[str] = []
        self.types: dict[str, TensorType] = {}
        self.constants: dict[str, np.ndarray] = {}
        self.nodes: list[Node] = []
        self._names: set[str] = set()
        self._node_names: set[str] = set()
        self._counters: dict[str, int] = {}  # base name -> the next suffix to try (unique)
        self._node_counters: dict[str, int] = {}
        self._interface: set[str] = set()  # the names reserved (reserve)
        self._reserved: set[str] = set()  # those not yet claimed
        self.claiming = True  # whether a value named exactly as a reserved name takes it
        self._unsupported: dict[str, list[str]] = {}

    # names --------------------------------------------------------------------------------------
    def reserve(self, names: Iterable[str]) -> None:
        """Keep ``names`` (a model's graph inputs and outputs: its interface) verbatim for the values that
        bear them: no other value gets one, even renamed ('y y' would become 'y_y', another output's
        name). A graph input, or a node output asked for by exactly that name, claims it (``claim``)."""
        names = set(names)
        self._interface |= names
        self._reserved |= names - self._names
        self._names |= names

    def give_name(self, value: str, name: str) -> str:
        """``value`` under the reserved ``name``, not yet claimed: the value renamed (everywhere it is used)
        unless it bears a reserved name itself, else an Identity of it. ``value`` when ``name`` is not free."""
        if name not in self._reserved:
            return value
        if value in self._interface or value in self.inputs:
            try:
                return self.add1("Identity", [value], name=name, output_names=[name])
            except Unsupported:  # a bounded value (NonZero's) is read by no other op
                return value
        self._reserved.discard(name)

        def swap(names: tuple[str, ...]) -> tuple[str, ...]:
            return tuple(name if n == value else n for n in names)

        self.nodes = [n.replace(inputs=swap(n.inputs), outputs=swap(n.outputs))
                      if value in n.inputs or value in n.outputs else n for n in self.nodes]
        self.types[name] = self.types.pop(value)
        if value in self.constants:
            self.constants[name] = self.constants.pop(value)
        return name

    def unique(self, hint: str, taken: set[str] | None = None, claim: bool = False) -> str:
        """``hint``, or ``hint_<i>`` with the first free i (counted on from the last one handed out: an
        unrolled loop asks for one hint thousands of times). ``claim``: a reserved name is taken as is."""
        taken = self._names if taken is None else taken
        if claim and self.claiming and taken is self._names and hint in self._reserved:
            self._reserved.discard(hint)
            return hint
        base = re.sub(r"\s+", "_", hint.strip()) or "v"
        name = base
        if name in taken:
            counters = self._node_counters if taken is self._node_names else self._counters
            i = counters.get(base, 1)
            while (name := f"{base}_{i}") in taken:
                i += 1
            counters[base] = i + 1
        taken.add(name)
        return name

    # values -------------------------------------------------------------------------------------
    def input(self, name: str, ttype: TensorType) -> str:
        name = self.unique(name, claim=True)
        self.inputs.append(name)
        self.types[name] = ttype
        return name

    def constant(self, value: Any, hint: str = "const", dtype: DType | None = None, claim: bool = False) -> str:
        arr = np.asarray(value, dtype=dtype.numpy if dtype else None)
        if arr.dtype == np.float64 and dtype is None and not isinstance(value, np.ndarray):
            arr = arr.astype(np.float32)
        DType.from_numpy(arr.dtype)  # rejects unsupported dtypes with a ShapeError
        name = self.unique(hint, claim=claim)
        arr = np.array(arr, order="C", copy=True)
        arr.flags.writeable = False
        self.constants[name] = arr
        self.types[name] = TensorType(DType.from_numpy(arr.dtype), tuple(int(d) for d in arr.shape))
        return name

    def weight(self, value: Any, hint: str, dtype: DType | None = None) -> str:
        """A constant the model itself holds (an initializer, a parameter): folding may take a few times its bytes.
        Named ``hint`` when that is reserved (an input it is the default of, an output it is)."""
        name = self.constant(value, hint=hint, dtype=dtype, claim=True)
        self.budget.grant(self.constants[name].nbytes)
        return name

    def type_of(self, name: str) -> TensorType:
        return self.types[name]

    def value_of(self, name: str) -> np.ndarray | None:
        """The value of ``name`` if it is a constant (folded or given), else None."""
        return self.constants.get(name)

    # nodes --------------------------------------------------------------------------------------
    def add(self, op: str, inputs: Sequence[str], name: str = "", n_outputs: int = 1,
            output_names: Sequence[str] | None = None, **attrs: Any) -> list[str]:
        """Append ``op`` (or fold it, when every input is a constant and the result would not swell
        the weights, see ``passes.fold_constants``, nor pass :data:`MAX_FOLDED_ELEMENTS`; the budget is
        charged first); return its output names."""
        hint = name or op.lower()
        opdef = ops.get_op(op)
        if not (opdef.narrow_ok or opdef.view) and any(self.types[i].dtype is DType.BF16 for i in inputs):
            return self._in_f32(op, inputs, hint, n_outputs, output_names, attrs)
        outs = [self.unique(o, claim=True) for o in output_names] if output_names else [
            self.unique(hint if n_outputs == 1 else f"{hint}:{i}") for i in range(n_outputs)]
        opdef.check_arity(len(inputs))
        bounded = [i for i in inputs if self.types[i].bounded]
        if bounded:  # the verifier keeps these to graph outputs: say so per node, as an unsupported form
            raise Unsupported(f"reads {bounded[0]!r}, whose length is known only at run time "
                              "(NonMaxSuppression, NonZero): such a result can only be a graph output")
        node = Node.make(op, inputs, outs, name=self.unique(hint, self._node_names), **attrs)
        out_types = infer_op(op, [self.types[i] for i in inputs], node.attr)
        out_bytes = sum(t.nbytes() for t in out_types)
        if (inputs and ops.get_op(op).foldable and all(i in self.constants for i in inputs)
                and not swells(out_bytes, sum(self.constants[i].nbytes for i in inputs))
                and all(t.numel() <= MAX_FOLDED_ELEMENTS for t in out_types)):
            self.budget.charge(out_bytes, hint)
            values = ops.get_op(op).reference([self.constants[i] for i in inputs], node.attr)
            for out, value, ty in zip(outs, values, out_types):
                arr = np.array(value, dtype=ty.dtype.numpy, order="C", copy=True)
                arr.flags.writeable = False
                self.constants[out] = arr
                self.types[out] = ty
            return outs
        self.nodes.append(node)
        self.types.update(zip(outs, out_types))
        return outs

    def _in_f32(self, op: str, inputs: Sequence[str], hint: str, n_outputs: int,
                output_names: Sequence[str] | None, attrs: dict[str, Any]) -> list[str]:
        """bfloat16 is stored, not computed in: ``op`` runs on its operands widened to f32, and each
        f32 result is rounded back (one rounding per op, as ONNX's reference does it)."""
        wide = {i: self.add1("Cast", [i], name=f"{hint}/f32", to=DType.F32)
                for i in dict.fromkeys(inputs) if self.types[i].dtype is DType.BF16}
        outs = self.add(op, [wide.get(i, i) for i in inputs], name=f"{hint}/f32", n_outputs=n_outputs, **attrs)
        names = list(output_names) if output_names else [
            hint if n_outputs == 1 else f"{hint}:{i}" for i in range(n_outputs)]
        return [self.add1("Cast", [o], name=n, output_names=[n], to=DType.BF16) if self.types[o].dtype is DType.F32
                else self.add1("Identity", [o], name=n, output_names=[n]) for o, n in zip(outs, names)]

    def add1(self, op: str, inputs: Sequence[str], name: str = "", **attrs: Any) -> str:
        return self.add(op, inputs, name=name, **attrs)[0]

    def unsupported(self, op: str, node_name: str) -> None:
        self._unsupported.setdefault(op, []).append(node_name)

    def raise_unsupported(self, constant_inputs: Sequence[str] = ()) -> None:
        if self._unsupported:
            raise UnsupportedModelError(self._unsupported, source=self.source, hints=self.hints,
                                        constant_inputs=constant_inputs)

    # result -------------------------------------------------------------------------------------
    def build(self, outputs: Iterable[str], constant_inputs: Sequence[str] = (),
              parameters: Collection[str] | None = None) -> Graph:
        """Drop what the outputs do not need, and return the verified Graph (``constant_inputs``: see
        :class:`UnsupportedModelError`). ``parameters``: the model's own named weights; given, every
        other constant identical to one before it (a weight the exporter repeated) is imported, and
        signed, once (:func:`~cuvil.compiler.passes.share_constants.share_constants`)."""
        self.raise_unsupported(constant_inputs)
        outputs = list(outputs)
        nodes, needed = [], set(outputs)
        for node in reversed(self.nodes):
            if needed.intersection(node.outputs):
                nodes.append(node)
                needed.update(node.inputs)
        nodes.reverse()
        # A graph output that is itself an input or a constant gets an Identity so outputs are computed;
        # a folded constant moves aside so the output keeps its source name, its Identity first, as
        # later nodes may read that output.
        final_outputs = []
        for out in outputs:
            if out in self.constants and out not in final_outputs:
                moved = self.unique(f"{out}_value")
                self.constants[moved] = self.constants.pop(out)
                self.types[moved] = self.types[out]
                nodes.insert(0, Node.make("Identity", [moved], [out]))
                needed.add(moved)
            elif out in self.inputs or out in final_outputs or out in self.constants:
                node = Node.make("Identity", [out], [self.unique(f"{out}_out")])
                nodes.append(node)
                self.types[node.outputs[0]] = self.types[out]
                needed.add(out)
                out = node.outputs[0]
            final_outputs.append(out)
        constants = {k: v for k, v in self.constants.items() if k in needed}
        used = set(self.inputs) | set(constants) | {o for n in nodes for o in n.outputs}
        graph = Graph(self.name, tuple(self.inputs), tuple(final_outputs), tuple(nodes),
                      {k: v for k, v in self.types.items() if k in used}, constants)
        return verify(graph if parameters is None else share_constants(graph, parameters))
