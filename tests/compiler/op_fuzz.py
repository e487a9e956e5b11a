"""A native-vs-reference op fuzzer: random single-op cases (random ranks, dims with zeros, attributes,
dtypes), many per compiled graph, each compared with the reference interpreter.

A generator proposes a case; the op's shape rule decides whether the verifier admits it (a refused
case is skipped, never a finding). For an admitted case the fuzzer checks that the reference's
output has the inferred type, and that the native code computes the reference's values (NaN where
it has NaN), or refuses at run time where the reference refuses. Used by ``test_op_fuzz.py`` with a
seeded budget, and as a script (``python -m tests.compiler.op_fuzz --cases 5000``) for long hunts.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass

import numpy as np

from cuvil.compiler import DType, Node, TensorType, infer_graph_types, run_reference
from cuvil.compiler.errors import CuvilError
from tests.compiler.op_fuzz_cases import GENERATORS as PLAIN_GENERATORS
from tests.compiler.op_fuzz_cases import NOT_FUZZED, Case, Rng
from tests.compiler.op_fuzz_quant_cases import QUANT_GENERATORS

GENERATORS = {**PLAIN_GENERATORS, **QUANT_GENERATORS}

__all__ = ["GENERATORS", "NOT_FUZZED", "Case", "build", "fuzz", "native_runner", "emulated_runner"]


# --- building, running, comparing ------------------------------------------------------------------
@dataclass
class Built:
    case: Case
    node: Node
    feeds: dict[str, np.ndarray]
    constants: dict[str, np.ndarray]
    types: dict[str, TensorType]
    ref: list[np.ndarray] | None = None
    ref_error: str | None = None


def build(case: Case, prefix: str) -> Built | None:
    """The case as one node over prefixed names, or None when the verifier would refuse it."""
    feeds, consts, types, names = {}, {}, {}, []
    for i, (role, value, is_const) in enumerate(case.operands):
        name = f"{prefix}_{role}{i}"
        names.append(name)
        value = np.ascontiguousarray(value)
        (consts if is_const else feeds)[name] = value
        types[name] = TensorType(DType.from_numpy(value.dtype), tuple(value.shape))
    outs = [f"{prefix}_y{j}" for j in range(case.outputs)]
    try:
        node = Node.make(case.op, names, outs, name=prefix, **case.attrs)
        g = infer_graph_types(prefix, {n: types[n] for n in feeds}, {n: _ro(v) for n, v in consts.items()}, [node], outs)
    except (CuvilError, ValueError):
        return None
    built = Built(case, node, feeds, {n: _ro(v) for n, v in consts.items()}, dict(g.types))
    try:
        with np.errstate(all="ignore"):
            out = run_reference(g, feeds)
        built.ref = [out[o] for o in outs]
    except CuvilError as e:
        built.ref_error = str(e)
    except Exception as e:  # noqa: BLE001 - an untyped failure of the reference is itself a finding
        built.ref_error = f"UNTYPED {type(e).__name__}: {e}"
    return built


def _ro(a: np.ndarray) -> np.ndarray:
    a = a.copy()
    a.flags.writeable = False
    return a


def graph_of(built: list[Built], name: str = "fuzz"):
    """One graph holding every case's node, side by side."""
    inputs = {n: b.types[n] for b in built for n in b.feeds}
    consts = {n: v for b in built for n, v in b.constants.items()}
    outs = [o for b in built for o in b.node.outputs]
    return infer_graph_types(name, inputs, consts, [b.node for b in built], outs)


TOLERANCE = {np.dtype(np.float16): (2e-3, 2e-3), np.dtype(np.float32): (2e-4, 2e-5), np.dtype(np.float64): (1e-9, 1e-12)}


def mismatch(b: Built, got: dict[str, np.ndarray]) -> str | None:
    """Why the native outputs differ from the reference's, or None when they agree."""
    for o, want in zip(b.node.outputs, b.ref):
        t = b.types[o]
        if tuple(want.shape) != tuple(t.shape) or want.dtype != t.dtype.numpy:
            return f"reference gives {want.dtype}{list(want.shape)}, the shape rule says {t}"
        have = got[o]
        if have.shape != want.shape or have.dtype != want.dtype:
            return f"native gives {have.dtype}{list(have.shape)}, reference {want.dtype}{list(want.shape)}"
        if want.dtype.kind == "f":
            rtol, atol = TOLERANCE[want.dtype]
            w, h = want.astype(np.float64), have.astype(np.float64)
            if not np.array_equal(np.isnan(w), np.isnan(h)):
                return f"NaN at other places: native {h.ravel()[:6]}, reference {w.ravel()[:6]}"
            ok = ~np.isnan(w)
            if not np.allclose(h[ok], w[ok], rtol=rtol, atol=atol):
                k = int(np.argmax(np.abs(h[ok] - w[ok])))
                return f"values differ: native {h[ok][k]!r}, reference {w[ok][k]!r}"
        elif not np.array_equal(have, want):
            return f"values differ: native {have.ravel()[:6]}, reference {want.ravel()[:6]}"
    return None


def generate(rng: Rng, count: int, ops=None, generators=None) -> tuple[list[Built], int]:
    """``count`` admitted cases (round-robin over ``ops`` of ``generators``, by default all of
    GENERATORS), and how many proposals were refused."""
    generators = generators or GENERATORS
    ops = sorted(ops or generators)
    admitted, refused, i = [], 0, 0
    while len(admitted) < count and refused < 50 * count:
        op = ops[i % len(ops)]
        i += 1
        b = build(generators[op](rng), f"c{i}")
        if b is None:
            refused += 1
        else:
            admitted.append(b)
    return admitted, refused


