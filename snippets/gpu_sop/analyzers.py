"""One analyzer per leaf of the decision tree. Each is a pure function of a trace window that
returns the share of the window (of time, or for memory of the reserved bytes) its cause
wastes; a leaf is named when its share reaches THRESHOLD.

`python -m snippets.gpu_sop.analyzers trace.json [range-name]` prints every share for a trace
that torch.profiler exported (record it with activities CPU and CUDA, record_shapes=True and
profile_memory=True: the roofline needs the matmuls' shapes, fragmentation the allocator's
totals).
"""

from __future__ import annotations

import bisect
import re
import sys

from snippets.common.hardware import GPU, load_hardware
from snippets.gpu_sop.trace import MEMCPY, Trace, Window

# --8<-- [start:threshold]
# A cause is named when it wastes at least a tenth of the window. Removing a cause that takes
# a share s of the time speeds the loop up by at most 1 / (1 - s): below 0.10 that is at most
# 1.11x. The CPU-side SOP hands over to this page at the same bound (its step 1: a data wait
# under 10 % is not the data's fault), so the two pages split the work at one point.
THRESHOLD = 0.10
# Fragmentation wastes memory, not time. The caching allocator reserves whole segments: 2 MiB
# for requests up to 1 MiB, 20 MiB for requests up to 10 MiB, larger ones rounded up to
# 2 MiB (PyTorch's CUDA memory notes; ezyang's allocator devlog), and expandable segments map
# 20 MiB pages. Less waste than one segment of each pool is the allocator's granularity, not
# fragmentation.
SEGMENT_FLOOR = (20 + 2) * 2**20
# --8<-- [end:threshold]


# --8<-- [start:time]
def launch(w: Window) -> float:
    """CPU-bound launches: the GPU idles because the host issues work too slowly and it is not
    waiting for anything (no sync, data, compile or copy explains the gap)."""
    return w.idle_causes().get("launch", 0.0) / w.length


def sync(w: Window) -> float:
    """Host-device syncs (.item(), print(tensor), torch.cuda.synchronize): the GPU idles after a
    call that waited for it had drained the queue."""
    return w.idle_causes().get("sync", 0.0) / w.length


def data(w: Window) -> float:
    """Data-loader stalls: the GPU idles while the host is inside DataLoader.__next__."""
    return w.idle_causes().get("data", 0.0) / w.length


def recompile(w: Window) -> float:
    """Recompilation storms: the GPU idles while Dynamo compiles (a new shape or guard)."""
    return w.idle_causes().get("recompile", 0.0) / w.length


def pageable(w: Window) -> float:
    """Pageable host-to-device copies: the copies themselves (staged through a bounce buffer)
    and the GPU idle they cause, as a share of the window."""
    copies = sum(a.dur for a in w.gpu if a.cat == "gpu_memcpy"
                 and (m := MEMCPY.match(a.name)) and m["kind"] == "HtoD"
                 and m["src"] == "Pageable")  # fmt: skip
    return (copies + w.idle_causes().get("pageable", 0.0)) / w.length


# --8<-- [end:time]


# --8<-- [start:small]
def small_kernels(w: Window) -> float:
    """Kernels that cannot fill the GPU: a grid of fewer blocks than the GPU has SMs leaves
    SMs idle for the whole kernel. Returns the SM-time lost, sum(dur * (1 - blocks / SMs)) over
    such kernels, as a share of the window: the most that filling them could win back."""
    lost = 0.0
    for k in w.gpu:
        if k.cat != "kernel":
            continue
        device = int(k.args.get("device", 0))
        sms = w.trace.sms.get(device)
        if sms is None:
            raise ValueError(f"{w.trace.source}: kernel {k.name[:60]!r} on device {device}, "
                             "but the trace's deviceProperties give no numSms for it")  # fmt: skip
        x, y, z = [*k.args.get("grid", []), 1, 1, 1][:3]
        lost += k.dur * max(0.0, 1.0 - x * y * z / sms)
    return lost / w.length


