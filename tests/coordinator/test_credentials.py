"""Fleet credentials: a CA, the SuperLink's certificate with the SANs asked for, SuperNode key pairs."""

from __future__ import annotations

import hashlib
import ipaddress
import stat

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from cuvil.coordinator.credentials import (CredentialsError, make_certificates, make_node_key, node_key_fingerprint,
                                          parse_san)
from cuvil.coordinator.identity import fingerprint


def test_superlink_certificate_is_signed_by_the_ca_and_names_every_san(tmp_path):
    made = make_certificates(tmp_path / "tls", ["coordinator.example", "203.0.113.7", "::1"], days=30)
    ca = x509.load_pem_x509_certificate(made.ca_cert.read_bytes())
    cert = x509.load_pem_x509_certificate(made.cert.read_bytes())
    ca.public_key().verify(cert.signature, cert.tbs_certificate_bytes, ec.ECDSA(cert.signature_hash_algorithm))
    assert cert.issuer == ca.subject and ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["coordinator.example"]
    assert sans.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("203.0.113.7"), ipaddress.ip_address("::1")]
    assert (cert.not_valid_after_utc - cert.not_valid_before_utc).days == 30
    key = serialization.load_pem_private_key(made.key.read_bytes(), None)
    assert key.public_key().public_numbers() == cert.public_key().public_numbers()
    for private in (made.key, made.ca_key):
        assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert isinstance(cert.signature_hash_algorithm, hashes.SHA384)


def test_existing_files_are_kept_unless_forced(tmp_path):
    first = make_certificates(tmp_path, ["localhost"])
    before = first.ca_key.read_bytes()
    with pytest.raises(CredentialsError, match="--force"):
        make_certificates(tmp_path, ["localhost"])
    assert first.ca_key.read_bytes() == before
    assert make_certificates(tmp_path, ["localhost"], force=True).ca_key.read_bytes() != before


@pytest.mark.parametrize("bad", ["has space", "-lead.example", "a..b", "x" * 300, "", "in/valid", "ünïcode.example",
                                 "999.1.1.1", "10.0.0.256", "1.2.3"])  # mistyped addresses were taken as names
def test_a_san_that_is_no_host_name_or_address_is_refused(bad):
    with pytest.raises(CredentialsError, match="neither an IP address nor a DNS name"):
        parse_san(bad)


def test_certificates_need_a_san_and_a_sane_validity(tmp_path):
    with pytest.raises(CredentialsError, match="at least one SAN"):
        make_certificates(tmp_path, [])
    with pytest.raises(CredentialsError, match="validity"):
        make_certificates(tmp_path, ["localhost"], days=0)


def test_node_key_is_p384_in_openssh_format(tmp_path):
    priv, pub = make_node_key(tmp_path / "keys" / "device-1")
    assert pub.name == "device-1.pub" and stat.S_IMODE(priv.stat().st_mode) == 0o600
    public = serialization.load_ssh_public_key(pub.read_bytes())
    private = serialization.load_ssh_private_key(priv.read_bytes(), None)
    assert isinstance(public.curve, ec.SECP384R1) and public.public_numbers() == private.public_key().public_numbers()
    with pytest.raises(CredentialsError, match="--force"):
        make_node_key(tmp_path / "keys" / "device-1")


def test_node_key_fingerprint_is_the_one_of_the_key_flower_holds(tmp_path):
    """Flower holds a registered node's key as PEM SubjectPublicKeyInfo; its DER form's SHA-256 names it."""
    _, pub = make_node_key(tmp_path / "device-1")
    key = serialization.load_ssh_public_key(pub.read_bytes())
    der = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    pem = key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    assert node_key_fingerprint(pub) == hashlib.sha256(der).hexdigest()[:16] == fingerprint(pem)
    assert node_key_fingerprint(make_node_key(tmp_path / "device-2")[1]) != node_key_fingerprint(pub)


def test_forced_keys_never_go_through_a_planted_link_or_a_looser_file(tmp_path):
    """--force over a world-readable key file, or over a symbolic link planted at a key's name: the key
    is written to a fresh 0600 file that replaces the name; the link's target and old mode are never used."""
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    out = tmp_path / "tls"
    out.mkdir()
    (out / "superlink.key").symlink_to(victim)
    (out / "ca.key").write_bytes(b"old")
    (out / "ca.key").chmod(0o644)
    made = make_certificates(out, ["localhost"], force=True)
    assert victim.read_bytes() == b"precious"
    for private in (made.key, made.ca_key):
        assert not private.is_symlink() and stat.S_IMODE(private.stat().st_mode) == 0o600
        serialization.load_pem_private_key(private.read_bytes(), None)
    assert sorted(p.name for p in out.iterdir()) == ["ca.crt", "ca.key", "superlink.key", "superlink.pem"]
