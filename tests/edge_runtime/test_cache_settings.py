"""Where the compile cache lives and how much it keeps, as the environment says: each setting checked."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from cuvil.compiler.errors import CuvilError
from cuvil.edge_runtime import cache_settings as settings
from cuvil.edge_runtime.cache import CompileCache, finish_writes
from cuvil.edge_runtime.cache_settings import default_dir
from cuvil.edge_runtime.compile import compile_graph

from .test_session import mlp_graph


def test_a_relative_xdg_cache_home_is_ignored(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_dir() == tmp_path / "xdg" / "cuvil"
    for relative in ("relcache", "./c", ""):
        monkeypatch.setenv("XDG_CACHE_HOME", relative)
        assert default_dir() == tmp_path / "home" / ".cache" / "cuvil"


@pytest.mark.parametrize("given", ["-1", "lots", "1e9", "", " ", "²"])
def test_a_max_bytes_that_is_no_count_of_bytes_is_refused_by_name(monkeypatch, tmp_path, given):
    monkeypatch.setenv(settings.MAX_BYTES_ENV, given)
    with pytest.raises(CuvilError, match=f"^{settings.MAX_BYTES_ENV}=.* is not a number of bytes"):
        CompileCache(tmp_path / "cache")


@pytest.mark.parametrize("given, kept", [("0", 0), ("1048576", 1 << 20), (" 7 ", 7)])
def test_a_max_bytes_that_is_a_count_is_kept(monkeypatch, tmp_path, given, kept):
    monkeypatch.setenv(settings.MAX_BYTES_ENV, given)
    assert CompileCache(tmp_path / "cache").max_bytes == kept


@pytest.mark.parametrize("where", ["file", "under_a_file"])
def test_a_cache_dir_that_is_a_file_is_one_warning_and_the_compile_works(tmp_path, caplog, where):
    file = tmp_path / "cache"
    file.write_bytes(b"not a folder")
    cache_dir = file if where == "file" else file / "cuvil"
    with caplog.at_level(logging.WARNING):
        session = compile_graph(mlp_graph(seed=1), cache_dir=cache_dir)
        finish_writes()
    (y,) = session.run({"x": np.zeros((1, 37), np.float32)}).values()
    assert y.shape == (1, 10)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith(f"compile cache disabled: {cache_dir}"), warnings
    assert file.read_bytes() == b"not a folder"
