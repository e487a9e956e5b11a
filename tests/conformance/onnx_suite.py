"""ONNX's own backend conformance suite run through Cuvil: import, reference interpreter, native code.

The cases (and their scope) come from :mod:`.onnx_cases`. A case passes when its model imports, the reference interpreter reproduces every expected output
and the native code for the host does too (ONNX's own rule: same shape, same dtype, allclose with
the case's rtol/atol).

Speed: single-op cases are compiled many at a time. :func:`merge` puts the graphs of a chunk side by
side in one Cuvil graph (one lowering, one LLVM module, one JIT load, one native call); a chunk whose
merged build fails is rebuilt case by case, so one bad case never hides the others. Cases run in
spawned worker processes: a worker that dies (a crash) or overruns its time (a hang) is replaced and
the chunk retried case by case, and the case that kills a worker on its own is recorded as a crash
or a hang. Any exception that is not a ``CuvilError`` is an *untyped* error.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from tests.conformance.onnx_cases import Case

OUTCOMES = ("pass", "unsupported", "import error", "reference mismatch", "reference error",
            "native mismatch", "native error", "untyped error", "crash", "hang")
"""Every outcome: only ``pass`` passes; the last three are what must never happen."""
NEVER = ("untyped error", "crash", "hang")


@dataclass(frozen=True)
class Result:
    name: str
    outcome: str
    detail: str = ""
    ops: tuple[str, ...] = ()


# --- one case, in a worker ------------------------------------------------------------------------
def close_enough(got: np.ndarray, want: np.ndarray, rtol: float, atol: float) -> str:
    """ONNX's own rule (``Runner.assert_similar_outputs``): '' when equal enough, else why not."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return f"shape {got.shape}, expected {want.shape}"
    if got.dtype != want.dtype:
        return f"dtype {got.dtype}, expected {want.dtype}"
    if want.dtype == object:
        return "" if np.array_equal(got, want) else "values differ"
    if want.dtype.name == "bfloat16":
        rtol, got, want = max(rtol, 2**-6), got.astype(np.float32), want.astype(np.float32)
    elif want.dtype.kind not in "fciub":  # float8, int4, ...: compare their float values
        got, want = got.astype(np.float32), want.astype(np.float32)
    try:
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
    except AssertionError as e:
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip().startswith(("Mismatched", "Max abs"))]
        return "; ".join(lines) or "values differ"
    return ""


class _Failed(Exception):
    def __init__(self, outcome: str, detail: str, constant_inputs: Sequence[str] = ()):
        super().__init__(detail)
        self.outcome, self.detail, self.constant_inputs = outcome, detail, tuple(constant_inputs)


def _guard(stage: str, fn: Callable):
    """Run one stage: a CuvilError becomes that stage's typed failure, anything else is untyped."""
    from cuvil.compiler.errors import CuvilError, UnsupportedModelError

    try:
        return fn()
    except _Failed:
        raise
    except UnsupportedModelError as e:
        raise _Failed("unsupported", str(e)[:300], e.constant_inputs) from None
    except CuvilError as e:
        raise _Failed(f"{stage} error", f"{type(e).__name__}: {str(e)[:300]}") from None
    except Exception as e:  # noqa: BLE001  (what must never happen: recorded, never hidden)
        raise _Failed("untyped error", f"{stage}: {type(e).__name__}: {str(e)[:300]}") from None


def _compare(stage: str, case: Case, graph: Imported, got: Sequence[Mapping[str, np.ndarray]]) -> None:
    for k, ((_, want), outs) in enumerate(zip(case.data_sets, got)):
        for i, (name, expected) in enumerate(zip(graph.outputs, want)):
            why = close_enough(outs[name], expected, case.rtol, case.atol)
            if why:
                raise _Failed(f"{stage} mismatch", f"data set {k}, output {i}: {why}")


@dataclass(frozen=True)
class Imported:
    """A case's graph, and the ONNX inputs it was given as constants (``constant_inputs``)."""

    graph: object
    fixed: frozenset[str] = frozenset()

    @property
    def outputs(self) -> tuple[str, ...]:
        return self.graph.outputs  # type: ignore[attr-defined]


