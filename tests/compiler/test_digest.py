"""The digests a device computes, against published vectors and the standard library, and a device
process that never maps the standard library's OpenSSL (``compiler/digest.py`` says why)."""

from __future__ import annotations

import hashlib
import hmac
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from cuvil.compiler.digest import HmacSha256, equal, hmac_sha256, sha256, short_hex

ABC_SHA256 = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"  # FIPS 180-2, appendix B.1
RFC4231_CASE2 = "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"  # key "Jefe"


def test_published_vectors():
    assert sha256(b"abc").hexdigest() == ABC_SHA256
    h = sha256(b"a")
    h.update(memoryview(b"bc"))
    assert h.hexdigest() == ABC_SHA256 and h.digest() == bytes.fromhex(ABC_SHA256)  # digest again: the same
    assert hmac_sha256(b"Jefe", b"what do ya want for nothing?").hex() == RFC4231_CASE2
    mac = HmacSha256(b"Jefe", b"what do ya ")
    mac.update(b"want for nothing?")
    assert mac.digest().hex() == RFC4231_CASE2


def test_buffers_hash_as_their_bytes():
    rng = np.random.default_rng(0)
    weights = rng.standard_normal((3, 5, 7)).astype(np.float32)
    block = bytearray(rng.integers(0, 256, 10_000, dtype=np.uint8).tobytes())
    for data in (weights, memoryview(block)[17:], block, weights.reshape(-1)[3:]):
        assert sha256(data).digest() == hashlib.sha256(data).digest()
        assert hmac_sha256(b"k" * 32, data) == hmac.digest(b"k" * 32, data, "sha256")
    with pytest.raises(TypeError):
        sha256(weights[:, ::2])  # not contiguous: refused, never hashed as some other bytes


def test_equal_and_short_names():
    assert equal(b"\x00" * 32, bytes(32)) and not equal(b"\x00" * 32, b"\x00" * 31 + b"\x01")
    assert equal("ab" * 32, "ab" * 32) and not equal("ab" * 32, "ab" * 31 + "ac")
    assert not equal("\u00e9" * 4, "abcd")  # a hostile file's non-ASCII MAC text: a mismatch, not a TypeError
    with pytest.raises(TypeError):
        equal(4, bytes(4))  # not read as four zero bytes
    assert short_hex("k", 10) == hashlib.sha256(b"k").hexdigest()[:10] and short_hex("k", 10) != short_hex("j", 10)


_DEVICE = textwrap.dedent("""
    import sys
    watched = ("_hashlib", "hashlib", "hmac", "secrets")
    before = {m for m in watched if m in sys.modules}  # whatever the interpreter's own start-up loaded
    import numpy as np
    from cuvil.edge_runtime.compile import compile_model
    from cuvil.edge_runtime.loader import load
    model = load(sys.argv[1], [sys.argv[2]], lazy=True)
    session = compile_model(model, cache_dir=sys.argv[3], threads=2)
    session.run({"x": np.ones((1, 32, 32, 32), np.float32)})
    print(int(session.stats.cache_hit), " ".join(sorted(m for m in watched if m in sys.modules and m not in before)))
""")


def test_a_device_process_never_loads_the_standard_librarys_openssl(tmp_path):
    """A cold compile of a signed bundle at 2 threads (tuning, a conv big enough to split: the handoff probe and
    the whole-model check; the cache written), then a warm start in a new process: neither imports ``hashlib``,
    ``hmac`` or ``secrets``."""
    from cuvil import api
    from cuvil.compiler.frontends.builder import GraphBuilder
    from cuvil.compiler.ir.types import TensorType

    b = GraphBuilder("conv")
    x = b.input("x", TensorType.parse("f32[1,32,32,32]"))
    w = b.constant(np.random.default_rng(0).standard_normal((32, 32, 3, 3)).astype(np.float32), "w")
    graph = b.build([b.add1("Conv", [x, w], pads=(1, 1, 1, 1), strides=(1, 1), dilations=(1, 1), group=1)])
    keys = api.keygen(tmp_path / "keys", "t")
    bundle = tmp_path / "conv.cuvil"
    api.export(graph, bundle, keys.private_path)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    for hit in ("0", "1"):
        out = subprocess.run([sys.executable, "-c", _DEVICE, str(bundle), str(keys.public_path), str(tmp_path / "cache")],
                             capture_output=True, text=True, env=env, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.split() == [hit], out.stdout  # the cache hit as expected, and nothing else imported
