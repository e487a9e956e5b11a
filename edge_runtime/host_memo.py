"""The host Target on a warm start without llvmlite: LLVM's facts about this CPU, remembered in the cache.

Asking LLVM for the host CPU name and features imports llvmlite's native library (~45 MB resident,
milliseconds). The answer depends only on the CPU, the kernel's view of it and llvmlite's version,
all of which :func:`~cuvil.devices.detect.host_stamp` covers; so it is kept in a file sealed under
the device secret and that stamp. Another CPU (its flags differ), another llvmlite or a damaged
file fails the seal, and LLVM is asked again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ..compiler.target import Target
from ..devices.detect import HostFacts, host_stamp, know_host, llvm_host_facts, profile_of, resolve_target
from .cache import CompileCache
from .private import private_dir
from .sealed import SealError

HOST_FILE = "host.cuvil-cpu"
log = logging.getLogger(__name__)


def host_target(cache: CompileCache, ask: Callable[[], HostFacts] | None = None) -> Target:
    """This machine's Target, from facts remembered in ``cache`` when they are there and still true;
    else asked of ``ask`` (default: LLVM in this process) and remembered. This process's
    :func:`~cuvil.devices.detect.host_profile` is told them either way (sealing a file asks it)."""
    stamp = host_stamp()
    if cache.sealer is None or stamp is None:
        return resolve_target("host")
    path = cache.dir / HOST_FILE
    try:
        facts = HostFacts.from_json(cache.sealer.read(path, stamp).meta)
        know_host(facts)
        return profile_of(facts).target()
    except (OSError, SealError, ValueError, KeyError, TypeError, RecursionError):
        pass
    facts = (ask or llvm_host_facts)()
    know_host(facts)
    try:
        private_dir(cache.dir)
        cache.sealer.write(path, stamp, facts.to_json().encode(), [], b"")
    except (OSError, SealError) as e:
        log.warning("could not remember the host CPU in %s: %s", path, e.strerror if isinstance(e, OSError) else e)
    return profile_of(facts).target()
