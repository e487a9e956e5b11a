"""Loading on a device: verify first, each weight in a private copy of its own, the trust store, no heavy imports."""

from __future__ import annotations

import mmap
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from cuvil.compiler import run_reference
from cuvil.compiler.bundle import KeyFileError, generate_keypair, load_public_key, save_bundle
from cuvil.compiler.errors import BundleError
from cuvil.edge_runtime import (
    Model, TrustStore, compile_graph, compile_model, default_trust_dir, load, load_bytes, resolve_trust,
)

from ..compiler.bundle.helpers import small_graph


@pytest.fixture
def keys(tmp_path):
    return generate_keypair(tmp_path / "keys")


@pytest.fixture
def bundle(tmp_path, keys):
    from cuvil.compiler.bundle import load_private_key

    path = tmp_path / "m.cuvil"
    save_bundle(small_graph(), path, load_private_key(keys.private_path), name="m", version="3", producer="test")
    return path


@pytest.fixture(autouse=True)
def empty_trust_dir(tmp_path, monkeypatch):
    d = tmp_path / "trusted"
    monkeypatch.setenv("CUVIL_TRUST_DIR", str(d))
    return d


def _base(arr: np.ndarray):
    while isinstance(arr, np.ndarray) and arr.base is not None:
        arr = arr.base
    return arr.obj if isinstance(arr, memoryview) else arr


def test_load_verifies_and_views_private_weights_read_only(bundle, keys):
    model = load(bundle, [keys.public_path])
    assert isinstance(model, Model)
    assert (model.name, model.version, model.producer, model.signer) == ("m", "3", "test", keys.fingerprint)
    assert model.graph == small_graph() and model.size == bundle.stat().st_size and len(model.content_hash) == 64
    w = model.graph.constants["w"]
    assert not w.flags.writeable
    base = _base(w)  # one private copy of its bytes, of its own (freed with it), never a mapping of the file
    assert isinstance(base, bytearray) and not isinstance(base, mmap.mmap) and len(base) == w.nbytes
    assert _base(model.graph.constants["b"]) is not base


def test_a_write_after_verification_cannot_reach_the_model(bundle, keys, tmp_path):
    """Verify-then-use: the same-size write that a mapping would show lands after load and changes nothing."""
    model = load(bundle, [keys.public_path])
    want = small_graph().constants["w"].copy()
    segment = bundle.read_bytes().rindex(want.tobytes())
    with open(bundle, "r+b") as f:  # in place: same inode, same size
        f.seek(segment)
        f.write(np.full_like(want, 7.0).tobytes())
    np.testing.assert_array_equal(model.graph.constants["w"], want)
    x = np.ones((2, 8), np.float32)
    ref = run_reference(small_graph(), {"x": x})
    native = compile_graph(model.graph, batch=2, cache_dir=tmp_path / "cache", content_hash=model.content_hash)
    for got in (model.run({"x": x}), native.run({"x": x})):
        for k in ref:
            np.testing.assert_allclose(got[k], ref[k], rtol=1e-6, atol=1e-6)
    with pytest.raises(BundleError, match="SHA-256"):
        load(bundle, [keys.public_path])  # the changed file itself no longer verifies


def _overwrite_w(bundle, value: float) -> None:
    """Change weight ``w`` in place (same size): its signed SHA-256 no longer matches."""
    want = small_graph().constants["w"]
    at = bundle.read_bytes().rindex(want.tobytes())
    with open(bundle, "r+b") as f:
        f.seek(at)
        f.write(np.full_like(want, value).tobytes())


def test_a_lazy_load_checks_the_head_now_and_the_weights_when_used(bundle, keys, tmp_path):
    model = load(bundle, [keys.public_path], lazy=True)
    assert (model.name, model.version, model.content_hash) == ("m", "3", load(bundle, [keys.public_path]).content_hash)
    assert "graph" not in vars(model)  # nothing read past the manifest yet
    assert model.graph == small_graph()
    with pytest.raises(BundleError, match="not trusted"):
        load(bundle, [generate_keypair(tmp_path / "other").public_path], lazy=True)
    damaged = load(bundle, [keys.public_path], lazy=True)
    _overwrite_w(bundle, 7.0)
    with pytest.raises(BundleError, match="SHA-256"):
        damaged.graph
    from cuvil.compiler.bundle import load_private_key

    replaced = load(bundle, [keys.public_path], lazy=True)
    save_bundle(small_graph(), bundle, load_private_key(keys.private_path), name="m", version="4", producer="test")
    with pytest.raises(BundleError, match="changed after it was loaded"):
        replaced.graph  # validly signed, but not the bundle that was verified


