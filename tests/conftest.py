import os

import numpy as np
import pytest

from cuvil.compiler import target, tuning
from cuvil.devices import detect, profile

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")

_shipped_tuning = tuning.default_tuning


def _untuned(*args, **kwargs):
    """The suite's targets (host and named profiles) default to no on-device autotuning: compiles here
    take the cost model's choice, so they stay fast and give the same code every time; tests of the
    tuner pass ``tune=True``, and a profile's own ``[tuning]`` table still overrides this."""
    return _shipped_tuning(*args, **kwargs).replace(autotune=False)


profile.default_tuning = target.default_tuning = _untuned
detect.host_profile.cache_clear()


@pytest.fixture(scope="session", autouse=True)
def isolated_compile_cache(tmp_path_factory):
    """Compiled objects go to a per-session cache, never the user's ~/.cache/cuvil; the device secret
    that seals them to a per-session state directory, never ~/.local/state/cuvil."""
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg-cache"))
    os.environ["XDG_STATE_HOME"] = str(tmp_path_factory.mktemp("xdg-state"))


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)
