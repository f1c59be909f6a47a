"""Synthetic GPU traces: what torch.profiler would record for each program of programs.py, built
by hand so that the analyzers can be tested without a GPU. They are simulations, not
measurements: a host thread advances through its calls, and a GPU activity starts when its
launch has reached the GPU (LATENCY after the call) and the GPU is free. The events carry the
fields a real Chrome trace has (trace.py names them); the costs in microseconds are assumptions
of the size of the H200 machine's, stated beside each program.
"""

from __future__ import annotations

import json
import sys
from contextlib import contextmanager
from pathlib import Path

LATENCY = 4.0  # µs from a launch call to its kernel's start on an idle GPU (assumed)
LEAD_IN = 50.0  # µs of Python from entering a range to its first CUDA call (assumed)
MIB = 2**20
BF16 = "c10::BFloat16"


# --8<-- [start:sim]
class Sim:
    """One host thread and one GPU stream, written as Chrome trace events."""

    def __init__(self, device: str = "NVIDIA H200", sms: int = 132):
        self.t = 0.0  # the host's clock, µs
        self.free = 0.0  # when the GPU's stream is done with what it was given
        self.corr = 0
        self.events: list[dict] = []
        self.props = [{"id": 0, "name": device, "numSms": sms}]
        self.allocated = self.reserved = 0

    def _x(self, cat, name, start, end, tid=1, **args):
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": 1 if tid == 1 else 0,
                            "tid": tid, "ts": start, "dur": end - start, "args": args})  # fmt: skip

    @contextmanager
    def span(self, name: str, cat: str = "user_annotation", **args):
        start = self.t
        yield
        self._x(cat, name, start, self.t, **args)

    def host(self, us: float, name: str | None = None):
        """Host work that launches nothing (Python, a data loader's CPU work)."""
        start, self.t = self.t, self.t + us
        if name:
            self._x("user_annotation", name, start, self.t)

    def _call(self, api: str, us: float) -> int:
        self.corr += 1
        self._x("cuda_runtime", api, self.t, self.t + us, correlation=self.corr, cbid=0)
        self.t += us
        return self.corr

    def _on_gpu(self, cat, name, corr, us, earliest, **args) -> float:
        start = max(self.free, earliest)
        self._x(cat, name, start, start + us, tid=7, correlation=corr, device=0, stream=7, **args)
        self.free = start + us
        return start

    def kernel(self, us: float, grid=(1024, 1, 1), name: str = "elementwise_kernel",
               cpu_us: float = 6.0, op: tuple | None = None) -> None:  # fmt: skip
        """One kernel; `op` = (aten name, Input Dims, Input type): the operator around it."""
        start = self.t
        corr = self._call("cudaLaunchKernel", cpu_us)
        self._on_gpu("kernel", name, corr, us, self.t + LATENCY, grid=list(grid),
                     block=[128, 1, 1])  # fmt: skip
        if op:
            self._x("cpu_op", op[0], start - 1.0, self.t + 1.0, **{"Input Dims": op[1],
                    "Input type": op[2]})  # fmt: skip

    def graph(self, kernels: list[tuple[float, tuple]], cpu_us: float = 12.0, gap: float = 1.0):
        """A CUDA graph replay: one call launches every (us, grid) kernel, `gap` apart."""
        corr = self._call("cudaGraphLaunch", cpu_us)
        earliest = self.t + LATENCY
        for us, grid in kernels:
            self._on_gpu("kernel", "graph_kernel", corr, us, earliest, grid=list(grid),
                         block=[128, 1, 1])  # fmt: skip
            earliest = self.free + gap

    def copy(self, kind: str, src: str, nbytes: int, us: float, cpu_us: float = 5.0) -> None:
        """A memcpy. From pageable memory the call returns only when the data has been staged,
        after the stream reached the copy (CUDA's API sync behavior); to the host it is waited
        for with a sync (what .item() does); from pinned memory the call returns at once."""
        dst = "Device" if kind == "HtoD" else "Pinned"
        if kind == "HtoD" and src == "Pageable":
            corr, start = self.corr + 1, self.t
            self.corr = corr
            begin = self._on_gpu("gpu_memcpy", f"Memcpy {kind} ({src} -> {dst})", corr, us,
                                 self.t + LATENCY, bytes=nbytes)  # fmt: skip
            self.t = begin + us
            self._x("cuda_runtime", "cudaMemcpyAsync", start, self.t, correlation=corr, cbid=0)
            return
        corr = self._call("cudaMemcpyAsync", cpu_us)
        self._on_gpu("gpu_memcpy", f"Memcpy {kind} ({src} -> {dst})", corr, us,
                     self.t + LATENCY, bytes=nbytes)  # fmt: skip

    def sync(self, api: str = "cudaStreamSynchronize") -> None:
        self.corr += 1
        start, self.t = self.t, max(self.t, self.free) + 2.0
        self._x("cuda_runtime", api, start, self.t, correlation=self.corr, cbid=0)

    def memory(self, delta: int, fresh: bool = False, page: int = 0) -> None:
        """An allocation (delta > 0) or free (< 0). The allocator reuses cached memory unless
        `fresh` (a new segment for this request alone); `page`: segments grow in such pages."""
        self.allocated += delta
        if fresh and delta > 0:
            self.reserved += delta
        elif page:
            self.reserved = max(self.reserved, -(-self.allocated // page) * page)
        else:
            self.reserved = max(self.reserved, self.allocated)
        self.events.append({"ph": "i", "cat": "cpu_instant_event", "name": "[memory]",
                            "pid": 1, "tid": 1, "ts": self.t, "s": "t",
                            "args": {"Device Type": 1, "Device Id": 0, "Bytes": delta,
                                     "Total Allocated": self.allocated,
                                     "Total Reserved": self.reserved}})  # fmt: skip

    def trace(self) -> dict:
        return {"traceEvents": self.events, "deviceProperties": self.props}


# --8<-- [end:sim]


# --8<-- [start:programs]
MM = "aten::mm"
D, ROWS = 2048, 32768  # the training step's width and tokens per step, as in programs.py


def train_step(s: Sim, layers: int = 6) -> None:
    """Forward and backward of the 6-layer MLP: 17 matmuls of ~340 µs and 20 elementwise
    kernels of ~20 µs on the GPU (about 6 ms), ~8 µs of host time per launch."""
    mm, act = (MM, [[ROWS, D], [D, D]], [BF16, BF16]), ROWS * D * 2
    gemm = {"grid": (128, 16, 1), "name": "sm90_gemm", "cpu_us": 8.0, "op": mm}
    s.copy("HtoD", "Pinned", ROWS * 8, 6.0)  # the token ids
    for _ in range(layers):  # forward: activations allocated (cached blocks after step one)
        s.memory(act)
        s.kernel(340.0, **gemm)
    for _ in range(2 * layers - 1):  # backward: two matmuls a layer but the first's input
        s.kernel(340.0, **gemm)
    for _ in range(layers):
        s.memory(-act)
    for _ in range(20):
        s.kernel(20.0, grid=(8192, 1, 1), cpu_us=8.0)


def training(s: Sim, steps=16, prep=2000.0, loader="_SingleProcessDataLoaderIter",
             read_loss=False, features=None) -> None:  # fmt: skip
    for _ in range(steps):
        with s.span(f"enumerate(DataLoader)#{loader}.__next__"):
            s.host(prep)
        if features:  # (memory kind, bytes, µs): a batch of features instead of token ids
            s.copy("HtoD", *features)
        train_step(s)
        if read_loss:  # loss.item(): a 4-byte copy to a pinned buffer, then a sync
            s.copy("DtoH", "Device", 4, 2.0)
            s.sync()
        s.host(30.0)  # the loop's own Python


def launch_ops(s: Sim, graphed: bool, steps=16, ops=64) -> None:
    for _ in range(steps):  # 64 in-place ops on 4M floats: 5 µs each on the GPU; launched one
        if graphed:  # by one, 14 µs of host each (0.89 ms for 64, as the H200 timed them)
            s.graph([(5.0, (8192, 1, 1))] * ops)
        else:
            for _ in range(ops):
                s.kernel(5.0, grid=(8192, 1, 1), cpu_us=14.0)


def small_ops(s: Sim, flat: bool, steps=16, tensors=256) -> None:
    for _ in range(steps):  # a large elementwise pass, then 256 tensors of 8192 floats updated
        big = [(160.0, (65536, 1, 1))]  # one by one (16 blocks each), or as one flat tensor
        s.graph(big + ([(6.0, (4096, 1, 1))] if flat else [(2.0, (16, 1, 1))] * tensors))


def compiled(s: Sim, recompiles: bool, steps=8) -> None:
    dims = [[32768, 4096], [4096, 4096]]
    for _ in range(steps):
        if recompiles:  # every step a new shape: Dynamo traces again (~30 ms of host time)
            with s.span("_compile.compile_inner (dynamo_timed)"):
                s.host(30000.0)
        s.host(80.0)  # guards and the compiled wrapper
        for _ in range(2):  # 2 x 32768 x 4096² x 2 FLOP at ~700 TFLOP/s
            s.kernel(1600.0, grid=(128, 32, 1), name="sm90_gemm", op=(MM, dims, [BF16, BF16]))


def growing(s: Sim, expandable: bool, grows=8, mib=64) -> None:
    for i in range(1, grows + 1):  # buffers of 64, 128, ... MiB, each freed before the next
        size = i * mib * MIB
        if expandable:  # one segment that maps 20 MiB pages as it grows
            s.memory(size, page=20 * MIB)
        else:  # no cached block is large enough: a new segment each time
            s.memory(size, fresh=True)
        s.memory(-size)
        s.host(200.0)


def decode(s: Sim, batch: int, steps=8, layers=4, d=16384) -> None:
    gemv_us = 2 * d * d / 3.6e6  # weights read at ~3.6 TB/s: ~150 µs per layer
    us = max(gemv_us, 2 * batch * d * d / 700e6)  # or ~700 TFLOP/s when compute-bound
    out = batch * d * 2  # each layer's output, freed when the next one's is made
    for _ in range(steps):
        for _ in range(layers):
            s.memory(out)
            s.kernel(us, grid=(256, 1, 1), name="gemv_or_gemm", cpu_us=10.0,
                     op=(MM, [[batch, d], [d, d]], [BF16, BF16]))  # fmt: skip
            s.memory(-out)


SIMULATED = {
    "healthy": lambda s: training(s),
    "sync": lambda s: training(s, read_loss=True),
    "data": lambda s: training(s, prep=12000.0),
    "data_fixed": lambda s: training(s, prep=50.0, loader="_MultiProcessingDataLoaderIter"),
    "pageable": lambda s: training(s, prep=0.0, features=("Pageable", 128 * MIB, 8000.0)),
    "pinned": lambda s: training(s, prep=0.0, features=("Pinned", 128 * MIB, 2600.0)),
    "launch": lambda s: launch_ops(s, graphed=False),
    "launch_fixed": lambda s: launch_ops(s, graphed=True),
    "small": lambda s: small_ops(s, flat=False),
    "small_fixed": lambda s: small_ops(s, flat=True),
    "recompile": lambda s: compiled(s, recompiles=True),
    "recompile_fixed": lambda s: compiled(s, recompiles=False, steps=16),
    "fragment": lambda s: growing(s, expandable=False),
    "fragment_fixed": lambda s: growing(s, expandable=True),
    "batch": lambda s: decode(s, batch=1),
    "batch_fixed": lambda s: decode(s, batch=512),
}


PERSISTENT = 1500 * MIB  # every program's weights and buffers, allocated before the session
CACHED = 230 * MIB  # free space in their partly used segments: 13 % of what is reserved, as
# the second H200 run's decode window saw (reserved - allocated of the whole process)


def simulated_trace(names=tuple(SIMULATED)) -> dict:
    """One trace holding every program in turn, each inside record_function("sop:<name>") and
    ending with a synchronize, as bench_gpu.py records them (its warm-up steps, outside the
    ranges, are left out: the simulation has no first-step costs to warm up)."""
    s = Sim()
    s.memory(PERSISTENT, fresh=True)
    s.reserved += CACHED
    s.memory(0)  # the totals the first window starts from
    s.host(1000.0)
    for name in names:
        with s.span(f"sop:{name}"):
            s.host(LEAD_IN)
            SIMULATED[name](s)
            s.sync("cudaDeviceSynchronize")
        s.host(1000.0)
    return s.trace()


# --8<-- [end:programs]

if __name__ == "__main__":  # python -m snippets.gpu_sop.synthetic OUT.json [PROGRAM ...]
    Path(sys.argv[1]).write_text(json.dumps(simulated_trace(sys.argv[2:] or tuple(SIMULATED))))
