"""LLVM's facts about the host CPU (process triple, CPU name, feature map): the one part of host
detection that needs llvmlite (and maps ~45 MB of it). Apart from :mod:`.detect` and importing
nothing of Cuvil, so an LLVM helper process answers them right after loading llvmlite: a cold
compile that asks a helper (rather than load llvmlite itself) waits for that answer."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import BinaryIO

FACTS_REQUEST = b"facts"


@dataclass(frozen=True)
class HostFacts:
    triple: str
    cpu: str
    features: tuple[tuple[str, bool], ...]  # sorted (name, enabled)

    def to_json(self) -> str:
        return json.dumps({"triple": self.triple, "cpu": self.cpu, "features": [list(f) for f in self.features]})

    @staticmethod
    def from_json(text: str | bytes) -> HostFacts:
        """Facts written by :meth:`to_json` (a memo file, an LLVM helper process); ValueError, KeyError
        or TypeError for anything else."""
        got = json.loads(text)
        facts = HostFacts(got["triple"], got["cpu"], tuple((f, on) for f, on in got["features"]))
        if not (isinstance(facts.triple, str) and isinstance(facts.cpu, str)
                and all(isinstance(f, str) and type(on) is bool for f, on in facts.features)):
            raise ValueError("not host facts")
        return facts


def llvm_host_facts() -> HostFacts:
    import llvmlite.binding as llvm

    return HostFacts(llvm.get_process_triple(), llvm.get_host_cpu_name(),
                     tuple(sorted((str(k), bool(v)) for k, v in llvm.get_host_cpu_features().items())))


def answer_request(inp: BinaryIO, out: BinaryIO) -> bytes | None:
    """A helper's first input line: when it is :data:`FACTS_REQUEST`, answered with one JSON line of
    :class:`HostFacts` and None returned (the next line is left unread); else the line."""
    head = inp.readline()
    if head.strip() != FACTS_REQUEST:
        return head
    out.write(llvm_host_facts().to_json().encode() + b"\n")
    out.flush()
    return None
