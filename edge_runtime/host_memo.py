"""The host Target on a warm start without llvmlite: LLVM's facts about this CPU, remembered in the cache.

Asking LLVM for the host CPU name and features imports llvmlite's native library (~45 MB resident,
milliseconds). The answer depends only on the CPU, the kernel's view of it and llvmlite's version,
all of which :func:`~cuvil.devices.detect.host_stamp` covers; so it is kept in a file sealed under
the device secret and that stamp. Another CPU (its flags differ), another llvmlite or a damaged
file fails the seal, and LLVM is asked again.
"""

from __future__ import annotations

import json
import logging

from ..compiler.target import Target
from ..devices.detect import HostFacts, host_stamp, llvm_host_facts, profile_of, resolve_target
from .cache import CompileCache
from .private import private_dir
from .sealed import SealError

HOST_FILE = "host.cuvil-cpu"
log = logging.getLogger(__name__)


def _facts(meta: bytes) -> HostFacts:
    got = json.loads(meta)
    facts = HostFacts(got["triple"], got["cpu"], tuple((f, on) for f, on in got["features"]))
    if not (isinstance(facts.triple, str) and isinstance(facts.cpu, str)
            and all(isinstance(f, str) and type(on) is bool for f, on in facts.features)):
        raise ValueError("not host facts")
    return facts


def host_target(cache: CompileCache) -> Target:
    """This machine's Target, from facts remembered in ``cache`` when they are there and still true."""
    stamp = host_stamp()
    if cache.sealer is None or stamp is None:
        return resolve_target("host")
    path = cache.dir / HOST_FILE
    try:
        return profile_of(_facts(cache.sealer.read(path, stamp).meta)).target()
    except (OSError, SealError, ValueError, KeyError, TypeError, RecursionError):
        pass
    facts = llvm_host_facts()
    try:
        private_dir(cache.dir)
        meta = {"triple": facts.triple, "cpu": facts.cpu, "features": [list(f) for f in facts.features]}
        cache.sealer.write(path, stamp, json.dumps(meta).encode(), [], b"")
    except (OSError, SealError) as e:
        log.warning("could not remember the host CPU in %s: %s", path, e.strerror if isinstance(e, OSError) else e)
    return profile_of(facts).target()