# --8<-- [end:small]


# --8<-- [start:roofline]
MATMULS = {"aten::mm": (0, 1), "aten::addmm": (1, 2), "aten::bmm": (0, 1), "aten::baddbmm": (1, 2)}
ITEMSIZE = {"float": 4, "c10::BFloat16": 2, "c10::Half": 2, "double": 8}


def matmul_shape(op) -> tuple[int, int, int, int, int] | None:
    """(batch, m, k, n, itemsize) of a matmul cpu_op from its recorded Input Dims and types."""
    a_at, b_at = MATMULS[op.name]
    dims, types = op.args.get("Input Dims"), op.args.get("Input type")
    if not dims or not types or len(dims) <= b_at or types[a_at] not in ITEMSIZE:
        return None
    a, b = dims[a_at], dims[b_at]
    batch = a[0] if len(a) == 3 else 1
    return batch, a[-2], a[-1], b[-1], ITEMSIZE[types[a_at]]


def intensity(batch, m, k, n, itemsize) -> float:
    """FLOP per byte of C = A @ B: 2mkn FLOPs over reading A and B and writing C once."""
    return 2 * m * k * n / ((m * k + k * n + m * n) * itemsize)


def ridge(gpu: GPU, itemsize: int) -> float:
    """The roofline's ridge point, FLOP per byte: peak FLOP/s over memory bandwidth."""
    tflops = gpu.bf16_dense_tflops if itemsize == 2 else gpu.fp32_tflops
    return tflops * 1e12 / (gpu.hbm_tb_per_s * 1e12)


def gpu_of(w: Window) -> GPU | None:
    """The data/hardware.yaml entry of the trace's GPU, matched by the name CUDA reports."""
    names = set(w.trace.device_names.values())
    for gpu in load_hardware().values():
        if any(n and (gpu.name.startswith(n) or n.startswith(gpu.name)) for n in names):
            return gpu
    return None


def batch_too_small(w: Window) -> float:
    """Inference below the roofline's ridge: a matmul of intensity I < R (the ridge) is bound by
    memory, and its tensor cores are busy at most I / R of its time; a larger batch raises I
    almost for free. Returns sum(dur * (1 - I / R)) over the window's matmul kernels."""
    kernels = [k for k in w.gpu if k.cat == "kernel"]
    gpu = gpu_of(w) if kernels else None
    if gpu is None:  # no GPU work, or a GPU data/hardware.yaml does not list: no roofline
        return 0.0
    ops = sorted((s for s in w.host if s.cat == "cpu_op" and s.name in MATMULS),
                 key=lambda s: s.start)  # fmt: skip
    starts = [o.start for o in ops]
    lost = 0.0
    for k in kernels:
        call = w.calls.get(k.args["correlation"])
        if call is None:
            continue
        at = bisect.bisect_right(starts, call.start)  # the matmul ops begun before the launch
        op = next((o for o in reversed(ops[max(0, at - 4) : at])
                   if o.tid == call.tid and call.end <= o.end), None)  # fmt: skip
        shape = matmul_shape(op) if op else None
        if shape:
            lost += k.dur * max(0.0, 1.0 - intensity(*shape) / ridge(gpu, shape[-1]))
    return lost / w.length


# --8<-- [end:roofline]


# --8<-- [start:fragment]
def fragmentation(w: Window) -> float:
    """Memory fragmentation: while the window ran, the allocator reserved more than the window's
    code ever had allocated at once (cached blocks that no later request fits). Both counted
    from where the window started, the last [memory] event before it: memory reserved and
    cached earlier belongs to the code that ran earlier (the process's other tensors leave
    free space in partly used segments, which a window of tiny allocations would otherwise be
    blamed for; without an earlier event, as in a process's first window, nothing counts as
    cached at the start). Returns (reserved growth - allocated growth) / reserved growth, or
    0 when the waste is under SEGMENT_FLOOR."""
    if not w.memory:
        return 0.0
    if w.before is not None:
        reserved0, allocated0 = w.before["Total Reserved"], w.before["Total Allocated"]
    else:  # the first event's totals less its own bytes (Bytes < 0 for a free)
        allocated0 = w.memory[0]["Total Allocated"] - w.memory[0].get("Bytes", 0)
        reserved0 = allocated0
    reserved = max(m["Total Reserved"] for m in w.memory) - reserved0
    allocated = max(0, max(m["Total Allocated"] for m in w.memory) - allocated0)
    waste = reserved - allocated
    return waste / reserved if waste >= SEGMENT_FLOOR else 0.0


