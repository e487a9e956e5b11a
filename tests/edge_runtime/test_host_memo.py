"""The host Target remembered in the cache: equal to detection, read without asking LLVM, asked again
when the CPU's stamp changes or the file is damaged."""

from __future__ import annotations

import pytest
from cuvil.devices import detect
from cuvil.edge_runtime import host_memo
from cuvil.edge_runtime.cache import CompileCache


@pytest.fixture
def cache(tmp_path):
    return CompileCache(tmp_path / "cache")


def _no_llvm():
    raise AssertionError("LLVM was asked")


def test_the_remembered_host_is_the_detected_host_and_llvm_is_asked_once(cache, monkeypatch):
    first = host_memo.host_target(cache)
    assert first == detect.resolve_target("host")
    monkeypatch.setattr(host_memo, "llvm_host_facts", _no_llvm)
    assert host_memo.host_target(cache) == first


def test_another_cpu_stamp_or_a_damaged_file_asks_llvm_again(cache, monkeypatch):
    host_memo.host_target(cache)
    asked = []
    real = detect.llvm_host_facts
    monkeypatch.setattr(host_memo, "llvm_host_facts", lambda: asked.append(1) or real())
    monkeypatch.setattr(host_memo, "host_stamp", lambda: "0" * 64)  # flags, microcode or llvmlite changed
    assert host_memo.host_target(cache) == detect.resolve_target("host") and asked == [1]
    path = cache.dir / host_memo.HOST_FILE
    data = bytearray(path.read_bytes())
    data[data.index(b'"triple"') + 2] ^= 1
    path.write_bytes(bytes(data))
    assert host_memo.host_target(cache) == detect.resolve_target("host") and asked == [1, 1]


def test_without_a_cpu_stamp_detection_is_llvms(cache, monkeypatch):
    monkeypatch.setattr(host_memo, "host_stamp", lambda: None)
    assert host_memo.host_target(cache) == detect.resolve_target("host")
    assert not (cache.dir / host_memo.HOST_FILE).exists()



def test_on_a_miss_the_facts_come_from_ask_and_this_process_is_told_them(cache, monkeypatch):
    """A cold compile asks an LLVM helper process (``ask``); then neither the remembered file nor the
    host profile (sealing that file asks it) loads LLVM here."""
    real, asked = detect.llvm_host_facts(), []
    monkeypatch.setattr(host_memo, "llvm_host_facts", _no_llvm)
    monkeypatch.setattr(detect, "llvm_host_facts", _no_llvm)
    detect.host_profile.cache_clear()
    try:
        got = host_memo.host_target(cache, lambda: asked.append(1) or real)
        assert got == detect.profile_of(real).target() and asked == [1]
        assert detect.host_profile() == detect.profile_of(real)
        assert host_memo.host_target(cache, _no_llvm) == got and asked == [1]  # remembered
    finally:
        detect.host_profile.cache_clear()
