"""Signed bundles that ask for unbounded work, each run through the real CLI under RLIMIT_AS = 2 GiB.

Every one must end in one ``error:`` line and exit status 1 (a typed error, no traceback, no
MemoryError): the limit stops the work before it starts. The bundles are signed by a key
the device trusts, as a buggy or hostile author's would be.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from cuvil.compiler.bundle import generate_keypair, load_private_key
from cuvil.compiler.bundle.format import Manifest, canonical_json

from ..compiler.bundle.helpers import resign
from ..compiler.test_limits import concat_text, relu_chain_text

AS_LIMIT = 2 << 30


def _manifest(graph_text: str, inputs, outputs) -> bytes:
    return Manifest("hostile", "1", "test", graph_text, tuple(inputs), tuple(outputs), ()).encode()


def _distinct_concats(count: int) -> str:
    """``count`` Concats of 256, 255, ... inputs: every kernel distinct, each at the operand limit."""
    lines = ['graph "g" (x: f32[1,4]) -> (c0) {']
    for i in range(count):
        k = 256 - i
        lines.append(f"  c{i}: f32[1,{4 * k}] = Concat @n{i} ({', '.join(['x'] * k)}) {{axis=1}}")
    return "\n".join(lines + ["}"]) + "\n"


def _many_weights(n: int) -> bytes:
    weights = [{"name": f"w{i}", "dtype": "f32", "shape": [0], "offset": 0, "length": 0, "sha256": "0" * 64}
               for i in range(n)]
    obj = {"name": "m", "version": "1", "producer": "p", "graph": "graph", "inputs": [], "outputs": [],
           "weights": weights}
    return canonical_json(obj)


X14 = [("x", "f32[1,4]")]
HOSTILE = {
    # name: (manifest bytes, cuvil command, expected error text)
    "nodes": (lambda: _manifest(relu_chain_text(70_000), [("x", "f32[N,4]")], [("v70000", "f32[N,4]")]),
              "verify", "65536 nodes"),
    "inputs_per_node": (lambda: _manifest(concat_text(20_000), X14, [("y", "f32[1,80000]")]), "verify", "257 inputs"),
    "activations": (lambda: _manifest(f'graph "g" (x: f32[{2**40}]) -> (y) {{\n  y: f32[{2**40}] = Relu @r (x)\n}}\n',
                                      [("x", f"f32[{2**40}]")], [("y", f"f32[{2**40}]")]), "verify", "activations"),
    "compile_work": (lambda: _manifest(_distinct_concats(8), X14, [("c0", "f32[1,1024]")]), "verify", "units of work"),
    "manifest_entries": (lambda: _many_weights(200_000), "verify", "this device's limit"),
    "list_attribute": (lambda: _manifest('graph "g" (x: f32[1]) -> (y) {\n  y: f32[1] = Pad @p (x) {pads=['
                                         + ",".join(["0"] * 100_000) + "]}\n}\n", [("x", "f32[1]")],
                                         [("y", "f32[1]")]), "verify", "list attribute"),
    "batch_activations": (lambda: _manifest('graph "g" (x: f32[N,1024]) -> (y) {\n  y: f32[N,1024] = Relu @r (x)\n}\n',
                                            [("x", "f32[N,1024]")], [("y", "f32[N,1024]")]),
                          "bench --runs 5 --batch 100000000", "activations"),
}


@pytest.fixture(scope="module")
def signed(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    pair = generate_keypair(root / "keys")
    key = load_private_key(pair.private_path)
    paths = {}
    for name, (make, _, _) in HOSTILE.items():
        paths[name] = root / f"{name}.cuvil"
        paths[name].write_bytes(resign(make(), b"", key))
    return paths, pair.public_path


@pytest.fixture(scope="module")
def refusals(signed):
    """Every hostile bundle through the CLI, two processes at a time (each is seconds of imports and parsing)."""
    paths, pub = signed
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {name: pool.submit(_cuvil, *command.split(), paths[name], "--trust", pub)
                   for name, (_, command, _) in HOSTILE.items()}
        return {name: f.result() for name, f in futures.items()}


def _limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))


def _cuvil(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cuvil", *map(str, args)], capture_output=True, text=True,
                          timeout=300, preexec_fn=_limit_memory, env={**os.environ, "CUVIL_TRUST_DIR": "/nonexistent"})


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_each_limit_is_a_one_line_error_under_2_gib(refusals, name):
    done, expected = refusals[name], HOSTILE[name][2]
    assert done.returncode == 1, (done.returncode, done.stderr[-2000:])
    assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1, done.stderr[-2000:]
    assert expected in done.stderr and "Traceback" not in done.stderr and "MemoryError" not in done.stderr


def test_inspect_of_an_untrusted_bundle_reads_only_what_it_prints(signed, tmp_path):
    """A big bundle from a signer not trusted here: its head is shown, its graph never parsed."""
    paths, _ = signed
    done = _cuvil("inspect", paths["nodes"], "--no-graph")
    assert done.returncode == 0, done.stderr
    assert "NOT trusted here" in done.stdout and "not parsed" in done.stdout and "v70000: f32[N,4]" in done.stdout
    shown = _cuvil("inspect", paths["nodes"])
    assert shown.returncode == 0 and shown.stdout.count(" = Relu @") == 70_000


def test_the_limits_do_not_refuse_an_ordinary_bundle(signed, tmp_path):
    """The same subprocess and memory limit run a normal model to the end (so the refusals above are the limits')."""
    _, pub = signed
    key = load_private_key(pub.with_suffix(".key"))
    path = tmp_path / "ok.cuvil"
    path.write_bytes(resign(_manifest(relu_chain_text(50), [("x", "f32[N,4]")], [("v50", "f32[N,4]")]), b"", key))
    np.save(tmp_path / "x.npy", np.ones((2, 4), np.float32))
    done = _cuvil("run", path, "--trust", pub, "--input", tmp_path / "x.npy")
    assert done.returncode == 0, done.stderr
    assert "v50: float32[2, 4]" in done.stdout
