"""The leaves of the decision tree as small programs: a healthy training loop, each pathology,
and its fix. `programs(sizes, device)` builds them; each is `run(steps)`. The sizes default to
the H200's (bench_gpu.py); tests pass small ones, and on the CPU only the programs that need no
CUDA (the training loops, the launches, the recompiles, the decode) are built.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function
from torch.utils.data import DataLoader, Dataset

MIB = 2**20


# --8<-- [start:sizes]
@dataclass(frozen=True)
class Sizes:
    batch: int = 32768  # tokens per training step
    d_in: int = 512  # embedding width
    features: int = 2048  # a batch of features instead of token ids: 128 MiB a step in bf16
    d: int = 2048  # MLP width: 6 layers, forward + backward ~4.3 TFLOP, ~7.8 ms on an H200
    layers: int = 6
    vocab: int = 32768
    prep_s: float = 2e-3  # host work per batch in a healthy loop: a quarter of a step
    heavy_prep_s: float = 12e-3  # a data stall: 1.5 steps' worth per batch
    workers: int = 8  # the fix: 12 ms / 8 workers = 1.5 ms per batch, a fifth of a step
    elems: int = 1 << 22  # launches: 4M floats, 16 MiB: ~6 µs a kernel, 64 a step (see below)
    ops: int = 64  # in-place ops per step
    big_elems: int = 1 << 25  # small kernels: a 128 MiB pass per step (the real work) ...
    tensors: int = 256  # ... then 256 small tensors updated one by one
    tensor_elems: int = 8192  # 8192 floats: a grid of tens of blocks, under the 132 SMs
    rows: int = 32768  # recompiles: x [rows + i, width] @ [width, width], twice: ~3.2 ms
    width: int = 4096
    grow_mib: int = 64  # fragmentation: buffers of 64, 128, ... MiB, each freed before the next
    grows: int = 8
    decode_d: int = 16384  # decode: 4 layers of 16384² weights (2 GiB in bf16), ~0.15 ms each
    decode_layers: int = 4
    small_batch: int = 1
    big_batch: int = 512  # intensity ~482 FLOP/byte, over the H200's ridge (~206)


CPU_SIZES = Sizes(batch=4096, d_in=32, features=32, d=128, layers=3, vocab=1000, prep_s=1e-4,
                  heavy_prep_s=0.15, workers=2, elems=4096, ops=8, rows=16, width=64,
                  decode_d=256, decode_layers=2)  # fmt: skip
# Each fix must be GPU-bound with room to spare under the profiler, which multiplies the host's
# time per call (recording shapes and memory). The second H200 run's recompile_fixed timed
# 1.17 ms a step with a sync, ~0.8 ms of it matmuls: ~0.35 ms of host work; its launch share
# of 0.36, if steady, means ~1.2 ms of host a step in the trace. Its batch-1 gemv of 8192²
# took 34 µs on the GPU, of the order of one traced aten::mm on the host. Its 1 MiB
# in-place ops took 1.35 µs each in a graph: a kernel's floor, 86 µs a replay. So:
# launch_fixed replays 64 kernels on 16 MiB (L2-resident: 0.40 ms a replay in the first
# passing run, 36c8bd8, ~6 µs a kernel, against one cudaGraphLaunch); recompile_fixed's
# matmuls take ~3.2 ms a step against ~1.2 ms of traced host work; the decode's gemv reads
# 512 MiB a layer (~0.15 ms) against one traced aten::mm. The pathologies keep their cause,
# the launch leaf narrowly: 64 launches took 0.52 ms a step there (~8 µs of host each; run 2
# had estimated ~14 µs and a 3x margin), 1.28x the replay.
# The training step: 6 layers of 2048² (the first 512 x 2048) over 32768 tokens, forward,
# weight gradients and input gradients but the first layer's: ~4.3 TFLOP, ~6 ms of matmuls
# at ~700 TFLOP/s, ~7.8 ms a step with the elementwise kernels (3.9 ms measured at 16384
# tokens). Its host side must stay the shorter one on a slow host too: the ninth H200 run's
# host ran Python ~1.7x slower than the fast ones and took ~4.7 ms a traced step at 16384
# tokens (3.9 / (1 - 0.173): 1 ms of prep, ~3.7 ms of traced launches), so the healthy loop
# waited for its data (data share 0.173, launch 0.097). Now 2 ms + ~3.7 ms = ~5.7 ms of host
# against ~7.8 ms of GPU work: the host runs ahead unless it is another 1.35x slower. With
# steps of ~7.8 ms the leaves keep their causes:
#   sync: the GPU idles from .item() through the next batch's prep and first launches:
#   ~(2 + 0.3) / 10.1 = 0.23 of a step on a fast host (0.24 in the ninth run, 1 ms of prep);
#   data: 12 ms of prep a batch; even if all of a step's GPU work overlapped it, the GPU
#   would idle (12 - 7.8) / 12 = 0.35 of a step; data_fixed: a batch every 1.5 ms;
#   pageable: the host stages 128 MiB a step while the GPU waits (~21 ms on the ninth run's
#   host: its 14.5 ms steps less ~4 ms of GPU work, twice): ~0.7 of a ~29 ms step; pinned
#   copies it on the GPU (~2.2 ms: its 5.06 ms steps less 3.95, twice), busy GPU time.
# --8<-- [end:sizes]

Program = Callable[[int], object]


def dtype_of(device: torch.device) -> torch.dtype:
    return torch.bfloat16 if device.type == "cuda" else torch.float32


# --8<-- [start:loop]
def spin(seconds: float) -> None:
    """A stand-in for per-batch host work (tokenizing, decoding, augmenting): a timed busy
    loop, so it takes the same time on any host."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        pass