def feeds(case: Case, imported: Imported) -> list[dict[str, np.ndarray]]:
    """The case's inputs by Cuvil input name (ONNX's graph inputs in order, fixed ones left out)."""
    graph, out = imported.graph, []
    for ins, _ in case.data_sets:
        given = [x for name, x in zip(case.inputs, ins) if name not in imported.fixed]
        if len(ins) != len(case.inputs) or len(given) != len(graph.inputs):
            raise _Failed("import error", f"the case gives {len(ins)} inputs, the graph takes {len(graph.inputs)}")
        out.append(dict(zip(graph.inputs, given)))
    return out


def import_case(case: Case) -> Imported:
    """Import the model; graph inputs that Cuvil needs as constants (a Reshape's shape...) are
    fixed to the data set's values and the model imported again (they must be equal in every set)."""
    from cuvil.compiler.frontends.onnx import import_onnx

    def attempt(fixed: dict[str, np.ndarray]) -> Imported:
        return Imported(_guard("import", lambda: import_onnx(case.model, constant_inputs=fixed)), frozenset(fixed))

    fixed: dict[str, np.ndarray] = {}
    while True:  # one node may need several inputs fixed, found one attempt at a time
        try:
            imported = attempt(fixed)
            break
        except _Failed as f:
            needed = set(f.constant_inputs) - set(fixed)
            values = {name: [ins[k] for ins, _ in case.data_sets] for k, name in enumerate(case.inputs) if name in needed}
            if not needed or needed - set(values) or any(
                    not all(np.array_equal(v[0], w) for w in v[1:]) for v in values.values()):
                raise
            fixed.update({name: v[0] for name, v in values.items()})
    if len(imported.outputs) != len(case.data_sets[0][1]):
        raise _Failed("import error", f"{len(imported.outputs)} outputs, expected {len(case.data_sets[0][1])}")
    return imported


def check_reference(case: Case, imported: Imported) -> None:
    from cuvil.compiler.interpreter import run_reference

    with np.errstate(all="ignore"):
        got = _guard("reference", lambda: [run_reference(imported.graph, f) for f in feeds(case, imported)])
    _compare("reference", case, imported, got)


