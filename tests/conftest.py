import dataclasses
import os

import numpy as np
import pytest

from cuvil.devices import detect

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")

_detected_profile = detect.profile_from_host


def _untuned_host_profile(*args, **kwargs):
    """The suite's host profile: the detected one with on-device autotuning off, so compiles here
    take the cost model's choice and stay fast; tests of the tuner pass ``tune=True``."""
    p = _detected_profile(*args, **kwargs)
    return dataclasses.replace(p, tuning=tuple(sorted(dict(p.tuning, autotune=False).items())))


detect.profile_from_host = _untuned_host_profile
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
