"""Typed errors for the whole of Cuvil; the CLI formats them in one place."""

from __future__ import annotations

from collections.abc import Mapping, Sequence


class CuvilError(Exception):
    """Base of every error Cuvil raises on purpose: a user-facing, one-line reason."""


class VerifyError(CuvilError):
    """A graph breaks an IR invariant (types, attributes, ordering, names)."""


class ParseError(CuvilError):
    """The text form of a graph could not be parsed."""


class ShapeError(CuvilError):
    """An op was given operands whose shapes or dtypes it cannot accept."""


class InterpreterError(CuvilError):
    """The reference interpreter was given inputs that do not match the graph."""


class RunTimeCheckError(InterpreterError):
    """Compiled code met operand values the op refuses (OpDef.run_time_check), having read nothing outside its tensors."""

    def __init__(self) -> None:
        super().__init__("an index is out of range for the axis it selects from or writes to (a gather or "
                         "scatter op of the model); the model refuses these inputs")


class BoundedCountError(InterpreterError):
    """A bounded result's valid length (``TensorType.bounded_axis``) lies outside [0, its bound]: the code that
    wrote it is not the code lowered for this model."""


class UnsupportedModelError(CuvilError):
    """A model uses ops or features Cuvil cannot import; names all of them at once."""

    def __init__(self, unsupported: Mapping[str, Sequence[str]], source: str = "model",
                 hints: Mapping[str, str] | None = None, constant_inputs: Sequence[str] = ()):
        """``constant_inputs``: graph inputs that ops need as constants (shapes, axes, bounds...);
        given as constants (``import_onnx(..., constant_inputs=...)``) they may make the model import."""
        self.unsupported = {op: tuple(nodes) for op, nodes in sorted(unsupported.items())}
        self.constant_inputs = tuple(constant_inputs)
        parts = []
        for op, nodes in self.unsupported.items():
            shown = ", ".join(nodes[:5]) + (f", ... ({len(nodes)} nodes)" if len(nodes) > 5 else "")
            parts.append(f"{op} (used by {shown})")
        advice = list(dict.fromkeys(hints[op] for op in self.unsupported if hints and op in hints))
        if self.constant_inputs:
            advice.append(f"Graph input(s) {', '.join(map(repr, self.constant_inputs))} must be constants "
                          "(Cuvil IR takes shapes, axes and bounds statically): pass their values as constant_inputs")
        super().__init__(f"{source} uses {len(parts)} unsupported op(s): " + "; ".join(parts)
                         + "".join(f". {a}" for a in advice))


class BundleError(CuvilError):
    """A bundle is malformed, tampered with, or not signed by a trusted key."""


class CompileError(CuvilError):
    """Lowering or native compilation of a graph failed."""


class LimitError(CuvilError):
    """A graph asks for more than the device's resource limits allow (see ``ir/limits.py``)."""


class BundleLimitError(BundleError, LimitError):
    """A bundle's graph exceeds the device's resource limits: refused at load, before the work starts."""


class DeltaError(BundleError):
    """A signed delta is malformed, tampered with, too large, not signed by a trusted key, or does not
    make the version it names: nothing it would make is installed."""


class DeltaParentError(DeltaError):
    """A signed delta applies to another parent than the bundle it was given (the exact bytes differ)."""