class Tokens(Dataset):
    """Each item is a whole batch of token ids (DataLoader(batch_size=None): no collation)."""

    def __init__(self, batch: int, vocab: int, prep_s: float):
        self.batch, self.vocab, self.prep_s = batch, vocab, prep_s

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, i: int) -> torch.Tensor:
        spin(self.prep_s)
        return torch.randint(self.vocab, (self.batch,), generator=torch.Generator().manual_seed(i))


def token_batches(sz: Sizes, prep_s: float, workers: int, device: torch.device):
    return iter(token_loader(sz, prep_s, workers, device))


def token_loader(sz: Sizes, prep_s: float, workers: int, device: torch.device) -> DataLoader:
    # workers come from a fork server: forked from a process that runs CUDA, CUPTI and a
    # pin-memory thread, a child may inherit a lock some other thread held (Python warns:
    # "This process is multi-threaded, use of fork() may lead to deadlocks in the child");
    # the second H200 run's loader took 40 s to shut down, 8 workers x the 5 s join timeout
    # of DataLoader._shutdown_workers. The fork server is a fresh single-threaded process
    # (Python's multiprocessing docs; the default start method on POSIX since 3.14); its
    # children exit without an interpreter's teardown (2 spawned workers took 1.0 s to shut
    # down on the CPU machine, 2 from the fork server 0.03 s).
    loader = DataLoader(Tokens(sz.batch, sz.vocab, prep_s), batch_size=None,
                        num_workers=workers, pin_memory=device.type == "cuda",
                        persistent_workers=workers > 0,
                        multiprocessing_context="forkserver" if workers else None,
                        prefetch_factor=2 if workers else None)  # fmt: skip
    return loader


def feature_batches(sz: Sizes, pinned: bool, device: torch.device):
    """Batches of features made on the host: pageable, or pinned (page-locked). A ring of 4
    buffers, copies of one random batch: the copy's cost is its bytes, not its values, and
    torch.randn runs on one CPU thread (drawing four 128 MiB batches took 1.7 s on the CPU
    machine, one and three clones 0.5 s)."""
    first = torch.randn(sz.batch, sz.features, dtype=dtype_of(device))
    ring = [first] + [first.clone() for _ in range(3)]
    return itertools.cycle([t.pin_memory() for t in ring] if pinned else ring)


def training_loop(sz: Sizes, device: torch.device, batches, *, tokens: bool = True,
                  read_loss: bool = False) -> Program:  # fmt: skip
    """Forward and backward of an MLP per batch (no optimizer): the GPU work of a training step."""
    torch.manual_seed(0)
    dt = dtype_of(device)
    layers = [nn.Linear(sz.d_in if tokens else sz.features, sz.d, bias=False)]
    for _ in range(sz.layers - 1):
        layers += [nn.ReLU(), nn.Linear(sz.d, sz.d, bias=False)]
    net = nn.Sequential(*layers).to(device, dt)
    emb = nn.Embedding(sz.vocab, sz.d_in).to(device, dt).requires_grad_(False) if tokens else None

    def run(steps: int) -> list:
        losses = []
        for _ in range(steps):
            x = next(batches).to(device, non_blocking=True)
            loss = net(emb(x) if tokens else x).float().square().mean()
            loss.backward()
            net.zero_grad(set_to_none=True)
            losses.append(loss.item() if read_loss else loss.detach())  # .item() waits
        return losses

    return run


