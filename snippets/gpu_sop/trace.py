"""A torch.profiler trace, read back from the Chrome trace JSON that `prof.export_chrome_trace`
writes, and the one computation every time-based analyzer shares: where the GPU went idle, and
what the host was doing instead.

The fields read are the ones Kineto writes (pytorch/kineto, libkineto/src/output_json.cpp and
CuptiActivity.h): complete events (`ph: X`, `ts` and `dur` in microseconds) of categories
`kernel`, `gpu_memcpy`, `gpu_memset` (the GPU's work, with `args.correlation`; kernels also with
`grid`), `cuda_runtime` / `cuda_driver` (the host's CUDA calls, with the same correlation),
`cpu_op` (aten operators, with `Input Dims` and `Input type` when recorded with shapes) and
`user_annotation` (record_function ranges: the DataLoader's `__next__`, Dynamo's compile
phases, our own program names); instant events `[memory]` (with profile_memory=True: the
allocator's `Total Allocated` and `Total Reserved` after each allocation or free); and the
top-level `deviceProperties` (`numSms` per GPU).
"""

from __future__ import annotations

import bisect
import gzip
import json
import re
from collections import defaultdict
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
CALL_CATS = {"cuda_runtime", "cuda_driver"}
SYNC_CALLS = {"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
              "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize"}  # fmt: skip
DATA_PREFIX = "enumerate(DataLoader)#"  # torch/utils/data/dataloader.py: _profile_name
COMPILE_NAMES = ("_compile.compile_inner", "entire_frame_compile")  # torch/_dynamo: dynamo_timed
MEMCPY = re.compile(r"Memcpy (?P<kind>\w+) \((?P<src>[\w ]+) -> (?P<dst>[\w ]+)\)")
CUDA_DEVICE_TYPE = 1  # c10::DeviceType::CUDA, in a [memory] event's "Device Type"


@dataclass(frozen=True, slots=True)
class Span:
    name: str
    cat: str
    start: float  # microseconds
    end: float
    tid: object
    args: dict

    @property
    def dur(self) -> float:
        return self.end - self.start


@dataclass(frozen=True)
class Gap:
    """The GPU idle from `start` to `end`, before activity `next`; `prev` ended at `start`
    (None: the window's first activity). cpu_caused: the host issued `next` too late."""

    start: float
    end: float
    prev: Span | None
    next: Span | None
    cpu_caused: bool


class TraceError(ValueError):
    """A trace that cannot be read; the message names the file and the event."""


def _name(call: str) -> str:
    """cudaLaunchKernel_v7000 / cudaMemcpyAsync_ptsz -> the API's plain name."""
    return re.sub(r"(_v\d+|_ptsz|_ptds)+$", "", call)


