import os

import numpy as np
import pytest

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")


@pytest.fixture(scope="session", autouse=True)
def isolated_compile_cache(tmp_path_factory):
    """Compiled objects go to a per-session cache, never the user's ~/.cache/cuvil; the device secret
    that seals them to a per-session state directory, never ~/.local/state/cuvil."""
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg-cache"))
    os.environ["XDG_STATE_HOME"] = str(tmp_path_factory.mktemp("xdg-state"))


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)
