"""Sealed files: only the device secret and the right name open them; every byte is covered."""

from __future__ import annotations

import stat
import threading
from types import SimpleNamespace

import numpy as np
import pytest
from cuvil.edge_runtime import sealed
from cuvil.edge_runtime.sealed import GMAC, MAGIC, PAGE, POLY1305, Sealer, SealError, preferred_tail_mac

SECRET = bytes(range(32))


def _write(tmp_path, tail=b"w" * 5000, name="key-a", tail_mac=None):
    path = tmp_path / "f.sealed"
    Sealer(SECRET, tail_mac).write(path, name, b'{"m":1}', [b"one", b"two!"], tail)
    return path


def test_round_trip_maps_the_tail_aligned_and_read_only(tmp_path):
    path = _write(tmp_path)
    got = Sealer(SECRET).read(path, "key-a")
    assert (got.meta, got.body) == (b'{"m":1}', b"onetwo!")
    assert got.tail.tobytes() == b"w" * 5000 and not got.tail.flags.writeable and got.tail.ctypes.data % PAGE == 0
    assert path.stat().st_size % PAGE == 0 and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(Sealer(SECRET).read(_write(tmp_path, tail=b""), "key-a").tail) == 0


def test_another_secret_or_name_does_not_open_it(tmp_path):
    path = _write(tmp_path)
    with pytest.raises(SealError, match="MAC"):
        Sealer(bytes(32)).read(path, "key-a")
    with pytest.raises(SealError, match="MAC"):
        Sealer(SECRET).read(path, "key-b")


@pytest.mark.parametrize("tail_mac", [POLY1305, GMAC])
def test_every_byte_is_covered(tmp_path, tail_mac):
    """Flip each byte of the header, meta and body, and bytes across the tail and its pad: every flip
    is refused, whichever MAC tags the tail."""
    path = _write(tmp_path, tail_mac=tail_mac)
    raw = path.read_bytes()
    tail_start = len(raw) - 2 * PAGE
    where = list(range(tail_start)) + list(range(tail_start, len(raw), 97))
    head_and_body = 11 + 32 + 16 + 32 + 16 + 1 + 7 + 7
    for i in where:
        if head_and_body <= i < tail_start:
            continue  # zero padding between body and tail: never read
        bad = bytearray(raw)
        bad[i] ^= 0x01
        path.write_bytes(bytes(bad))
        with pytest.raises(SealError):
            Sealer(SECRET).read(path, "key-a")


@pytest.mark.parametrize("tail_mac", [POLY1305, GMAC])
def test_the_reader_takes_the_tail_mac_the_file_records(tmp_path, tail_mac):
    other = GMAC if tail_mac == POLY1305 else POLY1305
    path = _write(tmp_path, tail_mac=tail_mac)
    assert Sealer(SECRET, other).read(path, "key-a").tail.tobytes() == b"w" * 5000


def test_a_tail_of_several_gmac_chunks_is_covered_chunk_by_chunk(tmp_path, monkeypatch):
    monkeypatch.setattr(sealed, "GMAC_CHUNK", 1000)
    tail = bytes(range(256)) * 20  # five chunks and a part
    path = _write(tmp_path, tail=tail, tail_mac=GMAC)
    assert Sealer(SECRET).read(path, "key-a").tail.tobytes() == tail
    raw = bytearray(path.read_bytes())
    raw[len(raw) - 2 * PAGE + 2500] ^= 0x80  # in the third chunk
    path.write_bytes(bytes(raw))
    with pytest.raises(SealError, match="tail MAC"):
        Sealer(SECRET).read(path, "key-a")


def test_the_tag_does_not_depend_on_how_many_threads_check_it(tmp_path, monkeypatch):
    monkeypatch.setattr(sealed, "GMAC_CHUNK", 1000)
    tail = bytes(range(256)) * 20
    monkeypatch.setattr(sealed, "tail_check_threads", lambda: 3)
    path = _write(tmp_path, tail=tail, tail_mac=GMAC)
    monkeypatch.setattr(sealed, "tail_check_threads", lambda: 1)
    assert Sealer(SECRET).read(path, "key-a").tail.tobytes() == tail


@pytest.mark.parametrize("triple, features, want", [
    ("x86_64-unknown-linux-gnu", ("+aes", "+pclmul", "+avx2"), GMAC),
    ("x86_64-unknown-linux-gnu", ("-aes", "+pclmul", "+avx2"), POLY1305),
    ("aarch64-unknown-linux-gnu", ("+aes", "+neon"), GMAC),
    ("aarch64-unknown-linux-gnu", ("+neon",), POLY1305),  # a Raspberry Pi 4: no crypto extensions
])
def test_gmac_only_where_the_cpu_multiplies_carry_less(monkeypatch, triple, features, want):
    monkeypatch.setattr("cuvil.devices.host_profile", lambda: SimpleNamespace(triple=triple, features=features))
    assert preferred_tail_mac() == want