# --8<-- [end:fragment]


# --8<-- [start:all]
ANALYZERS = {
    "launch": launch,
    "small": small_kernels,
    "sync": sync,
    "pageable": pageable,
    "data": data,
    "recompile": recompile,
    "fragment": fragmentation,
    "batch": batch_too_small,
}


def diagnose(w: Window) -> dict[str, float]:
    """Every analyzer's share for one window."""
    return {name: f(w) for name, f in ANALYZERS.items()}


def named(shares: dict[str, float]) -> list[str]:
    """The leaves a window's shares name, largest first."""
    return sorted((k for k, v in shares.items() if v >= THRESHOLD), key=lambda k: -shares[k])


# --8<-- [end:all]


def missing_fields(windows: dict[str, Window], decode_d: int) -> list[str]:
    """What the analyzers rely on and a real GPU trace lacks, per program window (an empty list:
    all there). bench_gpu.py checks its own trace with it, so a renamed Kineto field fails the
    run with its name, rather than as an off-diagonal confusion matrix."""
    out = []
    trace = next(iter(windows.values())).trace
    if not trace.sms or not all(n > 0 for n in trace.sms.values()):
        out.append("no numSms in deviceProperties")
    if gpu_of(windows["batch"]) is None:
        out.append(f"GPU {sorted(trace.device_names.values())} not in data/hardware.yaml")
    small = windows["small"]
    grids = [k.args.get("grid") for k in small.gpu if k.cat == "kernel"]
    if not grids or None in grids:
        out.append("small: kernels without a grid")
    elif min(x * y * z for x, y, z in grids) >= min(trace.sms.values() or [0]):
        out.append("small: no kernel with fewer blocks than SMs")
    if not all(k.args.get("correlation") in small.calls for k in small.gpu):
        out.append("small: graph kernels not linked to their cudaGraphLaunch")
    copies = {a.name for a in windows["pageable"].gpu if a.cat == "gpu_memcpy"}
    if "Memcpy HtoD (Pageable -> Device)" not in copies:
        out.append(f"pageable: no 'Memcpy HtoD (Pageable -> Device)' among {sorted(copies)}")
    if not windows["sync"].blocking:
        out.append("sync: no synchronizing call")
    if not windows["data"].layers[0][1]:
        out.append("data: no DataLoader.__next__ range")
    if not windows["recompile"].layers[1][1]:
        out.append("recompile: no Dynamo compile range")
    if not windows["fragment"].memory:
        out.append("fragment: no [memory] events")
    ops = [o for o in windows["batch"].host if o.name in MATMULS]
    if not ops or matmul_shape(ops[0])[1:4] != (1, decode_d, decode_d):
        out.append(f"batch: no matmul of shape 1 x {decode_d} x {decode_d}")
    return out


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m snippets.gpu_sop.analyzers TRACE.json [RANGE ... | --each]",
              file=sys.stderr)  # fmt: skip
        return 2
    trace = Trace.load(argv[0])
    names = argv[1:] or [None]
    if argv[1:] == ["--each"]:
        names = [n for n in trace.annotations() if re.match(r"sop:|ProfilerStep#", n)]
    for name in names:
        shares = diagnose(trace.window(name))
        cells = " ".join(f"{k}={v:.2f}" for k, v in shares.items())
        print(f"{name or 'whole trace'}: {', '.join(named(shares)) or 'nothing named'} | {cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
