"""nfc's own thread pool for parallel loops: a join that never waits for a thread that has
not started.

Generated parallel loops call `nfc_parallel(fn, data, nthreads, chunks)` (see
nfc.codegen.llvm.parallel); `fn(data)` claims chunks of the loop from an atomic counter in
`data` until none is left. This runtime is LLVM IR (text below), compiled once per process
for the JIT (`nfc.codegen.jit._pool`, its functions registered with `llvm.add_symbol`) and
linked as one more object into every shared library (`nfc.codegen.native.link_bytes`, its
symbols hidden: each library has its own pool). It needs only libc (`pthread_create`,
`syscall(SYS_futex)`, `getenv`), and libgomp for the `gomp` backend and the thread count.

The protocol. One region slot in static memory: the function and data pointers, a
generation number `gen` (the word sleeping workers wait on) and a control word `ctl`
(open bit 31, the most helpers allowed in bits 20-30, helpers that joined in 10-19, helpers
still running in 0-9). The caller

1. takes the slot (`busy`, a CAS; when another thread holds it, e.g. two Python threads
   calling kernels at once, it runs `fn(data)` alone, which is correct because chunks are
   claimed),
2. starts missing workers (at most `nthreads - 1`, lazily), writes fn and data, opens the
   region (`ctl`), bumps `gen` and wakes sleeping workers (a futex wake, only if some sleep),
3. runs `fn(data)` itself: claims chunks until none is left,
4. closes the region (an atomic `and` clearing the open bit: from then on nobody joins) and
   waits only for the helpers still running a chunk (spinning `SPIN` pauses, then a futex
   wait on `ctl`, which the last helper to leave a closed region wakes),
5. releases the slot.

A worker that wakes (or spins) and sees a new `gen` joins with a CAS on `ctl` only if the
region is open and not full, and reads fn/data only after joining: the caller waits for it
from then on, so the data (on the caller's stack) stays alive. A worker that comes late
finds the region closed and goes back to waiting without touching anything but the
static words (`late` in the stats). A worker that woke for one region and joins the next one
(the same control word's value again) is fine: it reads that region's fn and data, and that
region's caller waits for it. After a region a worker spins `SPIN` pauses for the
next one, then sleeps on `gen` (futex). Workers are created detached and never exit; after
`fork` the child has none and its regions run on the caller alone.

`NFC_THREADS_BACKEND=gomp` (read once, at the first region; a value starting with `g`:
gomp, with `n`: nfc, anything else: the default) makes `nfc_parallel` call
libgomp's `GOMP_parallel` instead, for comparison; `nfc` (the default, `DEFAULT_BACKEND`) is
this pool. `NFC_THREADS_SPIN` sets the spin count. The thread count is libgomp's
(`omp_get_max_threads`, set by `omp_set_num_threads`, `nfc_set_num_threads`,
`nfc.codegen.jit.set_num_threads`) for both backends.

Test hooks (JIT only; hidden in libraries): `nfc_par_hold(1)` opens the following regions
with room for no helper and makes woken workers wait before they try to join (until
`nfc_par_hold(0)`, when they find those regions closed): a test can check that the caller
finishes a region alone and that late workers leave it alone; `nfc_par_stats(ptr i64[6])`
reads regions run on the pool, chunks run by callers and by helpers, joins, late wake-ups
and workers started.
"""

from __future__ import annotations

import functools

#: The backend when NFC_THREADS_BACKEND is not set: "nfc" (this pool) or "gomp" (libgomp).
DEFAULT_BACKEND = "nfc"
#: Pause instructions a waiting thread spins before it sleeps (a few microseconds).
SPIN = 2000
#: Most helper threads of one region (the control word's fields are 10 bits wide).
MAX_HELPERS = 1000
#: Functions the runtime defines (what the JIT registers).
EXPORTS = ("nfc_parallel", "nfc_par_thread_num", "nfc_par_hold", "nfc_par_stats")

_SYS_FUTEX = {"x86_64": 202, "aarch64": 98}
_PAUSE = {"x86_64": ("llvm.x86.sse2.pause", ""), "aarch64": ("llvm.aarch64.hint", "i32 1")}