def test_a_tail_checked_on_a_thread_is_refused_when_its_result_is_asked(tmp_path, monkeypatch):
    monkeypatch.setattr(sealed, "BACKGROUND_CHECK_BYTES", 1000)  # 5000 bytes of tail: checked on a thread
    monkeypatch.setattr(sealed, "tail_check_threads", lambda: 2)  # as if a core were idle
    path = _write(tmp_path)
    assert Sealer(SECRET).open(path, "key-a").tail.result().tobytes() == b"w" * 5000
    raw = bytearray(path.read_bytes())
    raw[len(raw) - 2 * PAGE + 10] ^= 1
    path.write_bytes(bytes(raw))
    opened = Sealer(SECRET).open(path, "key-a")  # head, meta and body hold
    assert opened.meta == b'{"m":1}'
    with pytest.raises(SealError, match="tail MAC"):
        opened.tail.result()


@pytest.mark.parametrize("free, big, helpers, early", [(2, True, 1, True), (3, True, 2, True), (2, False, 1, False),
                                                       (1, True, 0, False)])
def test_a_check_beside_the_callers_work_leaves_the_caller_its_core(tmp_path, monkeypatch, free, big, helpers, early):
    """A big tail's check starts on the idle cores but the caller's when the file is opened (2 CPUs: one
    AES thread, not two beside the busy caller); a small one's when its result is asked; the caller joins
    in either way."""
    path = _write(tmp_path, tail_mac=GMAC)
    monkeypatch.setattr(sealed, "BACKGROUND_CHECK_BYTES", 1000 if big else 1 << 20)  # the 5000-byte tail
    monkeypatch.setattr(sealed, "tail_check_threads", lambda: free)
    check = Sealer(SECRET).open(path, "key-a").tail
    assert (check.helpers, check.early) == (helpers, early)
    assert check.result().tobytes() == b"w" * 5000


def test_the_caller_joins_a_check_under_way(tmp_path, monkeypatch):
    """The caller asking for the result takes the pieces no helper has taken rather than wait for a
    helper that needs the GIL between pieces (the caller's Python work held it: ResNet-18's warm start
    waited 6.5 ms for its weights' check, 2.7 with the caller joining in). Here the helper is held in
    its first piece until the caller has done all the others."""
    monkeypatch.setattr(sealed, "GMAC_CHUNK", 1000)  # the 5000-byte tail: 5 pieces
    monkeypatch.setattr(sealed, "BACKGROUND_CHECK_BYTES", 1000)
    monkeypatch.setattr(sealed, "tail_check_threads", lambda: 2)  # one helper, from the open
    path = _write(tmp_path, tail_mac=GMAC)
    claimed, release, by = threading.Event(), threading.Event(), {}
    gmac = sealed.TAIL_MACS[GMAC]

    def held(key, data):
        tagger = gmac(key, data)
        piece = tagger._piece

        def traced(i):
            if i == 0:
                claimed.set()
                assert release.wait(10)
            by[i] = threading.get_ident()
            if len(by) == 4:
                release.set()
            return piece(i)

        tagger._piece = traced
        return tagger

    monkeypatch.setitem(sealed.TAIL_MACS, GMAC, held)
    check = Sealer(SECRET).open(path, "key-a").tail
    assert claimed.wait(10)
    assert check.result().tobytes() == b"w" * 5000
    me = threading.get_ident()
    assert by[0] != me and all(by[i] == me for i in range(1, 5))


@pytest.mark.parametrize("cores, running, want", [(2, 1, 2), (2, 2, 1), (2, 11, 1), (16, 1, 4), (16, 14, 3), (1, 1, 1)])
def test_the_check_spreads_over_idle_cores_only(monkeypatch, cores, running, want):
    monkeypatch.setattr(sealed.os, "sched_getaffinity", lambda pid: set(range(cores)))
    monkeypatch.setattr(sealed, "runnable_now", lambda: running)
    assert sealed.tail_check_threads() == want




def test_a_check_on_the_callers_thread_runs_once_when_its_result_is_first_asked():
    calls = []
    tagger = sealed.Tagger(1, lambda i: calls.append(i) or b"t", lambda tags: tags[0])
    check = sealed.TailCheck(tagger, lambda: np.zeros(len(tagger.tag()) + 2, np.uint8), helpers=0, early=False)
    assert calls == []  # not at open: the caller loads the code first
    assert len(check.result()) == 3 and len(check.result()) == 3 and calls == [0]


def test_a_check_that_fails_otherwise_is_a_refusal_too():
    def broken(i):
        raise MemoryError

    for early in (False, True):
        tagger = sealed.Tagger(3, broken, lambda tags: b"".join(tags))
        check = sealed.TailCheck(tagger, lambda: np.frombuffer(tagger.tag(), np.uint8), helpers=1, early=early)
        with pytest.raises(SealError, match="MemoryError"):
            check.result()


def test_two_writes_of_the_same_content_differ(tmp_path):
    """A fresh nonce per write, so the tail's one-time key is never used for two messages."""
    a = _write(tmp_path).read_bytes()
    b = _write(tmp_path).read_bytes()
    assert a != b and len(a) == len(b)


def test_garbage_and_lengths_out_of_bounds(tmp_path):
    path = tmp_path / "g"
    for content in (b"", MAGIC, b"CUVILSEAL1\n" + bytes(200), np.random.default_rng(1).bytes(3 * PAGE),
                    MAGIC + b"\xff" * 200):
        path.write_bytes(content)
        with pytest.raises(SealError):
            Sealer(SECRET).read(path, "x")