# --8<-- [end:loop]


# --8<-- [start:launch]
def launches(sz: Sizes, device: torch.device, graphed: bool) -> Program:
    """64 tiny in-place ops per step: launched one by one from Python, or replayed as one
    CUDA graph (the fix)."""
    x = torch.zeros(sz.elems, device=device)

    def step():
        for _ in range(sz.ops // 2):
            x.mul_(0.5).add_(1.0)

    return _replayed(step) if graphed else _repeat(step)


def small_kernels(sz: Sizes, device: torch.device, flat: bool) -> Program:
    """A large pass, then 256 small tensors updated one kernel each (a grid of fewer blocks
    than the GPU has SMs), or once as one flat tensor (the fix); both replayed as CUDA graphs,
    so launching costs nothing and what remains is the kernels themselves."""
    big = torch.zeros(sz.big_elems, device=device)
    flat_buf = torch.zeros(sz.tensors * sz.tensor_elems, device=device)
    parts = flat_buf.view(sz.tensors, sz.tensor_elems).unbind(0)  # views into one buffer

    def step():
        big.mul_(0.5).add_(1.0)
        for p in [flat_buf] if flat else parts:
            p.add_(1.0)

    return _replayed(step)


def _repeat(step) -> Program:
    def run(steps: int):
        for _ in range(steps):
            step()

    return run


def _replayed(step) -> Program:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up off the default stream, as capture requires
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()

    def run(steps: int):
        for _ in range(steps):
            graph.replay()

    run.graph = graph  # keep it alive
    return run


# --8<-- [end:launch]


# --8<-- [start:recompile]
SPARE = 4096  # lengths rows .. rows + SPARE
_OFFSET = itertools.count()  # one counter per process: Dynamo caches per code object, so a
# second instance of this program must not meet a length an earlier one compiled


def recompiles(sz: Sizes, device: torch.device, dynamic: bool, backend: str = "aot_eager"):
    """Every step sees a sequence length it has not seen before (packing without padding, a
    length curriculum). Compiled with dynamic=False each new length compiles again; the fix,
    dynamic=True, compiles once with a symbolic length. The backend generates no code (the
    post's time budget): the recompiles cost Dynamo's and AOTAutograd's tracing only."""
    dt = dtype_of(device)
    w1, w2 = (torch.randn(sz.width, sz.width, device=device, dtype=dt) / sz.width**0.5
              for _ in range(2))  # fmt: skip
    data = torch.randn(sz.rows + SPARE, sz.width, device=device, dtype=dt)
    f = torch.compile(lambda x: torch.relu(x @ w1) @ w2, dynamic=dynamic, backend=backend)
    limit = torch._dynamo.config.patch(recompile_limit=SPARE, accumulated_recompile_limit=SPARE)

    def run(steps: int):
        out = None  # only the last step's output stays alive: the allocator reuses its blocks
        with limit:  # past the default of 8 Dynamo would give up and run the function eagerly
            for _ in range(steps):
                out = f(data[: sz.rows + next(_OFFSET) % SPARE])
        return out

    run(1)  # the first compile, as any compiled program has
    run.warmup = 1 if dynamic else 0  # every step of the storm compiles: no steady state
    return run


# --8<-- [end:recompile]


# --8<-- [start:fragment]
ALLOC_ENV = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")  # the new name, the old one


def expandable_setting(env=os.environ) -> bool:
    """expandable_segments as this process's allocator reads it at CUDA initialisation."""
    found = {}
    for var in ALLOC_ENV:
        for item in filter(None, env.get(var, "").split(",")):
            key, _, value = item.partition(":")
            if key.strip() == "expandable_segments":
                found[var] = value.strip() == "True"
    if len(set(found.values())) > 1:
        raise ValueError(f"{ALLOC_ENV[0]} and {ALLOC_ENV[1]} disagree on expandable_segments")
    return next(iter(found.values()), False)


def growing(sz: Sizes, device: torch.device, expandable: bool) -> Program:
    """Buffers that grow each step (a batch or KV cache whose size creeps up), each freed before
    the next. Without expandable segments no cached block fits the larger request, so every
    buffer gets a new segment; the fix maps more pages into one segment. The setting is the
    process's, fixed before CUDA starts: each side runs in a fresh process (in_fresh_process),
    never switched inside a live one."""
    if expandable != expandable_setting():
        raise RuntimeError(
            f"growing(expandable={expandable}) in a process started with "
            f"expandable_segments:{not expandable}: use in_fresh_process()"
        )

    def run(steps: int = 1):
        for i in range(1, sz.grows + 1):
            buf = torch.empty(i * sz.grow_mib * MIB, dtype=torch.uint8, device=device)
            del buf

    run.warmup = 0  # the growth into an empty cache is the pathology (fresh.py empties it)
    return run


def peak_growth(run) -> tuple[int, int]:
    """Peak reserved and allocated bytes of one growth, beyond what was there before."""
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base_r, base_a = torch.cuda.memory_reserved(), torch.cuda.memory_allocated()
    run(1)
    out = (torch.cuda.max_memory_reserved() - base_r, torch.cuda.max_memory_allocated() - base_a)
    torch.cuda.empty_cache()
    return out


def in_fresh_process(name: str, folder, sz: Sizes) -> subprocess.Popen:
    """Start `python -m snippets.gpu_sop.fresh` for "fragment" or "fragment_fixed", with the
    allocator setting in the environment before torch starts; it writes <folder>/<name>.json
    (its peak bytes and the path of its trace)."""
    env = {k: v for k, v in os.environ.items() if k not in ALLOC_ENV}
    env[ALLOC_ENV[1]] = f"expandable_segments:{name == 'fragment_fixed'}"
    cmd = [sys.executable, "-m", "snippets.gpu_sop.fresh", name, str(folder),
           str(sz.grow_mib), str(sz.grows)]  # fmt: skip
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return subprocess.Popen(cmd, env=env, cwd=root)  # the repository root: `snippets` imports


def fresh_result(proc: subprocess.Popen, name: str, folder) -> dict:
    if proc.wait(timeout=120):
        raise RuntimeError(f"{' '.join(proc.args)}: exit status {proc.returncode}")
    with open(os.path.join(folder, f"{name}.json"), encoding="utf-8") as f:
        return json.load(f)


# --8<-- [end:fragment]


# --8<-- [start:decode]
def decoding(sz: Sizes, device: torch.device, batch: int, weights=None) -> Program:
    """The matmuls of a decode step: `batch` tokens through 4 square layers."""
    dt = dtype_of(device)
    ws = weights or [torch.randn(sz.decode_d, sz.decode_d, device=device, dtype=dt)
                     / sz.decode_d**0.5 for _ in range(sz.decode_layers)]  # fmt: skip
    x = torch.randn(batch, sz.decode_d, device=device, dtype=dt)

    def forward():
        h = x
        for w in ws:
            h = h @ w.T
        return h

    run = _repeat(forward)
    run.weights, run.forward = ws, forward
    return run


# --8<-- [end:decode]


# --8<-- [start:programs]
FIX = {"launch": "launch_fixed", "small": "small_fixed", "sync": "healthy",
       "pageable": "pinned", "data": "data_fixed", "recompile": "recompile_fixed",
       "fragment": "fragment_fixed", "batch": "batch_fixed"}  # fmt: skip
CPU_OK = {"healthy", "sync", "data", "data_fixed", "launch", "recompile", "recompile_fixed",
          "batch", "batch_fixed"}  # fmt: skip


FRESH = {"fragment", "fragment_fixed"}  # each in its own process: in_fresh_process()


# --8<-- [start:host]
def _proc_stat() -> tuple[int, int] | None:
    """(steal, busy) jiffies of all CPUs since boot from /proc/stat's first line (user nice
    system idle iowait irq softirq steal): busy leaves out idle and iowait, since an idle
    virtual CPU is halted and has nothing to be stolen. None where there is no such file."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    return fields[7], sum(fields) - fields[3] - fields[4]


def python_loop_ms(n: int = 200_000) -> float:
    """A fixed pure-Python loop, timed in this thread's CPU time: how fast the host runs
    Python right now (a slower core, a busy sibling thread, a lower clock all show here)."""
    t0 = time.thread_time()
    total = 0
    for i in range(n):
        total += i
    return (time.thread_time() - t0) * 1e3


@contextmanager
def host_watch(out: dict):
    """Fill `out` with the host's state over the block: `steal`, the share of the CPUs' busy
    time the hypervisor ran something else instead (None where /proc/stat is unreadable);
    `cpu_over_wall`, this thread's CPU time over the wall time (below 1: descheduled, blocked,
    or, where the guest kernel accounts steal, stolen; CUDA's default spinning synchronize
    counts as CPU time); and the fixed Python loop's time before and after."""
    out["loop_ms_before"] = python_loop_ms()
    s0, w0, c0 = _proc_stat(), time.perf_counter(), time.thread_time()
    yield out
    s1, w1, c1 = _proc_stat(), time.perf_counter(), time.thread_time()
    out["steal"] = (s1[0] - s0[0]) / max(1, s1[1] - s0[1]) if s0 and s1 else None
    out["cpu_over_wall"] = (c1 - c0) / max(w1 - w0, 1e-9)
    out["loop_ms_after"] = python_loop_ms()


