"""Parallel loops: outlined bodies run by nfc's thread pool (or libgomp), or serial when small.

A `parallel` loop of the loop IR becomes an internal function `<kernel>.parN(ptr data)`
holding its body and a call `nfc_parallel(fn, data, min(n, omp_get_max_threads()), chunks)`
(nfc.codegen.llvm.threadpool). `data` carries the buffers' pointers, the loop variables the
body reads, the trip count, the number of chunks and a chunk counter: the threads claim
contiguous chunks (`CHUNKS_PER_THREAD` per thread) with an atomic increment until none is
left. Chunk k is always the same iterations, whichever thread runs it, so the results do not
depend on the thread count, on the backend or on who ran what; and a thread whose core
another process holds (it starts late) finds the chunks taken by the others instead of
leaving its fixed share for them to wait on. On one thread the outlined function is called
directly, without the pool.

nfc's pool (the default) never waits for a thread that has not joined the region: the caller
claims chunks too, closes the region when none is left and waits only for helpers still
running a chunk; one that wakes up later finds the region closed. With
`NFC_THREADS_BACKEND=gomp` the pool hands the region to libgomp's `GOMP_parallel`, whose join
waits for every team-mate: one that the OS has not run yet (its core busy) holds the caller
there after the other chunks are done. With either backend a helper that the OS preempts in
the middle of a chunk holds the caller until it finishes that chunk. So each region checks
with the cycle counter whether it took longer than the caller alone would have (its own
chunks' time scaled to all of them, `_judge`); if so, the loop's next regions run on the
caller alone (`MAX_BACKOFF`: 1, then 3, 7, ... while it keeps happening, halved by each
region that paid; two counters per loop site, internal globals of the kernel's module) before
it tries its team again. On an idle machine the team pays and nothing changes.

A loop whose estimated work (`parallel_work`) is below `PARALLEL_MIN_WORK` is emitted as a
plain serial loop: starting and joining a team costs more than two threads save on it. With a
constant trip count the emitter decides; with one known only at run time the code compares it
with the threshold and holds both versions. libgomp itself is loaded with idle threads that
sleep rather than spin (nfc.codegen.jit._libgomp); the pool's workers spin briefly, then
sleep on a futex.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from llvmlite import ir

from nfc.affine import interval
from nfc.codegen.llvm import intrinsics
from nfc.codegen.loops import For, If, LoopKind, Stmt, Store
from nfc.ir import DType

if TYPE_CHECKING:
    from nfc.codegen.llvm.emitter import FuncEmitter

#: Parallel loops with less work than this (`parallel_work` units: about one instruction each)
#: run serially, on the calling thread: starting and joining a team of threads costs more
#: than two threads save on them. Measured: 4x the start-up cost of a 2-thread parallel region
#: with sleeping idle threads over the time of one unit (nfc.codegen.devbench.
#: parallel_min_work; 6.4 us and 0.126 ns on the reference machine: 203,000), so about 25 us
#: of one core's work (docs/performance.md, "Threads").
PARALLEL_MIN_WORK = 200_000
#: Most regions a parallel loop runs alone after its team-mates came too late to help in a
#: row (the back-off doubles from 1 each time: 1, 3, 7, ... 255, then stays).
MAX_BACKOFF = 255
#: Whether regions back off (off: every region on a team, for measuring regions).
BACKOFF = True
#: Chunks of a parallel loop per thread (at most one iteration each), claimed by the threads
#: as they come: more than one each, so a thread slowed down by another process on its core
#: leaves its share to the others.
CHUNKS_PER_THREAD = 4


def parallel_work(body: Stmt, ranges: dict[str, tuple[int, int]], lanes: int = 8) -> int:
    """Estimated work of one run of `body`: a store counts 1 plus its value's operations
    (the emitter's `_value_size`), loops multiply by their trip count (its upper bound when it
    varies), a vectorized loop by its vectors of `lanes` elements, a branch by its bigger
    arm."""
    from nfc.codegen.llvm.emitter import _value_size

    if isinstance(body, Store):
        return 1 + _value_size(body.value)
    if isinstance(body, For):
        c = body.const_extent
        if c is None:
            iv = interval(body.extent, ranges)
            c = iv[1] if iv is not None else 1
        c = max(c, 0)
        inner = {**ranges, body.var: (0, max(c - 1, 0))}
        per = parallel_work(body.body, inner, lanes)
        return per * (-(-c // lanes) if body.kind is LoopKind.VECTORIZED else c)
    if isinstance(body, If):
        arms = [body.then] + ([body.orelse] if body.orelse is not None else [])
        return 1 + max(parallel_work(a, ranges, lanes) for a in arms)
    return sum(parallel_work(ch, ranges, lanes) for ch in body.children())


def emit_parallel(em: FuncEmitter, s: For) -> None:
    """Emit parallel loop `s` at `em`'s position (see the module doc)."""
    from nfc.codegen.llvm.emitter import PTR, VOID, _aligned_alloca, _counter, set_attributes

    b = em.b
    i64 = intrinsics.I64
    n = em.value(s.extent, DType.I64)
    hi = em._hi(s.extent)
    per_iter = parallel_work(s.body, {**em.ranges, s.var: (0, max(hi or 0, 0))},
                             em.target.lanes(DType.F32))
    c = s.const_extent
    if c is not None and c * per_iter < PARALLEL_MIN_WORK:
        em.serial(s.var, ir.Constant(i64, 0), n, s.body, hi)
        return
    ptr_items = list(em.ptrs.items())
    if em.workspace is not None:
        ptr_items.append(("__workspace__", em.workspace))
    # known values (unrolled and single-iteration loop variables) are not passed through
    # memory: the outlined body uses the constants, which keeps its arithmetic folded
    env_items = [(k, v) for k, v in em.env.items() if not isinstance(v, ir.Constant)]
    env_consts = {k: v for k, v in em.env.items() if isinstance(v, ir.Constant)}
    # the data: pointers, variables, the trip count, then the chunks, the next chunk's number,
    # the chunks the caller ran and the cycle counter when it started and found none left
    st = ir.LiteralStructType([PTR] * len(ptr_items) + [i64] * (len(env_items) + 6))
    data = _aligned_alloca(em.entry, st, "par.data")
    zero = ir.Constant(intrinsics.I32, 0)
    vals = [v for _, v in ptr_items] + [v for _, v in env_items] + [n]
    for k, v in enumerate(vals):
        b.store(v, b.gep(data, [zero, ir.Constant(intrinsics.I32, k)], source_etype=st))
    sub = ir.Function(em.module, ir.FunctionType(VOID, [PTR]),
                      name=f"{em.fn.name}.par{next(_counter)}")
    sub.linkage = "internal"
    set_attributes(sub, ("nounwind", *em.target.function_attributes))
    child = type(em)(sub, em.target, parallel=False)
    child.ranges = dict(em.ranges)
    child.env.update(env_consts)
    child.ws_offsets = em.ws_offsets
    cb = child.b
    arg = sub.args[0]
    for k, v in enumerate(vals):
        got = cb.load(cb.gep(arg, [zero, ir.Constant(intrinsics.I32, k)], source_etype=st),
                      typ=v.type)
        if k < len(ptr_items):
            child.ptrs[ptr_items[k][0]] = got
        elif k < len(vals) - 1:
            child.env[env_items[k - len(ptr_items)][0]] = got
        else:
            total = got
    child.workspace = child.ptrs.pop("__workspace__", None)
    _claim_chunks(child, s, total, cb.gep(arg, [zero, ir.Constant(intrinsics.I32, len(vals))],
                                          source_etype=st), hi)
    child.finish()
    chunks = b.gep(data, [zero, ir.Constant(intrinsics.I32, len(vals))], source_etype=st)
    if c is not None:
        _fork(em, sub, data, chunks, n)
        return
    # a trip count known at run time only: the serial loop below the threshold
    few = -(-PARALLEL_MIN_WORK // max(per_iter, 1))  # trips that reach the threshold
    with b.if_else(b.icmp_signed(">=", n, ir.Constant(i64, few))) as (big, small):
        with big:
            _fork(em, sub, data, chunks, n)
        with small:
            em.serial(s.var, ir.Constant(i64, 0), n, s.body, hi)


def _claim_chunks(em: FuncEmitter, s: For, total: ir.Value, chunks: ir.Value,
                  max_index: int | None) -> None:
    """The outlined body of parallel loop `s`: claim chunk after chunk (an atomic counter
    right after `*chunks`, the number of chunks) and run its iterations
    [k·total/chunks, (k+1)·total/chunks), until none is left."""
    from nfc.codegen.llvm.emitter import _aligned_alloca, _counter

    b = em.b
    i64 = intrinsics.I64
    nchunks = b.load(chunks, typ=i64)
    counter = b.gep(chunks, [ir.Constant(i64, 1)], source_etype=i64)
    ran = _aligned_alloca(em.entry, i64, "ran")  # chunks this thread ran
    b.store(ir.Constant(i64, 0), ran)
    start = _cycles(em)
    n = next(_counter)
    head = em.fn.append_basic_block(f"claim.head{n}")
    work = em.fn.append_basic_block(f"claim.work{n}")
    done = em.fn.append_basic_block(f"claim.done{n}")
    b.branch(head)
    b.position_at_end(head)
    k = b.atomic_rmw("add", counter, ir.Constant(i64, 1), "monotonic")
    b.cbranch(b.icmp_signed("<", k, nchunks), work, done)
    b.position_at_end(work)
    lo = b.sdiv(b.mul(k, total), nchunks)
    hi = b.sdiv(b.mul(b.add(k, ir.Constant(i64, 1)), total), nchunks)
    em.serial(s.var, lo, hi, s.body, max_index)
    b.store(b.add(b.load(ran, typ=i64), ir.Constant(i64, 1)), ran)
    b.branch(head)
    b.position_at_end(done)
    # the caller (thread 0) notes how many chunks it ran and when it found none left (the
    # pool's counters read the former)
    tid = em.call_c("nfc_par_thread_num", intrinsics.I32, [])
    with b.if_then(b.icmp_signed("==", tid, ir.Constant(intrinsics.I32, 0))):
        b.store(b.load(ran, typ=i64), b.gep(chunks, [ir.Constant(i64, 2)], source_etype=i64))
        b.store(b.sub(_cycles(em), start),
                b.gep(chunks, [ir.Constant(i64, 3)], source_etype=i64))


def _cycles(em: FuncEmitter) -> ir.Value:
    """The CPU's cycle counter (`rdtsc`)."""
    return em.call_c("llvm.readcyclecounter", intrinsics.I64, [])


def _fork(em: FuncEmitter, sub: ir.Function, data: ir.Value, chunks: ir.Value,
          n: ir.Value) -> None:
    """Run the outlined `sub(data)` on `min(n, threads)` threads (`nfc_parallel`), or call
    it on this thread alone when that is one; `CHUNKS_PER_THREAD` chunks per thread."""
    from nfc.codegen.llvm.emitter import VOID

    b = em.b
    i64 = intrinsics.I64
    one = ir.Constant(i64, 1)
    maxt = b.sext(em.call_c("omp_get_max_threads", intrinsics.I32, []), i64)
    nthr = b.select(b.icmp_signed("<", n, maxt), n, maxt)
    per = b.mul(nthr, ir.Constant(i64, CHUNKS_PER_THREAD))
    b.store(b.select(b.icmp_signed("<", n, per), n, per), chunks)
    b.store(ir.Constant(i64, 0), b.gep(chunks, [one], source_etype=i64))
    if not BACKOFF:
        with b.if_else(b.icmp_signed(">", nthr, one)) as (on_team, alone):
            with on_team:
                em.call_c("nfc_parallel", VOID, [sub, data, b.trunc(nthr, intrinsics.I32),
                                                 chunks])
            with alone, b.if_then(b.icmp_signed(">", n, ir.Constant(i64, 0))):
                b.call(sub, [data])
        return
    skip, penalty, solo = _backoff_globals(em, sub.name)
    left = b.load_atomic(skip, "monotonic", 8, typ=i64)
    team = b.and_(b.icmp_signed(">", nthr, one), b.icmp_signed("<=", left, ir.Constant(i64, 0)))
    with b.if_else(team) as (on_team, alone):
        with on_team:
            t0 = _cycles(em)
            em.call_c("nfc_parallel", VOID, [sub, data, b.trunc(nthr, intrinsics.I32),
                                             chunks])
            _judge(em, chunks, t0, skip, penalty, solo)
        with alone:
            backing_off = b.icmp_signed(">", nthr, one)
            with b.if_then(backing_off):  # one fewer to skip
                _store_atomic(b, b.sub(left, one), skip)
            with b.if_then(b.icmp_signed(">", n, ir.Constant(i64, 0))):
                t0 = _cycles(em)
                b.call(sub, [data])
                with b.if_then(backing_off):  # what the loop costs alone, lately
                    took = b.sub(_cycles(em), t0)
                    old = b.load_atomic(solo, "monotonic", 8, typ=i64)
                    avg = b.lshr(b.add(old, took), one)
                    _store_atomic(b, b.select(b.icmp_signed(">", old, ir.Constant(i64, 0)),
                                              avg, took), solo)


def _judge(em: FuncEmitter, chunks: ir.Value, t0: ir.Value, skip: ir.Value,
           penalty: ir.Value, solo: ir.Value) -> None:
    """After a region: was it slower than the caller alone would have been? Alone, the loop
    lately took `solo` cycles (the mean of its runs while backing off); before it ever backed
    off, the caller's own `mine` of the `n` chunks took `busy` cycles, so about busy·n/mine.
    A region that took longer waited for a team-mate that the OS ran late or preempted: at
    the join, or at the start (libgomp waits there until the team-mate is back from the
    previous region). Then the loop's next regions run alone: 1, 3, 7,
    ... up to `MAX_BACKOFF` of them while it keeps happening; a region that paid halves the
    next back-off instead (so that on a machine loaded for a while most regions run alone)."""
    b = em.b
    i64 = intrinsics.I64
    one = ir.Constant(i64, 1)
    took = b.sub(_cycles(em), t0)
    mine = b.load(b.gep(chunks, [ir.Constant(i64, 2)], source_etype=i64), typ=i64)
    busy = b.load(b.gep(chunks, [ir.Constant(i64, 3)], source_etype=i64), typ=i64)
    guess = b.udiv(b.mul(busy, b.load(chunks, typ=i64)),
                   b.select(b.icmp_signed(">", mine, ir.Constant(i64, 0)), mine, one))
    known = b.load_atomic(solo, "monotonic", 8, typ=i64)
    alone = b.select(b.icmp_signed(">", known, ir.Constant(i64, 0)), known, guess)
    late = b.icmp_unsigned(">", took, alone)
    old = b.load_atomic(penalty, "monotonic", 8, typ=i64)
    grown = b.select(b.icmp_signed("<", old, ir.Constant(i64, MAX_BACKOFF)),
                     b.add(b.add(old, old), one), old)
    _store_atomic(b, b.select(late, grown, b.lshr(old, one)), penalty)
    _store_atomic(b, b.select(late, grown, ir.Constant(i64, 0)), skip)


def _store_atomic(b: ir.IRBuilder, value: ir.Value, ptr: ir.Value) -> None:
    """`store atomic value, ptr monotonic, align 8` (llvmlite's builder wants a typed
    pointer)."""
    b._insert(ir.instructions.StoreAtomicInstr(b.block, value, ptr, "monotonic", 8))


def _backoff_globals(em: FuncEmitter, name: str) -> tuple[ir.GlobalVariable, ...]:
    """The counters of one parallel loop (internal to its module, so per kernel): regions
    still to run alone, how many the latest back-off was, and the loop's recent cycles when
    it ran alone."""
    out = []
    for what in ("skip", "penalty", "solo"):
        g = ir.GlobalVariable(em.module, intrinsics.I64, name=f"{name}.{what}")
        g.linkage = "internal"
        g.initializer = ir.Constant(intrinsics.I64, 0)
        g.align = 8
        out.append(g)
    return tuple(out)