@dataclass
class Outcome:
    """What native code did with one case: ``outputs``, or a typed ``refused`` reason, or a ``crash``."""

    outputs: dict[str, np.ndarray] | None = None
    refused: str | None = None
    crash: str | None = None


def native_runner(workdir, guard_pages: bool = True):
    """Compile and run a chunk on this machine, in a forked child (a memory fault is a finding, not the end)."""
    import faulthandler
    import os
    import pickle
    import tempfile

    def run(chunk: list[Built]) -> tuple[str, object]:
        fd, path = tempfile.mkstemp(dir=workdir, suffix=".pkl")
        os.close(fd)
        pid = os.fork()
        if pid == 0:  # the child: never returns
            faulthandler.disable()  # a fault is reported by the parent, with the case that caused it
            code = 0
            try:
                from cuvil.edge_runtime.compile import compile_graph

                try:
                    sess = compile_graph(graph_of(chunk), use_cache=False, optimize=False, guard_pages=guard_pages)
                    result = ("outputs", sess.run({n: v for b in chunk for n, v in b.feeds.items()}))
                except CuvilError as e:
                    result = ("refused", f"{type(e).__name__}: {e}")
                except Exception as e:  # noqa: BLE001
                    result = ("crash", f"untyped {type(e).__name__}: {e}")
                with open(path, "wb") as f:
                    pickle.dump(result, f)
            except BaseException:  # noqa: BLE001
                code = 3
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        try:
            if os.WIFSIGNALED(status):
                return "crash", f"killed by signal {os.WTERMSIG(status)}"
            with open(path, "rb") as f:
                return pickle.load(f)
        except (OSError, EOFError, pickle.PickleError):
            return "crash", f"child exited with status {status}"
        finally:
            os.unlink(path)

    return run


def emulated_runner(workdir, profile: str = "rpi5"):
    """Cross-compile a chunk for ``profile`` and run it under qemu in the guard-page harness."""
    from cuvil.devices.emulation import EmulationError
    from cuvil.edge_runtime.emulated import EmulatedModel

    def run(chunk: list[Built]) -> tuple[str, object]:
        try:
            em = EmulatedModel(graph_of(chunk), profile, use_cache=False, workdir=workdir)
            try:
                (out,) = em.run([{n: v for b in chunk for n, v in b.feeds.items()}])
            finally:
                em.close()
            return "outputs", out
        except EmulationError as e:
            fault = "signal" in str(e) or "fault" in str(e) or "bus error" in str(e)
            return ("crash" if fault else "refused"), str(e)
        except CuvilError as e:
            return "refused", f"{type(e).__name__}: {e}"
        except Exception as e:  # noqa: BLE001
            return "crash", f"untyped {type(e).__name__}: {e}"

    return run


def outcomes(chunk: list[Built], run) -> dict[str, Outcome]:
    """Run the chunk as one graph; a chunk that fails is split until the failing case is alone."""
    kind, detail = run(chunk)
    if kind == "outputs":
        return {b.node.name: Outcome(outputs={o: detail[o] for o in b.node.outputs}) for b in chunk}
    if len(chunk) > 1:
        half = len(chunk) // 2
        return {**outcomes(chunk[:half], run), **outcomes(chunk[half:], run)}
    return {chunk[0].node.name: Outcome(refused=detail) if kind == "refused" else Outcome(crash=detail)}


def finding(b: Built, outcome: Outcome) -> str | None:
    """What is wrong with one case, or None: the reference must not crash, native code must not crash,
    and must compute what the reference computes, or refuse (typed) where the reference refuses."""
    if b.ref_error and b.ref_error.startswith("UNTYPED"):
        return f"the reference fails untyped on a verified graph: {b.ref_error}"
    if outcome.crash:
        return f"native code crashes: {outcome.crash}"
    if b.ref is None:
        return None if outcome.refused else "native code computes where the reference refuses"
    if outcome.refused:
        return f"native code refuses where the reference computes: {outcome.refused}"
    return mismatch(b, outcome.outputs)


def fuzz(rng: Rng, count: int, run, per_graph: int = 40, ops=None, generators=None):
    """Run ``count`` admitted cases with ``run`` (a runner above); return (findings as (case, reason),
    cases, refused proposals)."""
    cases, refused = generate(rng, count, ops, generators)
    computed = [b for b in cases if b.ref is not None]
    alone = [[b] for b in cases if b.ref is None]  # each runs alone: it must refuse at run time
    chunks = [computed[i:i + per_graph] for i in range(0, len(computed), per_graph)] + alone
    seen: dict[str, Outcome] = {}
    for chunk in chunks:
        seen.update(outcomes(chunk, run))
    findings = [(b, why) for b in cases if (why := finding(b, seen[b.node.name]))]
    return findings, cases, refused


def main() -> None:  # pragma: no cover - a hunting tool
    import tempfile

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--per-graph", type=int, default=40)
    ap.add_argument("--ops", default="")
    ap.add_argument("--qemu", default="", help="a device profile to emulate (rpi5, arm64-sve2, ...) instead of native")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run = emulated_runner(tmp, args.qemu) if args.qemu else native_runner(tmp)
        findings, cases, refused = fuzz(np.random.default_rng(args.seed), args.cases, run, args.per_graph,
                                        args.ops.split(",") if args.ops else None)
    print(f"{len(cases)} cases admitted, {refused} proposals refused by the verifier")
    for b, why in findings:
        print(f"FINDING {b.case.describe()}: {why}"[:500])
    print(f"{len(findings)} findings")


if __name__ == "__main__":  # pragma: no cover
    main()