# --8<-- [end:host]


def programs(sz: Sizes = Sizes(), device: torch.device | str = "cuda", only=None) -> dict:
    """name -> run(steps). `only`: the names to build (default: all that `device` can run in
    this process; the fragment pair runs in fresh processes)."""
    device = torch.device(device)
    cuda = device.type == "cuda"
    want = set(only or ((FIX.keys() | FIX.values()) - FRESH if cuda else CPU_OK))
    tok = {
        "healthy": (sz.prep_s, 0, False),
        "sync": (sz.prep_s, 0, True),
        "data": (sz.heavy_prep_s, 0, False),
        "data_fixed": (sz.heavy_prep_s, sz.workers, False),
    }
    out = {}
    for name, (prep, workers, read) in tok.items():
        if name in want:
            batches = token_batches(sz, prep, workers, device)
            out[name] = training_loop(sz, device, batches, read_loss=read)
    for name, pinned in (("pageable", False), ("pinned", True)):
        if name in want:
            batches = feature_batches(sz, pinned, device)
            out[name] = training_loop(sz, device, batches, tokens=False)
    builders = {
        "launch": lambda: launches(sz, device, graphed=False),
        "launch_fixed": lambda: launches(sz, device, graphed=True),
        "small": lambda: small_kernels(sz, device, flat=False),
        "small_fixed": lambda: small_kernels(sz, device, flat=True),
        "recompile": lambda: recompiles(sz, device, dynamic=False),
        "recompile_fixed": lambda: recompiles(sz, device, dynamic=True),
        "fragment": lambda: growing(sz, device, expandable=False),
        "fragment_fixed": lambda: growing(sz, device, expandable=True),
        "batch": lambda: decoding(sz, device, sz.small_batch),
    }
    for name, build in builders.items():
        if name in want:
            out[name] = build()
    if "batch_fixed" in want:  # the same weights as `batch`
        shared = out["batch"].weights if "batch" in out else None
        out["batch_fixed"] = decoding(sz, device, sz.big_batch, shared)
    return out


