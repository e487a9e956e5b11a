"""The worker pool, emitted into the model's own module: fixed threads, one static control block.

``<entry>_start()`` creates ``threads - 1`` workers with ``pthread_create`` (the C library the
process or the emulation harness already links) and ``<entry>_stop()`` joins them; nothing is
created or allocated per inference. A split layer is one *job* ``void job(i8* arena, i8* weights,
i32 part)``; ``<entry>_par`` publishes it with part 0 already its own, runs that part, and then, like
every awake worker, *claims* parts one at a time from a shared counter until none is left, and waits
only for parts already claimed. (Taking part 0 before the workers see the job, instead of claiming it
like them, made ResNet-18 at 2 threads 2.0-2.8% faster on the Xeon, SqueezeNet 2.1%, MobileNetV2 1.7%,
five interleaved runs against 0.2-0.6% between two builds of the same code; in a test of 3,000 jobs
the caller had won part 0's claim every time, so the cause is not a stolen part.) Each
part's code is fixed at compile time, so the answer is the same whoever runs a part; and a worker
the scheduler has not run yet (a busy CPU) delays nothing: the caller runs its parts itself
(with no workers at all, when the pool was never started, it runs every part).

The claim word holds (generation << 32 | parts << 16 | next part): a compare-and-swap on it can
only take a part of the job it was read from, so a worker that wakes late never runs a part of the
next job. Waiting spins (``pause`` / ``yield``) for ``Tuning.pool_spin`` rounds, then sleeps on a
futex; a sleeper count on each word lets the other side skip the wake-up system call when nobody
sleeps. Every handshake is a sequentially consistent read-modify-write followed by a load on one
side and a store or RMW followed by a load on the other, so one of them always sees the other.
"""

from __future__ import annotations

from collections.abc import Mapping

from llvmlite import ir

from ...target import Target
from ..irhelpers import I8P, I32, I64, VOID, call_named, set_fn_attrs
from .threads import AFFINITY_SYSCALLS, FUTEX_SYSCALL, MAX_THREADS

_WAIT, _WAKE = 128, 129  # FUTEX_WAIT_PRIVATE, FUTEX_WAKE_PRIVATE
MASK_WORDS = 16  # a CPU mask of 1024 CPUs, as glibc's cpu_set_t
_SPIN_HINT: Mapping[str, tuple[str, tuple]] = {"x86_64": ("llvm.x86.sse2.pause", ()), "aarch64": ("llvm.aarch64.hint", (1,))}
# control block slots (i64 each); the hot words sit on cache lines of their own
GEN, CLAIM, REMAIN, SLEEPERS, MAIN_SLEEPS, STOP, LIVE, JOB, ARENA, WEIGHTS, TIDS = 0, 8, 16, 24, 25, 26, 27, 28, 29, 30, 32
JOB_TYPE = ir.FunctionType(VOID, [I8P, I8P, I32])
SEQ = "seq_cst"