@dataclass
class Trace:
    spans: list[Span]
    memory: list[tuple[float, dict]]  # (ts, args) of the [memory] instant events
    sms: dict[int, int]  # device id -> SM count (deviceProperties)
    device_names: dict[int, str]
    source: str = "<trace>"

    @classmethod
    def load(cls, trace: str | Path | dict, source: str | None = None) -> Trace:
        """A Chrome trace from a file (.json or .json.gz) or an already-parsed dict."""
        if isinstance(trace, dict):
            data, source = trace, source or "<trace>"
        else:
            path = Path(trace)
            source = source or str(path)
            opener = gzip.open if path.suffix == ".gz" else open
            try:
                with opener(path, "rt", encoding="utf-8") as f:
                    data = json.load(f)
            except (OSError, json.JSONDecodeError) as exc:
                raise TraceError(f"{source}: not a Chrome trace JSON file: {exc}") from None
        events = data.get("traceEvents") if isinstance(data, dict) else None
        if not isinstance(events, list):
            raise TraceError(f"{source}: no 'traceEvents' list (write the trace with "
                             "torch.profiler's prof.export_chrome_trace(path))")  # fmt: skip
        spans, memory = [], []
        for i, e in enumerate(events):
            if not isinstance(e, dict):
                raise TraceError(f"{source}: traceEvents[{i}] is not an object: {e!r:.80}")
            ph, name = e.get("ph"), e.get("name")
            if ph == "X":
                ts, dur = e.get("ts"), e.get("dur")
                if not isinstance(ts, int | float) or not isinstance(dur, int | float):
                    raise TraceError(f"{source}: traceEvents[{i}] ({name!r}): a complete event "
                                     f"needs numeric ts and dur, got {ts!r}, {dur!r}")  # fmt: skip
                args = e.get("args") or {}
                cat = e.get("cat", "")
                if cat in GPU_CATS | CALL_CATS and "correlation" not in args:
                    raise TraceError(f"{source}: traceEvents[{i}] ({name!r}): a {cat} event "
                                     "without args.correlation")  # fmt: skip
                spans.append(Span(str(name), cat, float(ts), float(ts) + float(dur),
                                  e.get("tid"), args))  # fmt: skip
            elif ph == "i" and name == "[memory]":
                args = e.get("args") or {}
                if not {"Total Allocated", "Total Reserved"} <= set(args):
                    raise TraceError(f"{source}: traceEvents[{i}]: a [memory] event without "
                                     "'Total Allocated' and 'Total Reserved'")  # fmt: skip
                memory.append((float(e["ts"]), args))
        props = data.get("deviceProperties") or []
        sms = {int(p["id"]): int(p["numSms"]) for p in props if "numSms" in p}
        names = {int(p["id"]): str(p.get("name", "")) for p in props if "id" in p}
        spans.sort(key=lambda s: (s.start, -s.end))
        memory.sort(key=lambda m: m[0])
        return cls(spans, memory, sms, names, source)

    def annotations(self) -> list[str]:
        return sorted({s.name for s in self.spans if s.cat == "user_annotation"})

    def window(self, name: str | None = None) -> Window:
        """The part of the trace a record_function(name) range covers, with the GPU work its
        calls launched (matched by correlation, so GPU work that outlives the range counts; GPU
        work whose correlation matches no call at all counts where it starts inside the range);
        None: the whole trace."""
        calls = [s for s in self.spans if s.cat in CALL_CATS]
        if name is None:
            hosts = [s for s in self.spans if s.cat not in GPU_CATS]
            if not hosts:
                raise TraceError(f"{self.source}: no host events")
            start, end = min(s.start for s in hosts), max(s.end for s in hosts)
        else:
            found = [s for s in self.spans if s.cat == "user_annotation" and s.name == name]
            if len(found) != 1:
                known = ", ".join(self.annotations()[:12]) or "none"
                raise TraceError(f"{self.source}: {len(found)} ranges named {name!r}, need one "
                                 f"(record_function ranges here: {known})")  # fmt: skip
            start, end = found[0].start, found[0].end
        known = {s.args["correlation"] for s in calls}
        calls = {s.args["correlation"]: s for s in calls if start <= s.start <= end}
        gpu = [s for s in self.spans if s.cat in GPU_CATS and (s.args["correlation"] in calls or (
               s.args["correlation"] not in known and start <= s.start <= end))]  # fmt: skip
        host = [s for s in self.spans
                if s.cat not in GPU_CATS and s.start >= start and s.end <= end]  # fmt: skip
        cuda_memory = [(ts, a) for ts, a in self.memory if a.get("Device Type") == CUDA_DEVICE_TYPE]
        memory = [a for ts, a in cuda_memory if start <= ts <= end]
        before = next((a for ts, a in reversed(cuda_memory) if ts < start), None)
        end = max([end] + [s.end for s in gpu])
        return Window(self, name, start, end, host, calls, gpu, memory, before)


def merge(intervals) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