def record(progs: dict, path, steps: dict | None = None, default_steps: int = 8,
           cuda: bool | None = None):  # fmt: skip
    """Run each program inside record_function("sop:<name>") in one torch.profiler session
    (CUDA activity too where there is a GPU, unless cuda=False) and export the Chrome trace.
    Right before its range each program runs `run.warmup` steps (default 1) in the session
    but outside the range, and the GPU drains: the range sees the program's steady state.
    The second H200 run's windows held one-off costs of their first step instead: a CUDA
    graph's first replay under a new profiler session (0.1-0.5 ms, growing with the graph's
    nodes), and the cudaMalloc calls after an empty_cache() between programs (which is gone:
    fragmentation() counts from the window's start instead)."""
    cuda = torch.cuda.is_available() if cuda is None else cuda
    acts = [ProfilerActivity.CPU] + [ProfilerActivity.CUDA] * cuda
    if cuda:
        # CUPTI torn down at a session's end and started again under live CUDA graphs crashed
        # (torch/profiler/profiler.py's FIXME; torch sets this itself only for Inductor's
        # graphs): keep it up for the life of the process
        os.environ.setdefault("TEARDOWN_CUPTI", "0")
        torch.cuda.synchronize()
    with profile(activities=acts, record_shapes=True, profile_memory=True) as prof:
        for name, run in progs.items():
            warm = getattr(run, "warmup", 1)
            if warm:
                run(warm)
            if cuda:
                torch.cuda.synchronize()
            with record_function(f"sop:{name}"):
                run((steps or {}).get(name, default_steps))
                if cuda:
                    torch.cuda.synchronize()
    prof.export_chrome_trace(str(path))
    return path


# --8<-- [end:programs]