def test_a_cache_hit_of_a_lazy_model_never_reads_its_weights(bundle, keys, tmp_path):
    x = np.ones((2, 8), np.float32)
    ref = run_reference(small_graph(), {"x": x})
    first = load(bundle, [keys.public_path], lazy=True)
    cold = compile_model(first, batch=2, cache_dir=tmp_path / "cache")
    assert "graph" not in vars(first)  # a miss read the weights for lowering, and did not keep them
    _overwrite_w(bundle, 7.0)  # the head still verifies; reading the weights now would fail
    model = load(bundle, [keys.public_path], lazy=True)
    warm = compile_model(model, batch=2, cache_dir=tmp_path / "cache")
    assert warm.stats.cache_hit and not cold.stats.cache_hit and "graph" not in vars(model)
    for k in ref:
        np.testing.assert_allclose(warm.run({"x": x})[k], ref[k], rtol=1e-6, atol=1e-6)
    with pytest.raises(BundleError, match="SHA-256"):
        compile_model(model, batch=2, cache_dir=tmp_path / "other-cache")  # a miss reads them, and refuses


def test_a_fifo_is_refused_without_blocking(tmp_path, keys):
    fifo = tmp_path / "pipe.cuvil"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="not a regular file"):
        load(fifo, [keys.public_path])


def test_model_reproduces_the_interpreter_exactly(bundle, keys):
    model = load(bundle, [keys.public_path])
    x = np.random.default_rng(3).standard_normal((5, 8)).astype(np.float32)
    got, want = model.run({"x": x}), run_reference(small_graph(), {"x": x})
    assert got.keys() == want.keys()
    assert all(got[k].tobytes() == want[k].tobytes() for k in want)


def test_trust_dir_from_the_environment(bundle, keys, empty_trust_dir):
    with pytest.raises(BundleError, match="no trusted keys"):
        load(bundle)
    empty_trust_dir.mkdir()
    (empty_trust_dir / "author.pub").write_bytes(keys.public_path.read_bytes())
    (empty_trust_dir / "README").write_text("ignored: not a key suffix")
    assert load(bundle).signer == keys.fingerprint


def test_explicit_keys_replace_the_trust_dir(bundle, keys, empty_trust_dir, tmp_path):
    empty_trust_dir.mkdir()
    (empty_trust_dir / "author.pub").write_bytes(keys.public_path.read_bytes())
    other = generate_keypair(tmp_path / "other")
    with pytest.raises(BundleError, match="not trusted"):
        load(bundle, [other.public_path])
    assert load(bundle, [load_public_key(keys.public_path)]).signer == keys.fingerprint
    assert load(bundle, TrustStore.from_files([keys.public_path])).signer == keys.fingerprint


def test_a_bad_file_in_the_trust_dir_is_an_error(bundle, empty_trust_dir):
    empty_trust_dir.mkdir()
    (empty_trust_dir / "broken.pub").write_text("not a key")
    with pytest.raises(KeyFileError, match="broken.pub"):
        load(bundle)


def test_a_fifo_in_the_trust_dir_is_an_error_not_skipped(bundle, keys, empty_trust_dir):
    """As any unreadable key file there: skipping it would trust fewer keys than the directory names."""
    import os

    empty_trust_dir.mkdir()
    (empty_trust_dir / "author.pub").write_bytes(keys.public_path.read_bytes())
    os.mkfifo(empty_trust_dir / "pipe.pub")
    with pytest.raises(KeyFileError, match="pipe.pub.*not a regular file"):
        load(bundle)


def test_a_lazy_models_input_type_past_the_limits_is_a_bundle_error(bundle, keys, tmp_path):
    """A trusted signer's manifest whose input type has rank 33: the same BundleError as any bad type in it."""
    import json

    from cuvil.compiler.bundle import load_private_key
    from cuvil.compiler.bundle.format import canonical_json

    from ..compiler.bundle.helpers import resign, split

    manifest, data = split(bundle.read_bytes())
    obj = json.loads(manifest)
    obj["inputs"][0]["type"] = "f32[" + ",".join(["1"] * 33) + "]"
    path = tmp_path / "rank33.cuvil"
    path.write_bytes(resign(canonical_json(obj), data, load_private_key(keys.private_path)))
    model = load(path, [keys.public_path], lazy=True)
    with pytest.raises(BundleError, match="rank 33"):
        model.input_types()


def test_default_trust_dir():
    assert str(default_trust_dir({"CUVIL_TRUST_DIR": "/x/y"})) == "/x/y"
    assert str(default_trust_dir({"XDG_CONFIG_HOME": "/cfg"})) == "/cfg/cuvil/trusted"
    assert str(default_trust_dir({})).endswith(".config/cuvil/trusted")