@dataclass
class Window:
    trace: Trace
    name: str | None
    start: float
    end: float
    host: list[Span]  # host-side events inside the range (ops, annotations, CUDA calls)
    calls: dict[int, Span]  # correlation -> the CUDA call that launched it
    gpu: list[Span]  # kernels, copies, memsets those calls launched, by start
    memory: list[dict]  # CUDA [memory] events' args, in time order
    before: dict | None = None  # the last CUDA [memory] event's args before the window
    _cache: dict = field(default_factory=dict, repr=False)

    @property
    def length(self) -> float:
        return self.end - self.start

    def copy_of(self, call: Span) -> tuple[str, str, str] | None:
        """(kind, src, dst) of the memcpy a call launched, e.g. ("HtoD", "Pageable", "Device")."""
        act = self._by_corr.get(call.args["correlation"])
        m = MEMCPY.match(act.name) if act is not None and act.cat == "gpu_memcpy" else None
        return (m["kind"], m["src"], m["dst"]) if m else None

    @cached_property
    def _by_corr(self) -> dict[int, Span]:
        return {s.args["correlation"]: s for s in self.gpu}

    @cached_property
    def blocking(self) -> list[tuple[Span, str]]:
        """Host calls that wait for the GPU, with the leaf they belong to: synchronizations and
        copies to the host (sync), copies from pageable host memory (pageable), by start."""
        out = []
        for c in self.calls.values():
            copy = self.copy_of(c)
            if _name(c.name) in SYNC_CALLS or (copy and copy[0] == "DtoH"):
                out.append((c, "sync"))
            elif copy and copy[0] == "HtoD" and copy[1] == "Pageable":
                out.append((c, "pageable"))
        return sorted(out, key=lambda ck: ck[0].start)

    def spans_named(self, test) -> list[tuple[float, float]]:
        return merge((s.start, s.end) for s in self.host
                     if s.cat in ("user_annotation", "cpu_op") and test(s.name))  # fmt: skip

    @cached_property
    def layers(self) -> list[tuple[str, list[tuple[float, float]]]]:
        """What the host may be doing in a gap, in the order a gap's time is given out."""
        return [
            ("data", self.spans_named(lambda n: n.startswith(DATA_PREFIX))),
            ("recompile", self.spans_named(lambda n: n.startswith(COMPILE_NAMES))),
            ("pageable", merge((c.start, c.end) for c, k in self.blocking if k == "pageable")),
            ("sync", merge((c.start, c.end) for c, k in self.blocking if k == "sync")),
        ]

    # --8<-- [start:gaps]
    def gaps(self) -> list[Gap]:
        """Every stretch inside the window where no GPU activity runs (on any stream), from the
        window's start to the last activity. cpu_caused: the call that launched the next activity
        returned after the previous activity had started, so nothing else was queued behind it
        (a graph replay or a deep queue launches long before: those gaps are the GPU's own)."""
        if not self.gpu:
            return [Gap(self.start, self.end, None, None, True)]
        out, busy, prev = [], self.start, None
        for act in self.gpu:
            if act.start > busy:
                call = self.calls.get(act.args["correlation"])
                late = call is not None and (prev is None or call.end > prev.start)
                out.append(Gap(busy, act.start, prev, act, late))
            if act.end > busy:
                busy, prev = act.end, act
        return out

    def idle_causes(self) -> dict[str, float]:
        """Microseconds of GPU idle time per cause. A gap the host caused goes whole to a
        blocking call that was waiting when the GPU ran dry (the wait drained the queue:
        whatever the host did next could have overlapped queued work); otherwise its time goes,
        in this order, to what the host was inside: DataLoader.__next__ (data), a Dynamo compile
        (recompile), a pageable copy (pageable), a synchronization (sync); the rest to launching
        (launch), or, in a trace with no GPU work at all, to the host's own work (host).
        The lead-in, from the window's start to its first GPU activity, is the exception: what
        the host did there that no layer explains goes to `lead-in`, which no analyzer reads.
        Nothing was queued yet and nothing had been launched late: the host was entering the
        range and issuing the first call (on an H200 under the profiler, a CUDA graph's first
        replay of a session took 0.1-0.5 ms). In a loop that host time overlaps the previous
        step's GPU work; a window starts where no earlier step of it exists. A stall the host
        spends in a named layer (a DataLoader.__next__ at the start of a ProfilerStep) still
        counts: it is in every step, not only the first."""
        if "idle" in self._cache:
            return self._cache["idle"]
        out: dict[str, float] = defaultdict(float)
        for g in self.gaps():
            if not g.cpu_caused:
                out["queued"] += g.end - g.start
                continue
            cause = self._drained_by(g)
            if cause:
                out[cause] += g.end - g.start
                continue
            rest = [(g.start, g.end)]
            for name, intervals in self.layers:
                rest = _carve(rest, intervals, name, out)
            left = sum(b - a for a, b in rest)
            prev_copy = self._copy_kind(g.prev)
            tail = ("pageable" if prev_copy == ("HtoD", "Pageable") else
                    "host" if not self.gpu else
                    "lead-in" if g.prev is None else "launch")  # fmt: skip
            out[tail] += left
        self._cache["idle"] = dict(out)
        return self._cache["idle"]

    def _copy_kind(self, act: Span | None) -> tuple[str, str] | None:
        m = MEMCPY.match(act.name) if act is not None and act.cat == "gpu_memcpy" else None
        return (m["kind"], m["src"]) if m else None

    def _drained_by(self, g: Gap) -> str | None:
        """The leaf of the blocking call that was waiting when the GPU went idle: one that
        started before the gap and was still running when the last activity started (the
        host's and the GPU's clocks differ by less than that activity lasts)."""
        if g.prev is None:
            return None
        kind = self._copy_kind(g.prev)
        if kind and kind[0] == "DtoH":  # the host asked for data back: it waited for it
            return "sync"
        starts = [c.start for c, _ in self.blocking]
        for c, leaf in reversed(self.blocking[: bisect.bisect_right(starts, g.start)]):
            if c.end >= g.prev.start:
                return leaf
        return None

    # --8<-- [end:gaps]


def _carve(pieces, intervals, name, out) -> list[tuple[float, float]]:
    """Give the parts of `pieces` that `intervals` (merged, sorted) cover to out[name]; return
    the uncovered parts."""
    if not intervals:
        return pieces
    starts = [a for a, _ in intervals]
    left = []
    for a, b in pieces:
        cursor = a
        i = max(0, bisect.bisect_right(starts, a) - 1)
        while i < len(intervals) and intervals[i][0] < b:
            s, e = intervals[i]
            s, e = max(s, a), min(e, b)
            if e > s:
                if s > cursor:
                    left.append((cursor, s))
                out[name] += e - s
                cursor = max(cursor, e)
            i += 1
        if cursor < b:
            left.append((cursor, b))
    return left