_IR = r"""
@busy = internal global i32 0, align 64
@owner = internal global i64 0, align 64
@ctl = internal global i32 0, align 64
@gen = internal global i32 0, align 64
@fnp = internal global ptr null, align 64
@datap = internal global ptr null, align 8
@started = internal global i32 0, align 64
@sleepers = internal global i32 0, align 64
@cwait = internal global i32 0, align 64
@hold = internal global i32 0, align 64
@backend = internal global i32 0, align 64
@spin = internal global i32 {SPIN}, align 4
@stats = internal global [5 x i64] zeroinitializer, align 64
@env.backend = private unnamed_addr constant [20 x i8] c"NFC_THREADS_BACKEND\00"
@env.spin = private unnamed_addr constant [17 x i8] c"NFC_THREADS_SPIN\00"

declare i64 @syscall(i64, ...)
declare i32 @pthread_create(ptr, ptr, ptr, ptr)
declare i32 @pthread_detach(i64)
declare i64 @pthread_self()
declare ptr @getenv(ptr)
declare i32 @atoi(ptr)
declare void @GOMP_parallel(ptr, ptr, i32, i32)
declare i32 @omp_get_thread_num()
declare i64 @llvm.readcyclecounter()

declare void @{PAUSE}({PAUSE_TYPE})

define internal void @pause() alwaysinline nounwind {{
  call void @{PAUSE}({PAUSE_ARG})
  ret void
}}

define internal void @futex_wait(ptr %addr, i32 %val) nounwind {{
  %v = zext i32 %val to i64
  %r = call i64 (i64, ...) @syscall(i64 {FUTEX}, ptr %addr, i64 128, i64 %v, ptr null)
  ret void
}}

define internal void @futex_wake(ptr %addr, i32 %n) nounwind {{
  %v = zext i32 %n to i64
  %r = call i64 (i64, ...) @syscall(i64 {FUTEX}, ptr %addr, i64 129, i64 %v)
  ret void
}}

; the backend (1 nfc, 2 gomp) and the spin count, from the environment, once
define internal i32 @init() nounwind {{
entry:
  %e = call ptr @getenv(ptr @env.backend)
  %has = icmp ne ptr %e, null
  br i1 %has, label %read, label %dflt
read:
  %c = load i8, ptr %e
  %g = icmp eq i8 %c, 103
  %n = icmp eq i8 %c, 110
  %pick = select i1 %g, i32 2, i32 {DEFAULT}
  %pick2 = select i1 %n, i32 1, i32 %pick
  br label %spin
dflt:
  br label %spin
spin:
  %be = phi i32 [ %pick2, %read ], [ {DEFAULT}, %dflt ]
  %s = call ptr @getenv(ptr @env.spin)
  %hs = icmp ne ptr %s, null
  br i1 %hs, label %setspin, label %done
setspin:
  %sv = call i32 @atoi(ptr %s)
  %neg = icmp slt i32 %sv, 0
  %sv2 = select i1 %neg, i32 0, i32 %sv
  store atomic i32 %sv2, ptr @spin monotonic, align 4
  br label %done
done:
  store atomic i32 %be, ptr @backend seq_cst, align 4
  ret i32 %be
}}

define internal i32 @get_backend() nounwind {{
entry:
  %b = load atomic i32, ptr @backend monotonic, align 4
  %z = icmp eq i32 %b, 0
  br i1 %z, label %init, label %done
init:
  %i = call i32 @init()
  br label %done
done:
  %r = phi i32 [ %b, %entry ], [ %i, %init ]
  ret i32 %r
}}

; 0 on the thread running nfc_parallel's region as its caller, else 1 (gomp: its number)
define {VIS} i32 @nfc_par_thread_num() nounwind {{
entry:
  %b = call i32 @get_backend()
  %g = icmp eq i32 %b, 2
  br i1 %g, label %gomp, label %own
gomp:
  %t = call i32 @omp_get_thread_num()
  ret i32 %t
own:
  %self = call i64 @pthread_self()
  %o = load atomic i64, ptr @owner monotonic, align 8
  %is = icmp eq i64 %self, %o
  %r = select i1 %is, i32 0, i32 1
  ret i32 %r
}}

define {VIS} void @nfc_par_hold(i32 %on) nounwind {{
entry:
  store atomic i32 %on, ptr @hold seq_cst, align 4
  %z = icmp eq i32 %on, 0
  br i1 %z, label %wake, label %done
wake:
  call void @futex_wake(ptr @hold, i32 2147483647)
  br label %done
done:
  ret void
}}

define {VIS} void @nfc_par_stats(ptr %out) nounwind {{
entry:
  br label %loop
loop:
  %i = phi i64 [ 0, %entry ], [ %i1, %loop ]
  %src = getelementptr [5 x i64], ptr @stats, i64 0, i64 %i
  %v = load atomic i64, ptr %src monotonic, align 8
  %dst = getelementptr i64, ptr %out, i64 %i
  store i64 %v, ptr %dst
  %i1 = add i64 %i, 1
  %more = icmp ult i64 %i1, 5
  br i1 %more, label %loop, label %done
done:
  %s = load atomic i32, ptr @started monotonic, align 4
  %s64 = sext i32 %s to i64
  %dst5 = getelementptr i64, ptr %out, i64 5
  store i64 %s64, ptr %dst5
  ret void
}}

define internal void @count(i64 %k, i64 %v) nounwind {{
  %p = getelementptr [5 x i64], ptr @stats, i64 0, i64 %k
  %o = atomicrmw add ptr %p, i64 %v monotonic, align 8
  ret void
}}

; a helper thread: wait for a new generation, join the region if it is open and not full,
; run fn(data), leave
define internal ptr @worker(ptr %arg) nounwind {{
entry:
  %g0 = load atomic i32, ptr @gen seq_cst, align 4
  br label %wait
wait:
  %seen = phi i32 [ %g0, %entry ], [ %g, %late ], [ %g, %left ]
  br label %spinning
spinning:
  %i = phi i32 [ 0, %wait ], [ %i1, %spin.more ]
  %gs = load atomic i32, ptr @gen acquire, align 4
  %new.s = icmp ne i32 %gs, %seen
  br i1 %new.s, label %woke, label %spin.check
spin.check:
  %lim = load atomic i32, ptr @spin monotonic, align 4
  %more = icmp slt i32 %i, %lim
  br i1 %more, label %spin.more, label %sleep
spin.more:
  call void @pause()
  %i1 = add i32 %i, 1
  br label %spinning
sleep:
  %sl = atomicrmw add ptr @sleepers, i32 1 seq_cst, align 4
  %gz = load atomic i32, ptr @gen seq_cst, align 4
  %same = icmp eq i32 %gz, %seen
  br i1 %same, label %sleep.wait, label %sleep.done
sleep.wait:
  call void @futex_wait(ptr @gen, i32 %seen)
  br label %sleep.done
sleep.done:
  %sl2 = atomicrmw sub ptr @sleepers, i32 1 seq_cst, align 4
  br label %recheck
recheck:
  %gr = load atomic i32, ptr @gen acquire, align 4
  %new.r = icmp ne i32 %gr, %seen
  br i1 %new.r, label %woke, label %sleep
woke:
  %g = load atomic i32, ptr @gen acquire, align 4
  br label %holding
holding:
  %h = load atomic i32, ptr @hold seq_cst, align 4
  %held = icmp ne i32 %h, 0
  br i1 %held, label %hold.wait, label %join
hold.wait:
  call void @futex_wait(ptr @hold, i32 %h)
  br label %holding
join:
  %c0 = load atomic i32, ptr @ctl seq_cst, align 4
  br label %try
try:
  %c = phi i32 [ %c0, %join ], [ %cseen, %retry ]
  %open = icmp slt i32 %c, 0
  %joined = lshr i32 %c, 10
  %joined1 = and i32 %joined, 1023
  %maxh = lshr i32 %c, 20
  %maxh1 = and i32 %maxh, 2047
  %room = icmp ult i32 %joined1, %maxh1
  %can = and i1 %open, %room
  br i1 %can, label %cas, label %late
cas:
  %cn = add i32 %c, 1025
  %pair = cmpxchg ptr @ctl, i32 %c, i32 %cn seq_cst seq_cst, align 4
  %cseen = extractvalue {{ i32, i1 }} %pair, 0
  %ok = extractvalue {{ i32, i1 }} %pair, 1
  br i1 %ok, label %run, label %retry
retry:
  br label %try
late:
  call void @count(i64 4, i64 1)
  br label %wait
run:
  %f = load atomic ptr, ptr @fnp acquire, align 8
  %d = load atomic ptr, ptr @datap acquire, align 8
  call void %f(ptr %d)
  %old = atomicrmw sub ptr @ctl, i32 1 seq_cst, align 4
  %now = sub i32 %old, 1
  %act = and i32 %now, 1023
  %none = icmp eq i32 %act, 0
  %closed = icmp sge i32 %now, 0
  %last = and i1 %none, %closed
  br i1 %last, label %tell, label %left
tell:
  %cw = load atomic i32, ptr @cwait seq_cst, align 4
  %waits = icmp ne i32 %cw, 0
  br i1 %waits, label %wakecaller, label %left
wakecaller:
  call void @futex_wake(ptr @ctl, i32 1)
  br label %left
left:
  br label %wait
}}

define {VIS} void @nfc_parallel(ptr %fn, ptr %data, i32 %nthr, ptr %chunks) nounwind {{
entry:
  %b = call i32 @get_backend()
  %isg = icmp eq i32 %b, 2
  br i1 %isg, label %gomp, label %take
gomp:
  call void @GOMP_parallel(ptr %fn, ptr %data, i32 %nthr, i32 0)
  ret void
take:
  %tid = alloca i64, align 8
  %pair = cmpxchg ptr @busy, i32 0, i32 1 acquire monotonic, align 4
  %got = extractvalue {{ i32, i1 }} %pair, 1
  br i1 %got, label %owned, label %alone
alone:
  ; another thread holds the slot: run every chunk here (the caller's chunk count and time
  ; are written here since this thread is not the slot's owner)
  %t0 = call i64 @llvm.readcyclecounter()
  call void %fn(ptr %data)
  %t1 = call i64 @llvm.readcyclecounter()
  %nch = load i64, ptr %chunks
  %minep = getelementptr i64, ptr %chunks, i64 2
  store i64 %nch, ptr %minep
  %busyp = getelementptr i64, ptr %chunks, i64 3
  %dt = sub i64 %t1, %t0
  store i64 %dt, ptr %busyp
  ret void
owned:
  %self = call i64 @pthread_self()
  store atomic i64 %self, ptr @owner monotonic, align 8
  %want0 = sub i32 %nthr, 1
  %big = icmp sgt i32 %want0, {MAXH}
  %want = select i1 %big, i32 {MAXH}, i32 %want0
  br label %grow
grow:
  %have = load atomic i32, ptr @started monotonic, align 4
  %short = icmp slt i32 %have, %want
  br i1 %short, label %create, label %ready
create:
  %rc = call i32 @pthread_create(ptr %tid, ptr null, ptr @worker, ptr null)
  %fail = icmp ne i32 %rc, 0
  br i1 %fail, label %ready, label %created
created:
  %tidv = load i64, ptr %tid
  %dr = call i32 @pthread_detach(i64 %tidv)
  %h1 = add i32 %have, 1
  store atomic i32 %h1, ptr @started monotonic, align 4
  br label %grow
ready:
  %have2 = load atomic i32, ptr @started monotonic, align 4
  %few = icmp slt i32 %have2, %want
  %helpers = select i1 %few, i32 %have2, i32 %want
  %none = icmp sle i32 %helpers, 0
  br i1 %none, label %solo, label %open
solo:
  call void %fn(ptr %data)
  store atomic i32 0, ptr @busy release, align 4
  ret void
open:
  store atomic ptr %fn, ptr @fnp monotonic, align 8
  store atomic ptr %data, ptr @datap monotonic, align 8
  ; held (test hook): the region opens and wakes the workers, but none can join
  %hd = load atomic i32, ptr @hold seq_cst, align 4
  %hdz = icmp eq i32 %hd, 0
  %room = select i1 %hdz, i32 %helpers, i32 0
  %mx = shl i32 %room, 20
  %ctl0 = or i32 %mx, -2147483648
  store atomic i32 %ctl0, ptr @ctl seq_cst, align 4
  %og = atomicrmw add ptr @gen, i32 1 seq_cst, align 4
  %sl = load atomic i32, ptr @sleepers seq_cst, align 4
  %anysl = icmp sgt i32 %sl, 0
  br i1 %anysl, label %wake, label %work
wake:
  call void @futex_wake(ptr @gen, i32 %helpers)
  br label %work
work:
  call void %fn(ptr %data)
  %cold = atomicrmw and ptr @ctl, i32 2147483647 seq_cst, align 4
  %cc = and i32 %cold, 2147483647
  br label %waitloop
waitloop:
  %cw = phi i32 [ %cc, %work ], [ %cs, %spinmore ], [ %cz, %slept ]
  %i = phi i32 [ 0, %work ], [ %i1, %spinmore ], [ 0, %slept ]
  %act = and i32 %cw, 1023
  %idle = icmp eq i32 %act, 0
  br i1 %idle, label %done, label %spincheck
spincheck:
  %lim = load atomic i32, ptr @spin monotonic, align 4
  %more = icmp slt i32 %i, %lim
  br i1 %more, label %spinmore, label %sleep
spinmore:
  call void @pause()
  %i1 = add i32 %i, 1
  %cs = load atomic i32, ptr @ctl acquire, align 4
  br label %waitloop
sleep:
  store atomic i32 1, ptr @cwait seq_cst, align 4
  %cq = load atomic i32, ptr @ctl seq_cst, align 4
  %aq = and i32 %cq, 1023
  %still = icmp ne i32 %aq, 0
  br i1 %still, label %fwait, label %slept
fwait:
  call void @futex_wait(ptr @ctl, i32 %cq)
  br label %slept
slept:
  store atomic i32 0, ptr @cwait seq_cst, align 4
  %cz = load atomic i32, ptr @ctl acquire, align 4
  br label %waitloop
done:
  %jn = lshr i32 %cw, 10
  %jn1 = and i32 %jn, 1023
  %jn64 = zext i32 %jn1 to i64
  %total = load i64, ptr %chunks
  %mp = getelementptr i64, ptr %chunks, i64 2
  %mine = load i64, ptr %mp
  %theirs = sub i64 %total, %mine
  call void @count(i64 0, i64 1)
  call void @count(i64 1, i64 %mine)
  call void @count(i64 2, i64 %theirs)
  call void @count(i64 3, i64 %jn64)
  store atomic i32 0, ptr @busy release, align 4
  ret void
}}
"""


