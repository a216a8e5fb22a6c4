"""Issue 13, item 1 (defect 1) from Python: threads sharing a context.

ctypes releases the GIL around qva_attention, so Python threads run the
library's calls at the same time.  The library serializes the calls on one
context (include/qvattn.h, "Threads"); here two Python threads share one
context -- an explicit qvattn.Context, and the default one that
qvattn.attention(ctx=None) uses -- or use one each, and every output and
LSE must equal, bit for bit, the same calls made serially on a fresh
context.  Each thread runs the stateful methods on layers of its own:
vc8+expcast and vc4 (V-Smooth state per layer and head: steps that group,
reuse and run plain), draft (the partition cache, a dense warm-up step)
and sage8.  Each step starts with a new vc8 layer of many heads, so the
context's V-Smooth table grows (past 64 and 128 entries) while the other
thread uses it: the use-after-free of issue 13 against a library without
the lock.

numpy inputs (CI has no torch); the torch op's default context is tested
where torch is installed.
"""
import threading

import numpy as np
import pytest

try:
    import qvattn
    from qvattn import _ffi
except OSError as e:  # library not built
    pytest.skip(f"libqvattn not loadable: {e}", allow_module_level=True)

NTHREADS = 2
NUM_STEPS = 8  # of the V-Smooth schedule; steps 0, 1, 2 = group, reuse, plain
STEPS = 3
ROUNDS = 2     # each round on a reset context: the table grows again
D = 64
H_BULK = 24    # a new layer of 24 heads each step: 2 threads x (3 x 24 + 2)
               # V-Smooth entries, the table reallocates at 64 and at 128
DRAFT = dict(grid=(3, 4, 8), prefix=3, options={"draft.dense_warmup_steps": 1})


def _data(seed, H, N):
    rng = np.random.default_rng(seed)
    shape = (1, H, N, D)
    q = 2.0 * rng.standard_normal(shape)
    k = 2.0 * rng.standard_normal(shape) + 0.5
    v = rng.standard_normal(shape) + 0.25
    return tuple(x.astype(np.float32) for x in (q, k, v))


def _calls(t):
    """Thread t's calls in order: (method, layer, step, q, k, v, kwargs).
    Thread t owns layers 100t .. 100t + 5."""
    layer = 100 * t
    seed = 1000 * (t + 1)
    calls = []
    for s in range(STEPS):
        seed += 10
        calls += [("vc8+expcast", layer + 3 + s, s, *_data(seed, H_BULK, 48), {}),
                  ("vc8+expcast", layer, s, *_data(seed + 1, 1, 130), {}),
                  ("vc4", layer + 1, s, *_data(seed + 2, 1, 130), {}),
                  ("sage8", layer + 2, s, *_data(seed + 3, 2, 48), {}),
                  ("draft@50/0/25/25", layer + 2, s, *_data(seed + 4, 2, 99), DRAFT)]
    return calls


CALLS = [_calls(t) for t in range(NTHREADS)]


def _run(calls, ctx, to_input=None, start=None):
    """The calls on ctx (None: the default context); [(out, lse)] as numpy."""
    if start is not None:
        start.wait()
    res = []
    for method, layer, step, q, k, v, kw in calls:
        if to_input is not None:
            q, k, v = (to_input(x) for x in (q, k, v))
        out, lse = qvattn.attention(q, k, v, method=method, layer=layer, step=step,
                                    num_steps=NUM_STEPS, ctx=ctx, return_lse=True, **kw)
        res.append((np.asarray(out), np.asarray(lse)))
    return res


def _serial():
    with qvattn.Context() as ctx:
        return [_run(calls, ctx) for calls in CALLS]


_SERIAL = []


def serial():
    if not _SERIAL:
        _SERIAL.append(_serial())
    return _SERIAL[0]


def _threaded(contexts, to_input=None):
    """One thread per CALLS entry, thread t on contexts[t], started together."""
    start = threading.Barrier(NTHREADS)
    results, errors = [None] * NTHREADS, []

    def work(t):
        try:
            results[t] = _run(CALLS[t], contexts[t], to_input, start)
        except BaseException as e:  # reported by the main thread
            errors.append(e)
            start.abort()

    threads = [threading.Thread(target=work, args=(t,)) for t in range(NTHREADS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise errors[0]
    return results


def _assert_bits_equal(got, want):
    for t in range(NTHREADS):
        for i, ((o, lse), (o0, lse0)) in enumerate(zip(got[t], want[t])):
            method, layer, step = CALLS[t][i][:3]
            what = f"thread {t}, call {i} ({method}, layer {layer}, step {step})"
            assert o.dtype == o0.dtype and o.tobytes() == o0.tobytes(), what + ": out"
            assert lse.tobytes() == lse0.tobytes(), what + ": lse"


@pytest.fixture
def fresh_default_context(monkeypatch):
    """qvattn's default contexts replaced by an empty table for the test
    (state of other tests' layers stays out); closed afterwards."""
    table = {}
    monkeypatch.setattr(_ffi, "_default_contexts", table)
    yield table
    for c in table.values():
        c.close()


@pytest.mark.parametrize("sharing", ["one-context", "default-context", "separate"])
def test_threads_equal_serial(sharing, fresh_default_context):
    want = serial()
    for _ in range(ROUNDS):
        if sharing == "one-context":
            with qvattn.Context() as ctx:
                got = _threaded([ctx] * NTHREADS)
        elif sharing == "separate":
            ctxs = [qvattn.Context() for _ in range(NTHREADS)]
            try:
                got = _threaded(ctxs)
            finally:
                for c in ctxs:
                    c.close()
        else:
            got = _threaded([None] * NTHREADS)
            assert len(fresh_default_context) == 1  # one default CPU context, shared
            fresh_default_context.popitem()[1].close()  # the next round: a fresh one
        _assert_bits_equal(got, want)


def test_torch_threads_on_the_default_context_equal_serial(fresh_default_context):
    """The torch op's ctx=None path (ops._context -> default_context)."""
    torch = pytest.importorskip("torch")
    want = serial()
    for _ in range(ROUNDS):
        got = _threaded([None] * NTHREADS, to_input=torch.from_numpy)
        assert len(fresh_default_context) == 1
        fresh_default_context.popitem()[1].close()
        _assert_bits_equal(got, want)


def test_default_context_is_created_once(fresh_default_context, monkeypatch):
    """Threads asking for the default context at the same time get one
    context: two would split the layers' state between them."""
    made = []

    class SlowContext(_ffi.Context):  # widens the window between lookup and store
        def __init__(self, *a, **kw):
            made.append(self)
            threading.Event().wait(0.05)
            super().__init__(*a, **kw)

    monkeypatch.setattr(_ffi, "Context", SlowContext)
    n = 4
    start, got = threading.Barrier(n), [None] * n

    def ask(i):
        start.wait()
        got[i] = _ffi.default_context(_ffi.QVA_DEVICE_CPU)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    try:
        assert len(made) == 1 and all(c is got[0] for c in got), \
            f"{len(made)} default contexts made for {n} threads"
    finally:
        for c in made:
            c.close()