def run_native(graph, feed_sets: Sequence[Mapping[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    from cuvil.compiler.interpreter import bind_inputs
    from cuvil.edge_runtime.compile import compile_graph

    batch = bind_inputs(graph, feed_sets[0])[1] or 1
    session = compile_graph(graph, batch=batch, use_cache=False, jobs=1, guard_pages=True)  # a stray access faults
    return [session.run(f) for f in feed_sets]


# --- merging a chunk into one graph ---------------------------------------------------------------
def merge(graphs: Sequence, name: str = "conformance"):
    """The graphs side by side in one graph; value ``v`` of graph ``i`` becomes ``c{i}/v``."""
    from cuvil.compiler.ir.graph import Graph

    inputs, outputs, nodes, types, constants = [], [], [], {}, {}
    for i, g in enumerate(graphs):
        def rn(v: str, i: int = i) -> str:
            return f"c{i}/{v}"

        inputs += [rn(v) for v in g.inputs]
        outputs += [rn(v) for v in g.outputs]
        nodes += [n.replace(name=rn(n.name), inputs=tuple(map(rn, n.inputs)), outputs=tuple(map(rn, n.outputs)))
                  for n in g.nodes]
        types.update({rn(k): t for k, t in g.types.items()})
        constants.update({rn(k): v for k, v in g.constants.items()})
    return Graph(name, tuple(inputs), tuple(outputs), tuple(nodes), types, constants)


def split_outputs(graphs: Sequence, merged_out: Mapping[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    return [{v: merged_out[f"c{i}/{v}"] for v in g.outputs} for i, g in enumerate(graphs)]


def mergeable(case: Case, imported: Imported) -> bool:
    return len(case.data_sets) == 1 and all(t.is_static for t in imported.graph.types.values())


# --- a foreign device under qemu ------------------------------------------------------------------
def run_emulated(cases: Sequence[Case], profile: str, sve_vector_bits: int | None = None) -> list[Result]:
    """The cases built for device ``profile`` in one module, linked once, run once under qemu
    (``edge_runtime.emulated``). Cases that do not import, match on the reference or lower for the
    target are left out: the host run counts those."""
    from cuvil.compiler.codegen.lower import lower
    from cuvil.compiler.errors import CuvilError
    from cuvil.devices import resolve_target
    from cuvil.edge_runtime.emulated import EmulatedModel

    target = resolve_target(profile)
    ready: list[tuple[Case, Imported]] = []
    for case in cases:
        try:
            imported = import_case(case)
            check_reference(case, imported)
            lower(imported.graph, target)
        except (_Failed, CuvilError):
            continue
        if mergeable(case, imported):
            ready.append((case, imported))
    graphs = [imp.graph for _, imp in ready]
    model = EmulatedModel(merge(graphs), target, use_cache=False)
    try:
        feed = {f"c{i}/{k}": v for i, (c, imp) in enumerate(ready) for k, v in feeds(c, imp)[0].items()}
        (out,) = model.run([feed], sve_vector_bits=sve_vector_bits)
    finally:
        model.close()
    results = []
    for (case, imported), got in zip(ready, split_outputs(graphs, out)):
        try:
            _compare("native", case, imported, [got])
            results.append(Result(case.name, "pass", "", case.ops))
        except _Failed as f:
            results.append(Result(case.name, f.outcome, f.detail, case.ops))
    return results


# --- a worker: runs chunks of cases ---------------------------------------------------------------
Runner = Callable[[object, Sequence[Mapping[str, np.ndarray]]], list]


def run_chunk(cases: Sequence[Case], native: Runner = run_native, report: Callable[[Result], None] = lambda r: None,
              stage: Callable[[str, str], None] = lambda name, what: None) -> list[Result]:
    """Import, reference and native for each case; the native builds of a chunk are merged."""
    results: dict[str, Result] = {}
    ready: list[tuple[Case, object]] = []

    def done(case: Case, outcome: str, detail: str = "") -> None:
        results[case.name] = r = Result(case.name, outcome, detail, case.ops)
        report(r)

    for case in cases:
        stage(case.name, "import")
        try:
            graph = import_case(case)
            stage(case.name, "reference")
            check_reference(case, graph)
        except _Failed as f:
            done(case, f.outcome, f.detail)
            continue
        ready.append((case, graph))
    merged = [(c, g) for c, g in ready if mergeable(c, g)]
    singles = [(c, g) for c, g in ready if not mergeable(c, g)]
    if len(merged) > 1:
        stage("", "native (merged)")
        try:
            graphs = [g.graph for _, g in merged]
            big = merge(graphs)
            outs = native(big, [{f"c{i}/{k}": v for i, (c, g) in enumerate(merged) for k, v in feeds(c, g)[0].items()}])
            for (case, graph), got in zip(merged, split_outputs(graphs, outs[0])):
                try:
                    _compare("native", case, graph, [got])
                    done(case, "pass")
                except _Failed as f:
                    done(case, f.outcome, f.detail)
            merged = []
        except Exception:  # noqa: BLE001  (the cases are retried one by one, which says which failed)
            pass
    for case, graph in merged + singles:
        stage(case.name, "native")
        try:
            got = _guard("native", lambda: native(graph.graph, feeds(case, graph)))
            _compare("native", case, graph, got)
            done(case, "pass")
        except _Failed as f:
            done(case, f.outcome, f.detail)
    return [results[c.name] for c in cases]


def _worker(path: str, conn) -> None:
    """Worker process: cases from the pickle at ``path``; jobs (lists of indices) from ``conn``."""
    warnings.simplefilter("ignore")
    with open(path, "rb") as f:
        cases = pickle.load(f)
    conn.send(("ready",))
    while True:
        job = conn.recv()
        if job is None:
            return
        single = len(job) == 1
        run_chunk([cases[i] for i in job], report=lambda r: conn.send(("result", r)),
                  stage=(lambda n, s: conn.send(("stage", s))) if single else (lambda n, s: None))
        conn.send(("done",))


class _Slot:
    """One worker process and the job it runs."""

    def __init__(self, ctx, path: str):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker, args=(path, child), daemon=True)
        self.proc.start()
        child.close()
        self.job: list[int] = []
        self.started = 0.0
        self.stage = ""
        self.ready = False

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join()
        self.conn.close()


def run_suite(cases: Sequence[Case], workers: int = 2, chunk: int = 24, case_timeout: float = 60.0,
              progress: Callable[[Result], None] | None = None) -> list[Result]:
    """Run every in-scope case of ``cases`` in ``workers`` processes; results in case order."""
    todo = [i for i, c in enumerate(cases) if c.scope is None]
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="cuvil-conformance-") as tmp:
        path = os.path.join(tmp, "cases.pkl")
        with open(path, "wb") as f:
            pickle.dump(list(cases), f, protocol=pickle.HIGHEST_PROTOCOL)
        queue = [todo[k:k + chunk] for k in range(0, len(todo), chunk)]
        results: dict[int, Result] = {}
        index = {c.name: i for i, c in enumerate(cases)}
        slots = [_Slot(ctx, path) for _ in range(max(1, min(workers, len(queue))))]
        try:
            while queue or any(s.job for s in slots):
                for k, s in enumerate(slots):
                    if s.ready and not s.job and queue:
                        s.job, s.started, s.stage = queue.pop(0), time.monotonic(), ""
                        s.conn.send(s.job)
                _wait(slots)
                for k, s in enumerate(slots):
                    slots[k] = _drain(s, ctx, path, cases, results, index, queue, case_timeout, progress)
        finally:
            for s in slots:
                if s.proc.is_alive():
                    try:
                        s.conn.send(None)
                    except OSError:
                        pass
                s.proc.join(timeout=5)
                s.kill()
    return [results[i] for i in todo]


def _wait(slots: list[_Slot]) -> None:
    from multiprocessing.connection import wait

    wait([s.conn for s in slots] + [s.proc.sentinel for s in slots], timeout=1.0)


def _drain(s: _Slot, ctx, path, cases, results, index, queue, case_timeout, progress) -> _Slot:
    """Read what ``s`` reported; replace it when it died or overran, retrying its job case by case."""
    dead = False
    try:
        while s.conn.poll():
            msg = s.conn.recv()
            if msg[0] == "ready":
                s.ready = True
            elif msg[0] == "stage":
                s.stage = msg[1]
            elif msg[0] == "result":
                r = msg[1]
                results[index[r.name]] = r
                if progress:
                    progress(r)
            elif msg[0] == "done":
                s.job = []
    except (EOFError, OSError):
        dead = True
    overran = bool(s.job) and time.monotonic() - s.started > case_timeout * max(1.0, len(s.job) / 4)
    if not (dead or overran or (not s.proc.is_alive())):
        return s
    left = [i for i in s.job if i not in results]
    if len(left) == 1 and len(s.job) == 1:
        case = cases[left[0]]
        what = "hang" if overran else "crash"
        code = s.proc.exitcode
        detail = f"during {s.stage or 'start'}" + ("" if overran else f" (exit code {code})")
        results[left[0]] = r = Result(case.name, what, detail, case.ops)
        if progress:
            progress(r)
    else:
        queue[:0] = [[i] for i in left]
    s.kill()
    return _Slot(ctx, path)


# --- the figures ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Summary:
    total: int
    in_scope: int
    counts: Mapping[str, int]

    @property
    def passed(self) -> int:
        return self.counts.get("pass", 0)

    @property
    def share(self) -> float:
        return self.passed / self.in_scope if self.in_scope else 0.0

    def line(self) -> str:
        parts = ", ".join(f"{k} {self.counts[k]}" for k in OUTCOMES if self.counts.get(k))
        return (f"ONNX conformance: {self.passed}/{self.in_scope} in-scope cases pass ({100 * self.share:.1f}%) "
                f"[{parts}]; {self.total - self.in_scope} out of scope")


def summarize(cases: Sequence[Case], results: Sequence[Result]) -> Summary:
    return Summary(len(cases), len(results), dict(Counter(r.outcome for r in results)))


def failing_ops(results: Sequence[Result], top: int = 40) -> list[tuple[str, int]]:
    """Ops of failing cases, most frequent first (a case counts once per op it uses)."""
    count: Counter = Counter()
    for r in results:
        if r.outcome != "pass":
            count.update(r.ops)
    return count.most_common(top)
