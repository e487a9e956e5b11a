"""Real processes for the deployment tests: shell blocks run in their own sessions, process trees, waits.

Flower's SuperLink starts its ServerApp processes detached (a new session), so a kill that must take
a whole SuperLink down, or find its ServerApp, walks the tree by parent pid (``/proc``).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

BLOCK = re.compile(r"<!-- fleet-e2e: (\w+) -->\n```sh\n(.*?)```", re.S)


def doc_blocks(doc: Path) -> dict[str, str]:
    """The shell blocks of a document, by the name in the ``<!-- fleet-e2e: NAME -->`` line above each."""
    blocks = BLOCK.findall(doc.read_text())
    names = [name for name, _ in blocks]
    assert len(set(names)) == len(names), f"duplicate block names in {doc}: {names}"
    return dict(blocks)


def _parents() -> dict[int, int]:
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            out[int(entry)] = int(stat[stat.rindex(")") + 2:].split()[1])
    return out


def descendants(pid: int) -> list[int]:
    parents = _parents()
    found, frontier = [], [pid]
    while frontier:
        kids = [p for p, parent in parents.items() if parent in frontier]
        found += kids
        frontier = kids
    return found


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def kill_tree(pid: int) -> None:
    """SIGKILL a process and everything it started (detached sessions included)."""
    for p in [pid, *descendants(pid)]:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def wait_for(cond, timeout: float, what: str, step: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


class Shell:
    """Runs shell blocks with one environment; remembers every session it started, to kill them all."""

    def __init__(self, env: dict[str, str], cwd: Path, logs: Path):
        self.env, self.cwd, self.logs = env, cwd, logs
        self.started: list[subprocess.Popen] = []
        self.n = 0

    def start(self, script: str, name: str, extra_env: dict[str, str] | None = None) -> subprocess.Popen:
        self.n += 1
        log = open(self.logs / f"{self.n:02d}-{name}.log", "wb")  # noqa: SIM115 - the child holds it
        p = subprocess.Popen(["bash", "-euo", "pipefail", "-c", script], cwd=self.cwd, stdout=log,
                             stderr=subprocess.STDOUT, env={**self.env, **(extra_env or {})}, start_new_session=True)
        log.close()
        p.log_path = self.logs / f"{self.n:02d}-{name}.log"  # type: ignore[attr-defined]
        self.started.append(p)
        return p

    def run(self, script: str, name: str, timeout: float, extra_env: dict[str, str] | None = None) -> str:
        p = self.start(script, name, extra_env)
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            kill_tree(p.pid)
            raise AssertionError(f"block {name!r} ran past {timeout:.0f} s:\n{self.output(p)[-3000:]}") from None
        out = self.output(p)
        assert p.returncode == 0, f"block {name!r} exited {p.returncode}:\n{out[-3000:]}"
        return out

    @staticmethod
    def output(p: subprocess.Popen) -> str:
        return p.log_path.read_text(errors="replace")  # type: ignore[attr-defined]

    def close(self, pid_files: list[Path]) -> None:
        for f in pid_files:
            try:
                kill_tree(int(f.read_text().split()[0]))
            except (OSError, ValueError, IndexError):
                pass
        for p in self.started:
            kill_tree(p.pid)
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            p.wait(timeout=30)
