"""``ptxas`` (CUDA toolkit, no GPU needed) as the judge of generated PTX, shared by the NVPTX tests
and the conformance suite's PTX check.

CUDA 13's ptxas no longer takes sm_72 (Xavier): its PTX is assembled for sm_75, as PTX for sm_XY
assembles for any newer architecture; sm_87 (Orin) PTX is assembled for sm_87.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

PTXAS_ARCH = {"sm_72": "sm_75", "sm_87": "sm_87"}
"""The Jetson profiles' PTX architectures and the ``ptxas -arch`` that checks each."""


def ptxas(ptx: str, arch: str, workdir: Path) -> subprocess.CompletedProcess:
    src = workdir / f"model_{arch}.ptx"
    src.write_text(ptx)
    return subprocess.run(["ptxas", f"-arch={arch}", str(src), "-o", str(src.with_suffix(".cubin"))],
                          capture_output=True, text=True)
