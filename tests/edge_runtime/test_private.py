"""Private files: 0700 directories, a device secret that is 0600 from its first byte."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest
from cuvil.edge_runtime import private
from cuvil.edge_runtime.private import SecretError, device_secret, private_dir, state_dir


def test_state_dir_from_the_environment():
    assert str(state_dir({"XDG_STATE_HOME": "/st"})) == "/st/cuvil"
    assert str(state_dir({})).endswith(".local/state/cuvil")
    for relative in ("st", "./st", ""):  # the XDG spec: a relative path is ignored
        assert state_dir({"XDG_STATE_HOME": relative}) == state_dir({})


def test_private_dir_creates_every_missing_level_0700(tmp_path):
    made = private_dir(tmp_path / "a" / "b" / "c")
    for p in (tmp_path / "a", tmp_path / "a" / "b", made):
        assert stat.S_IMODE(p.stat().st_mode) == 0o700
    private_dir(made)  # existing: fine


def test_secret_is_0600_from_its_first_byte(tmp_path, monkeypatch):
    modes = []
    real_fsync = os.fsync

    def watching_fsync(fd):  # the secret's bytes are written and flushed: what mode did the file have?
        modes.append(stat.S_IMODE(os.fstat(fd).st_mode))
        real_fsync(fd)

    monkeypatch.setattr(private.os, "fsync", watching_fsync)
    path = tmp_path / "state" / "device.key"
    secret = device_secret(path)
    assert modes == [0o600]
    assert len(secret) == 32 and path.read_bytes() == secret
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert device_secret(path) == secret
    assert [p.name for p in path.parent.iterdir()] == ["device.key"]  # no temporary file left behind


def test_processes_creating_the_secret_at_once_agree(tmp_path):
    path = tmp_path / "device.key"
    code = f"from cuvil.edge_runtime.private import device_secret; print(device_secret({str(path)!r}).hex())"
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(4)]
    outs = {p.communicate(timeout=60)[0].strip() for p in procs}
    assert outs == {path.read_bytes().hex()}


BAD_SECRETS = {
    "group_readable": lambda p: (p.write_bytes(b"k" * 32), p.chmod(0o640)),
    "short": lambda p: (p.write_bytes(b"k" * 31), p.chmod(0o600)),
    "symlink": lambda p: (p.with_name("real").write_bytes(b"k" * 32), p.with_name("real").chmod(0o600),
                          p.symlink_to(p.with_name("real"))),
    "directory": lambda p: p.mkdir(),
    "fifo": lambda p: os.mkfifo(p, 0o600),
}


@pytest.mark.parametrize("how", sorted(BAD_SECRETS))
def test_an_unusable_secret_is_a_typed_error(tmp_path, how):
    path = tmp_path / "device.key"
    BAD_SECRETS[how](path)
    with pytest.raises(SecretError):
        device_secret(path)
