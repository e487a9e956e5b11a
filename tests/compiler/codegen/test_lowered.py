import os

import numpy as np
import pytest

from cuvil.compiler.codegen.lowered import aligned_empty
from cuvil.compiler.errors import LimitError


def test_aligned_empty_is_zeroed_and_page_aligned():
    a = aligned_empty(3 * 4096 + 5)
    assert a.dtype == np.uint8 and len(a) == 3 * 4096 + 5
    assert a.ctypes.data % 4096 == 0
    assert not a.any()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork (POSIX); every build machine is Linux")
def test_a_forked_childs_writes_stay_its_own():
    """A session's arena is private memory: a forked child running the parent's session must not
    write into the parent's arena."""
    a = aligned_empty(8192)
    pid = os.fork()
    if pid == 0:
        a[:] = 7
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert not a.any()


def test_an_impossible_size_is_a_limit_error():
    with pytest.raises(LimitError):
        aligned_empty(1 << 62)
