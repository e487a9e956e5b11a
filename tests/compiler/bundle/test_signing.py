"""Key files: modes, refusal to overwrite, fingerprints, and clear errors for wrong files."""

from __future__ import annotations

import stat

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from cuvil.compiler.bundle import KeyFileError, fingerprint, generate_keypair, load_private_key, load_public_key


def test_keygen_writes_a_0600_private_key_and_its_public_key(tmp_path):
    pair = generate_keypair(tmp_path / "keys")
    assert stat.S_IMODE(pair.private_path.stat().st_mode) == 0o600
    assert pair.private_path.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    private, public = load_private_key(pair.private_path), load_public_key(pair.public_path)
    assert fingerprint(private) == fingerprint(public) == pair.fingerprint
    assert len(pair.fingerprint) == 32
    public.verify(private.sign(b"m"), b"m")


def test_keygen_refuses_to_overwrite_unless_forced(tmp_path):
    first = generate_keypair(tmp_path)
    with pytest.raises(KeyFileError, match="already exists"):
        generate_keypair(tmp_path)
    assert load_public_key(first.public_path)  # untouched
    second = generate_keypair(tmp_path, force=True)
    assert second.fingerprint != first.fingerprint
    assert stat.S_IMODE(second.private_path.stat().st_mode) == 0o600


@pytest.mark.parametrize("name", ["", "../x", ".hidden", "a/b"])
def test_keygen_rejects_bad_names(tmp_path, name):
    with pytest.raises(KeyFileError):
        generate_keypair(tmp_path, name)


def test_wrong_key_files_are_clear_errors(tmp_path):
    pair = generate_keypair(tmp_path)
    with pytest.raises(KeyFileError, match="public key"):
        load_public_key(pair.private_path)
    with pytest.raises(KeyFileError, match="private key"):
        load_private_key(pair.public_path)
    with pytest.raises(KeyFileError, match="cannot read"):
        load_public_key(tmp_path / "missing.pub")
    (tmp_path / "junk.pub").write_bytes(b"\0" * 100)
    with pytest.raises(KeyFileError):
        load_public_key(tmp_path / "junk.pub")
    ec_key = ec.generate_private_key(ec.SECP256R1())
    (tmp_path / "ec.pub").write_bytes(ec_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    with pytest.raises(KeyFileError, match="Ed25519"):
        load_public_key(tmp_path / "ec.pub")


def test_a_key_file_that_is_no_regular_file_is_refused_at_once(tmp_path):
    """A FIFO would block the read (until a writer comes) and /dev/zero never end it: both are refused
    before any read, in a child so that a block fails the test instead of hanging it."""
    import os
    import subprocess
    import sys

    os.mkfifo(tmp_path / "fifo.pub")
    code = ("import sys\nfrom cuvil.compiler.bundle import KeyFileError, load_public_key\n"
            "for p in sys.argv[1:]:\n"
            "    try:\n        load_public_key(p)\n    except KeyFileError as e:\n        print(e)\n")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "fifo.pub"), "/dev/zero"],
                         capture_output=True, text=True, timeout=60)
    lines = out.stdout.splitlines()
    assert out.returncode == 0 and len(lines) == 2 and all("not a regular file" in line for line in lines), out


def test_a_huge_key_file_is_refused_without_reading_it(tmp_path):
    import tracemalloc

    big = tmp_path / "big.pub"
    with open(big, "wb") as f:
        f.truncate(1 << 30)  # sparse: no disk used
    tracemalloc.start()
    try:
        with pytest.raises(KeyFileError, match="too large"):
            load_public_key(big)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