def runtime_ir(triple: str, *, hidden: bool) -> str:
    """The runtime's LLVM IR text for `triple` (symbols hidden: for a shared library)."""
    arch = triple.split("-", 1)[0]
    if arch not in _SYS_FUTEX:
        raise NotImplementedError(f"nfc's thread pool does not support {arch}")
    pause, arg = _PAUSE[arch]
    return _IR.format(SPIN=SPIN, PAUSE=pause, PAUSE_TYPE=arg.split(" ")[0], PAUSE_ARG=arg,
                      FUTEX=_SYS_FUTEX[arch],
                      DEFAULT=2 if DEFAULT_BACKEND == "gomp" else 1, MAXH=MAX_HELPERS,
                      VIS="hidden" if hidden else "")


@functools.cache
def runtime_object(triple: str | None = None) -> bytes:
    """The runtime as object code (linked into every shared library): for the host's triple,
    the architecture's baseline CPU (no host-only instructions, whatever the library's target)."""
    from nfc.codegen.cpu import CpuTarget, host_target, target_machine
    from nfc.codegen.jit import new_module, optimize

    generic = CpuTarget("", "", triple or host_target().triple)
    head = str(new_module("nfc_threads", generic))
    ref = optimize(head + runtime_ir(generic.triple, hidden=True), generic)
    return target_machine(generic).emit_object(ref)