def test_empty_explicit_trust_is_refused(bundle):
    with pytest.raises(BundleError, match="no trusted keys"):
        load(bundle, [])
    with pytest.raises(BundleError):
        resolve_trust(TrustStore((), ()))


def test_tampered_truncated_and_empty_files(bundle, keys, tmp_path):
    data = bundle.read_bytes()
    cases = {"flip": bytes([data[0] ^ 1]) + data[1:], "cut": data[:-7], "long": data + b"\0", "empty": b"",
             "tiny": b"\x89CUV"}
    for name, content in cases.items():
        p = tmp_path / f"{name}.cuvil"
        p.write_bytes(content)
        with pytest.raises(BundleError):
            load(p, [keys.public_path])
    with pytest.raises(OSError):
        load(tmp_path / "missing.cuvil", [keys.public_path])
    with pytest.raises(OSError):
        load(tmp_path, [keys.public_path])


def test_load_bytes(bundle, keys):
    data = bundle.read_bytes()
    assert load_bytes(data, [keys.public_path]).graph == small_graph()
    with pytest.raises(BundleError):
        load_bytes(data[:-1], [keys.public_path])
    with pytest.raises(BundleError):
        load_bytes("not bytes", [keys.public_path])  # type: ignore[arg-type]


def test_edge_runtime_loads_and_runs_without_torch_or_onnx(bundle, keys):
    script = textwrap.dedent(f"""
        import sys
        for name in ("torch", "onnx", "onnxruntime", "click", "sklearn"):
            sys.modules[name] = None  # any import of these now fails
        import numpy as np
        import cuvil, cuvil.compiler, cuvil.edge_runtime
        from cuvil.edge_runtime import load
        model = load({str(bundle)!r}, [{str(keys.public_path)!r}])
        out = model.run({{"x": np.ones((2, 8), np.float32)}})
        assert set(out) == {{"y", "z"}}
        assert not any(m.startswith("cuvil.compiler.frontends.") and m != "cuvil.compiler.frontends.builder"
                       for m in sys.modules), sorted(m for m in sys.modules if "frontends" in m)
        print("ok")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def test_a_warm_start_imports_no_code_generator_op_table_or_api():
    """What a device imports to load a bundle's head and run cached code (the names load on first use)."""
    script = textwrap.dedent("""
        import sys
        from cuvil.edge_runtime import compile_model, load
        heavy = ("cuvil.api", "cuvil.native", "cuvil.compiler.interpreter", "cuvil.compiler.ops",
                 "cuvil.compiler.codegen.lower", "cuvil.compiler.passes", "cuvil.compiler.bundle.writer",
                 "cuvil.edge_runtime.autotune", "cuvil.edge_runtime.parallel", "ml_dtypes")
        print(sorted(m for m in sys.modules if m in heavy or m.startswith(tuple(h + "." for h in heavy))))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_a_lazy_models_input_types_come_from_its_signed_manifest(bundle, keys):
    model = load(bundle, [keys.public_path], lazy=True)
    _overwrite_w(bundle, 7.0)  # the weights no longer verify: the types must not need them
    assert model.input_types() == small_graph().input_types and "graph" not in vars(model)
    assert load(bundle, [keys.public_path], lazy=True).input_types() == model.input_types()


def test_a_bad_input_type_in_a_manifest_is_a_bundle_error():
    import dataclasses

    from cuvil.edge_runtime.loader import Model

    good = Model("m", "1", "p", "0" * 64, "s", None, 0, (("x", "f32[N,8]"),))
    assert str(good.input_types()["x"]) == "f32[N,8]"
    for text in ("f32[N,8] extra", "nonsense", "f32[N,"):
        with pytest.raises(BundleError, match="bad input type"):
            dataclasses.replace(good, inputs=(("x", text),)).input_types()


def test_a_bundle_that_shrinks_under_the_reader_is_a_bundle_error(bundle, keys, tmp_path):
    """The size comes from fstat at open; a file cut short after that is refused, never a struct error."""
    from cuvil.edge_runtime.loader import _head_bytes, read_bundle_file

    short = tmp_path / "short.cuvil"
    short.write_bytes(bundle.read_bytes()[:10])
    fd = os.open(short, os.O_RDONLY)
    try:
        with pytest.raises(BundleError, match="shrank"):
            _head_bytes(fd, bundle.stat().st_size)  # the size it had when opened
    finally:
        os.close(fd)
    cut = tmp_path / "cut.cuvil"
    cut.write_bytes(bundle.read_bytes()[:-1])
    with pytest.raises(BundleError, match="truncated"):
        read_bundle_file(cut, [load_public_key(keys.public_path)])