class Pool:
    """Emits the control block and the pool's functions for one entry point."""

    def __init__(self, module: ir.Module, entry: str, target: Target, attrs: dict[str, str]):
        self.module, self.target, self.attrs = module, target, attrs
        self.arch = target.triple.split("-")[0]
        self.block = ir.GlobalVariable(module, ir.ArrayType(I64, TIDS + MAX_THREADS), f"{entry}_pool")
        self.block.linkage = "internal"
        self.block.align = 64
        self.block.initializer = ir.Constant(self.block.type.pointee, None)
        self.par = self._fn(f"{entry}_par", VOID, [JOB_TYPE.as_pointer(), I8P, I8P, I32])
        if target.threads > 1:
            self._emit_par()
            worker = self._worker(f"{entry}_worker")
        else:
            self._emit_serial()
            worker = None
        self.nudge = self._fn(f"{entry}_nudge", VOID, [])
        self._emit_nudge(target.threads > 1)
        self._start(f"{entry}_start", worker)
        self._stop(f"{entry}_stop", worker is not None)
        self._detach(f"{entry}_detach")

    # -- helpers --------------------------------------------------------------------------------
    def _fn(self, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
        """External, as the entry points: the parallel native compiler keeps them in the entry's part."""
        fn = ir.Function(self.module, ir.FunctionType(ret, args), name=name)
        set_fn_attrs(fn, ["nounwind", "noinline"], self.attrs)
        return fn

    def _slot(self, b: ir.IRBuilder, i: int, ty: ir.Type = I64) -> ir.Value:
        p = b.gep(self.block, [ir.Constant(I32, 0), ir.Constant(I32, i)])
        return p if ty is I64 else b.bitcast(p, ty.as_pointer())

    def _syscall(self, b: ir.IRBuilder, number: int, *args: ir.Value) -> ir.Value:
        fn = self.module.globals.get("syscall") or ir.Function(self.module, ir.FunctionType(I64, [I64], var_arg=True), "syscall")
        return b.call(fn, [ir.Constant(I64, number), *args])

    def _futex(self, b: ir.IRBuilder, word: ir.Value, op: int, val: ir.Value) -> None:
        self._syscall(b, FUTEX_SYSCALL[self.arch], b.ptrtoint(word, I64), ir.Constant(I64, op), b.sext(val, I64),
                      ir.Constant(I64, 0))

    def _pin(self, b: ir.IRBuilder, index: ir.Value) -> None:
        """Bind this worker to the ``index``-th CPU (from 0) of the mask it inherited, so the caller keeps
        the first: left to the scheduler, ResNet-18's 2-thread run on a quiet 2-core Zen 4 was 1.00-1.45x
        its 1-thread speed in three processes of three, pinned 1.64-1.88x in four. Nothing where the mask
        holds fewer CPUs (the worker then goes wherever the scheduler puts it)."""
        get, set_ = AFFINITY_SYSCALLS[self.arch]
        mask_t = ir.ArrayType(I64, MASK_WORDS)
        mask = b.alloca(mask_t)
        b.store(ir.Constant(mask_t, None), mask)
        size = ir.Constant(I64, 8 * MASK_WORDS)
        got = self._syscall(b, get, ir.Constant(I64, 0), size, b.ptrtoint(mask, I64))
        pre = b.block
        scan, test, hit, miss, bind, done = (b.append_basic_block(n) for n in ("pin.scan", "pin.test", "pin.hit",
                                                                             "pin.miss", "pin.bind", "pin.done"))
        bits = b.mul(got, ir.Constant(I64, 8))  # the kernel wrote this many bytes of mask (or failed: < 0)
        b.branch(scan)
        b.position_at_end(scan)
        cpu, seen = b.phi(I64), b.phi(I64)
        cpu.add_incoming(ir.Constant(I64, 0), pre)
        seen.add_incoming(ir.Constant(I64, 0), pre)
        b.cbranch(b.icmp_signed("<", cpu, bits), test, done)
        b.position_at_end(test)
        word = b.load(b.gep(mask, [ir.Constant(I32, 0), b.lshr(cpu, ir.Constant(I64, 6))]))
        on = b.trunc(b.lshr(word, b.and_(cpu, ir.Constant(I64, 63))), ir.IntType(1))
        b.cbranch(on, hit, miss)
        b.position_at_end(hit)
        b.cbranch(b.icmp_signed("==", seen, b.zext(index, I64)), bind, miss)
        b.position_at_end(miss)
        cpu.add_incoming(b.add(cpu, ir.Constant(I64, 1)), miss)
        seen.add_incoming(b.add(seen, b.zext(on, I64)), miss)
        b.branch(scan)
        b.position_at_end(bind)
        b.store(ir.Constant(mask_t, None), mask)
        b.store(b.shl(ir.Constant(I64, 1), b.and_(cpu, ir.Constant(I64, 63))),
                b.gep(mask, [ir.Constant(I32, 0), b.lshr(cpu, ir.Constant(I64, 6))]))
        self._syscall(b, set_, ir.Constant(I64, 0), size, b.ptrtoint(mask, I64))
        b.branch(done)
        b.position_at_end(done)

    def _hint(self, b: ir.IRBuilder) -> None:
        name, args = _SPIN_HINT[self.arch]
        call_named(b, name, VOID, [ir.Constant(I32, a) for a in args])

    def _run_parts(self, b: ir.IRBuilder, first: ir.Value, step: ir.Value, job, arena, weights, parts) -> None:
        """for (p = first; p < parts; p += step) job(arena, weights, p)"""
        pre = b.block
        head, body, done = (b.append_basic_block(n) for n in ("parts.head", "parts.body", "parts.end"))
        b.branch(head)
        b.position_at_end(head)
        p = b.phi(I32)
        p.add_incoming(first, pre)
        b.cbranch(b.icmp_signed("<", p, parts), body, done)
        b.position_at_end(body)
        b.call(job, [arena, weights, p])
        p.add_incoming(b.add(p, step), b.block)
        b.branch(head)
        b.position_at_end(done)

    def _wait(self, b: ir.IRBuilder, word: ir.Value, flag: ir.Value, until_zero: bool, old: ir.Value | None = None) -> ir.Value:
        """Spin, then sleep, until ``*word`` is 0 (``until_zero``) or differs from ``old``; returns it.
        Any wake-up (a nudge ahead of a job, or a spurious one) starts the spin again."""
        def ready(v):
            return b.icmp_signed("==", v, ir.Constant(I32, 0)) if until_zero else b.icmp_signed("!=", v, old)
        pre = b.block
        spin, hint, sleep, nap, woke, out = (b.append_basic_block(n) for n in ("w.spin", "w.hint", "w.sleep", "w.nap",
                                                                                "w.woke", "w.out"))
        b.branch(spin)
        b.position_at_end(spin)
        i = b.phi(I32)
        i.add_incoming(ir.Constant(I32, 0), pre)
        v1 = b.load_atomic(word, "acquire", 4)
        b.cbranch(ready(v1), out, hint)
        b.position_at_end(hint)
        self._hint(b)
        i.add_incoming(b.add(i, ir.Constant(I32, 1)), hint)
        b.cbranch(b.icmp_signed("<", i, ir.Constant(I32, self.target.tuning.pool_spin)), spin, sleep)
        b.position_at_end(sleep)
        b.atomic_rmw("add", flag, ir.Constant(I32, 1), SEQ)
        v2 = b.load_atomic(word, SEQ, 4)
        b.cbranch(ready(v2), woke, nap)
        b.position_at_end(nap)
        self._futex(b, word, _WAIT, v2 if until_zero else old)
        b.branch(woke)
        b.position_at_end(woke)
        b.atomic_rmw("sub", flag, ir.Constant(I32, 1), SEQ)
        i.add_incoming(ir.Constant(I32, 0), woke)
        b.branch(spin)
        b.position_at_end(out)
        return v1

    # -- functions ------------------------------------------------------------------------------
    def _emit_serial(self) -> None:
        b = ir.IRBuilder(self.par.append_basic_block("entry"))
        job, arena, weights, parts = self.par.args
        self._run_parts(b, ir.Constant(I32, 0), ir.Constant(I32, 1), job, arena, weights, parts)
        b.ret_void()

    def _claim_parts(self, b: ir.IRBuilder) -> ir.Value:
        """Take parts of the current job until none is left, running each; returns how many (i32)."""
        claim = self._slot(b, CLAIM)
        pre = b.block
        head, try_, body, done = (b.append_basic_block(n) for n in ("c.head", "c.try", "c.body", "c.end"))
        b.branch(head)
        b.position_at_end(head)
        mine = b.phi(I32)
        mine.add_incoming(ir.Constant(I32, 0), pre)
        w = b.load_atomic(claim, SEQ, 8)
        nxt = b.trunc(b.and_(w, ir.Constant(I64, 0xFFFF)), I32)
        parts = b.trunc(b.and_(b.lshr(w, ir.Constant(I64, 16)), ir.Constant(I64, 0xFFFF)), I32)
        b.cbranch(b.icmp_signed("<", nxt, parts), try_, done)
        b.position_at_end(try_)
        got = b.extract_value(b.cmpxchg(claim, w, b.add(w, ir.Constant(I64, 1)), SEQ, SEQ), 1)
        mine.add_incoming(mine, try_)
        b.cbranch(got, body, head)
        b.position_at_end(body)
        job = b.inttoptr(b.load(self._slot(b, JOB)), JOB_TYPE.as_pointer())  # the claimed job's: it cannot end before this part
        b.call(job, [b.inttoptr(b.load(self._slot(b, ARENA)), I8P), b.inttoptr(b.load(self._slot(b, WEIGHTS)), I8P), nxt])
        mine.add_incoming(b.add(mine, ir.Constant(I32, 1)), body)
        b.branch(head)
        b.position_at_end(done)
        return mine

    def _emit_par(self) -> None:
        b = ir.IRBuilder(self.par.append_basic_block("entry"))
        job, arena, weights, parts = self.par.args
        live = b.load(self._slot(b, LIVE, I32))
        solo, shared = b.append_basic_block("solo"), b.append_basic_block("shared")
        b.cbranch(b.icmp_signed("==", live, ir.Constant(I32, 0)), solo, shared)
        b.position_at_end(solo)
        self._run_parts(b, ir.Constant(I32, 0), ir.Constant(I32, 1), job, arena, weights, parts)
        b.ret_void()
        b.position_at_end(shared)
        b.store(b.ptrtoint(job, I64), self._slot(b, JOB))
        b.store(b.ptrtoint(arena, I64), self._slot(b, ARENA))
        b.store(b.ptrtoint(weights, I64), self._slot(b, WEIGHTS))
        remain = self._slot(b, REMAIN, I32)
        b.store_atomic(parts, remain, "monotonic", 4)
        gen = self._slot(b, GEN, I32)
        nxt_gen = b.zext(b.add(b.load(gen), ir.Constant(I32, 1)), I64)  # only this thread writes GEN
        word = b.or_(b.shl(nxt_gen, ir.Constant(I64, 32)), b.shl(b.zext(parts, I64), ir.Constant(I64, 16)))
        word = b.or_(word, ir.Constant(I64, 1))  # part 0 is the caller's, taken before the workers see the job
        b.store_atomic(word, self._slot(b, CLAIM), SEQ, 8)
        b.atomic_rmw("add", gen, ir.Constant(I32, 1), SEQ)
        sleepers = b.load_atomic(self._slot(b, SLEEPERS, I32), SEQ, 4)
        wake, go = b.append_basic_block("wake"), b.append_basic_block("go")
        b.cbranch(b.icmp_signed(">", sleepers, ir.Constant(I32, 0)), wake, go)
        b.position_at_end(wake)
        self._futex(b, gen, _WAKE, ir.Constant(I32, MAX_THREADS))
        b.branch(go)
        b.position_at_end(go)
        b.call(job, [arena, weights, ir.Constant(I32, 0)])
        mine = b.add(self._claim_parts(b), ir.Constant(I32, 1))
        old = b.atomic_rmw("sub", remain, mine, SEQ)
        wait, out = b.append_basic_block("wait"), b.append_basic_block("out")
        b.cbranch(b.icmp_signed("==", old, mine), out, wait)
        b.position_at_end(wait)
        self._wait(b, remain, self._slot(b, MAIN_SLEEPS, I32), until_zero=True)
        b.branch(out)
        b.position_at_end(out)
        b.ret_void()

    def _emit_nudge(self, threaded: bool) -> None:
        """Wake sleeping workers ahead of a job (the caller calls it a layer before): they spin again,
        so the job finds them awake and skips the futex wake-up's latency; a no-op when none sleeps."""
        b = ir.IRBuilder(self.nudge.append_basic_block("entry"))
        if threaded:
            wake, done = b.append_basic_block("wake"), b.append_basic_block("done")
            sleepers = b.load_atomic(self._slot(b, SLEEPERS, I32), "monotonic", 4)
            b.cbranch(b.icmp_signed(">", sleepers, ir.Constant(I32, 0)), wake, done)
            b.position_at_end(wake)
            self._futex(b, self._slot(b, GEN, I32), _WAKE, ir.Constant(I32, MAX_THREADS))
            b.branch(done)
            b.position_at_end(done)
        b.ret_void()

    def _worker(self, name: str) -> ir.Function:
        fn = self._fn(name, I8P, [I8P])
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        if self.target.tuning.pool_pin:
            self._pin(b, b.trunc(b.ptrtoint(fn.args[0], I64), I32))  # the worker's number, 1 to threads - 1
        pre = b.block
        loop = b.append_basic_block("loop")
        b.branch(loop)
        b.position_at_end(loop)
        seen = b.phi(I32)
        seen.add_incoming(ir.Constant(I32, 0), pre)
        now = self._wait(b, self._slot(b, GEN, I32), self._slot(b, SLEEPERS, I32), until_zero=False, old=seen)
        quit_, work = b.append_basic_block("quit"), b.append_basic_block("work")
        b.cbranch(b.icmp_signed("!=", b.load(self._slot(b, STOP, I32)), ir.Constant(I32, 0)), quit_, work)
        b.position_at_end(quit_)
        b.ret(ir.Constant(I8P, None))
        b.position_at_end(work)
        mine = self._claim_parts(b)
        remain = self._slot(b, REMAIN, I32)
        count, last, wake, back = (b.append_basic_block(n) for n in ("count", "last", "wake", "back"))
        b.cbranch(b.icmp_signed("==", mine, ir.Constant(I32, 0)), back, count)
        b.position_at_end(count)
        old = b.atomic_rmw("sub", remain, mine, SEQ)
        b.cbranch(b.icmp_signed("==", old, mine), last, back)
        b.position_at_end(last)
        sleeping = b.load_atomic(self._slot(b, MAIN_SLEEPS, I32), SEQ, 4)
        b.cbranch(b.icmp_signed("!=", sleeping, ir.Constant(I32, 0)), wake, back)
        b.position_at_end(wake)
        self._futex(b, remain, _WAKE, ir.Constant(I32, 1))
        b.branch(back)
        b.position_at_end(back)
        seen.add_incoming(now, back)
        b.branch(loop)
        return fn

    def _start(self, name: str, worker: ir.Function | None) -> None:
        """Create the workers once (idempotent); a failed pthread_create leaves fewer, never a gap."""
        fn = self._fn(name, VOID, [])
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        live = self._slot(b, LIVE, I32)
        if worker is None:
            b.ret_void()
            return
        fresh, done = b.append_basic_block("fresh"), b.append_basic_block("done")
        b.cbranch(b.icmp_signed("==", b.load(live), ir.Constant(I32, 0)), fresh, done)
        b.position_at_end(fresh)
        for slot in (GEN, CLAIM, REMAIN, SLEEPERS, MAIN_SLEEPS, STOP):
            b.store(ir.Constant(I64, 0), self._slot(b, slot))
        create = ir.Function(self.module, ir.FunctionType(I32, [I64.as_pointer(), I8P, worker.type, I8P]), "pthread_create")
        made = ir.Constant(I32, 0)
        for i in range(1, self.target.threads):
            ok, fail = b.append_basic_block(f"made{i}"), b.append_basic_block(f"fail{i}")
            rc = b.call(create, [self._slot(b, TIDS + i), ir.Constant(I8P, None), worker, b.inttoptr(ir.Constant(I64, i), I8P)])
            b.cbranch(b.icmp_signed("==", rc, ir.Constant(I32, 0)), ok, fail)
            b.position_at_end(fail)
            b.store(made, live)
            b.ret_void()
            b.position_at_end(ok)
            made = ir.Constant(I32, i)
        b.store(made, live)
        b.branch(done)
        b.position_at_end(done)
        b.ret_void()

    def _stop(self, name: str, threaded: bool) -> None:
        fn = self._fn(name, VOID, [])
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        if not threaded:
            b.ret_void()
            return
        live = b.load(self._slot(b, LIVE, I32))
        b.store(ir.Constant(I32, 1), self._slot(b, STOP, I32))
        gen = self._slot(b, GEN, I32)
        b.atomic_rmw("add", gen, ir.Constant(I32, 1), SEQ)
        self._futex(b, gen, _WAKE, ir.Constant(I32, MAX_THREADS))
        join = ir.Function(self.module, ir.FunctionType(I32, [I64, I8P.as_pointer()]), "pthread_join")
        pre = b.block
        head, body, done = (b.append_basic_block(n) for n in ("j.head", "j.body", "j.end"))
        b.branch(head)
        b.position_at_end(head)
        i = b.phi(I32)
        i.add_incoming(ir.Constant(I32, 1), pre)
        b.cbranch(b.icmp_signed("<=", i, live), body, done)
        b.position_at_end(body)
        tid_p = b.gep(self.block, [ir.Constant(I32, 0), b.add(i, ir.Constant(I32, TIDS))])
        b.call(join, [b.load(tid_p), ir.Constant(I8P.as_pointer(), None)])
        i.add_incoming(b.add(i, ir.Constant(I32, 1)), b.block)
        b.branch(head)
        b.position_at_end(done)
        b.store(ir.Constant(I32, 0), self._slot(b, LIVE, I32))
        b.ret_void()

    def _detach(self, name: str) -> None:
        """Forget the workers without joining them (a forked child has none: they stayed in the parent)."""
        fn = self._fn(name, VOID, [])
        b = ir.IRBuilder(fn.append_basic_block("entry"))
        b.store(ir.Constant(I32, 0), self._slot(b, LIVE, I32))
        b.ret_void()
