"""Unit tests for snippets/gpu_sop/: the collective-hang analysis on hand-made ledgers (each
fault, and the healthy case) and bad ledgers (the live gloo runs are hang.py's demo, whose
prints the page checks: run once, at import); the leaves' analyzers on simulated GPU traces
(every analyzer on every program), on hand-built edge cases and on bad traces; the trace-field
check bench_gpu.py runs on its own trace; the fragmentation pair's fresh processes (no allocator
setting changed in a live process). The real CPU traces of the data stall and the recompile
storm are recorded and diagnosed by the page itself (section 2.5, its printed output is
checked)."""

import gzip
import json
from pathlib import Path

import pytest
import torch

from snippets.common.hardware import load_hardware
from snippets.gpu_sop import analyzers as az
from snippets.gpu_sop import programs as programs_module
from snippets.gpu_sop.fresh import main as fresh_main
from snippets.gpu_sop.hang import analyze, read_ledgers
from snippets.gpu_sop.programs import (
    ALLOC_ENV,
    CPU_OK,
    CPU_SIZES,
    FIX,
    FRESH,
    expandable_setting,
    growing,
    in_fresh_process,
    programs,
    record,
    token_loader,
)
from snippets.gpu_sop.synthetic import CACHED, MIB, PERSISTENT, SIMULATED, Sim, simulated_trace
from snippets.gpu_sop.trace import Trace, TraceError


def started(seq, op="all_reduce", shape=(4,)):
    return {"seq": seq, "op": op, "shape": list(shape), "state": "started"}


def completed(seq, op="all_reduce", shape=(4,)):
    return {"seq": seq, "op": op, "shape": list(shape), "state": "completed"}


def test_healthy():
    rows = [started(0), completed(0), started(1), completed(1)]
    assert analyze({0: rows, 1: rows}).startswith("no hang")


def test_straggler_is_the_rank_that_never_entered():
    ok = [started(0), completed(0), started(1)]
    late = [started(0), completed(0)]
    report = analyze({0: ok, 1: ok, 2: late})
    assert report == ("collective #1 all_reduce: ranks [0, 1] waited; ranks [2] never entered "
                      "it (last completed: rank 2 #0)")  # fmt: skip


def test_mismatch_names_each_side():
    a = [started(0), started(1, "broadcast")]
    b = [started(0), started(1, "all_reduce", (8,))]
    assert analyze({0: a, 1: a, 2: b}) == (
        "collective #1: ranks disagree: all_reduce[8] on ranks [2]; broadcast[4] on ranks [0, 1]"
    )


def test_first_disagreement_wins():
    a = [started(0), completed(0), started(1)]
    b = [started(0, shape=(2,))]
    assert analyze({0: a, 1: b}).startswith("collective #0: ranks disagree")


def test_bad_ledgers(tmp_path):
    with pytest.raises(FileNotFoundError, match="no rank"):
        read_ledgers(tmp_path)
    (tmp_path / "rank0.jsonl").write_text(json.dumps(started(0)) + "\n{oops\n")
    with pytest.raises(ValueError, match=r"rank0.jsonl:2: not a JSON ledger line"):
        read_ledgers(tmp_path)


# --------------------------------------------------------------------------- the leaves


@pytest.fixture(scope="module")
def simulated():
    return Trace.load(simulated_trace(), source="simulated")


def test_programs_fixtures_and_analyzers_name_the_same_leaves():
    assert set(FIX) == set(az.ANALYZERS)
    assert set(SIMULATED) == {"healthy"} | set(FIX) | set(FIX.values())
    assert CPU_OK < set(SIMULATED)


@pytest.mark.parametrize("name", list(SIMULATED))
def test_only_the_planted_leaf_is_named_on_simulated_traces(simulated, name):
    shares = az.diagnose(simulated.window(f"sop:{name}"))
    assert az.named(shares) == ([name] if name in FIX else []), shares


def test_a_gap_after_a_sync_is_the_syncs_even_while_the_host_loads_data(simulated):
    """After .item() the host spends the gap in DataLoader.__next__: the sync drained the
    queue, so the gap is the sync's, not the data's."""
    w = simulated.window("sop:sync")
    idle = w.idle_causes()
    assert idle["sync"] > 10 * idle.get("data", 0.0)


def test_graph_replays_gaps_are_queued_not_the_hosts(simulated):
    idle = simulated.window("sop:small").idle_causes()
    assert idle["queued"] > 100 * idle.get("launch", 0.0)


def test_gpu_work_without_a_launching_call_counts_where_it_starts():
    """A kernel whose correlation matches no call (a trace that lost the graph launch) still
    belongs to the range it runs in; its gap is not blamed on the host."""
    s = Sim()
    with s.span("sop:a"):
        s.host(10.0)
        s.kernel(5.0)
        s.host(100.0)
    kernel = next(e for e in s.events if e["cat"] == "kernel")
    s.events.append({**kernel, "ts": kernel["ts"] + 20.0, "args": {**kernel["args"],
                     "correlation": 999}})  # fmt: skip
    w = Trace.load(s.trace()).window("sop:a")
    assert len(w.gpu) == 2 and w.idle_causes()["queued"] == pytest.approx(15.0)


def test_a_lead_in_is_not_launching():
    """The second H200 run's launch_fixed: 8 replays of a 64-kernel graph (~0.09 ms each) in a
    range whose first replay came ~0.22 ms after it opened (the graph's first launch under a
    new profiler session). Counted as launching, the lead-in alone named `launch` (0.17 of
    the window here; 0.25 there); it is the window's edge, not a steady-state cost."""
    s = Sim()
    with s.span("sop:graph"):
        s.host(224.0)
        for _ in range(8):
            s.graph([(1.35, (512, 1, 1))] * 64)
        s.sync()
    w = Trace.load(s.trace()).window("sop:graph")
    idle = w.idle_causes()
    assert idle["lead-in"] > 0.1 * w.length  # what the old attribution gave to launch
    assert az.launch(w) == 0.0


def test_a_data_stall_in_the_lead_in_still_counts():
    """A ProfilerStep window opens with the step's DataLoader.__next__: that stall is in every
    step, so the lead-in rule leaves it to the data analyzer; only the unexplained rest of
    the lead-in is set aside."""
    s = Sim()
    with s.span("ProfilerStep#3"):
        with s.span("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"):
            s.host(8000.0)
        s.host(40.0)
        for _ in range(20):
            s.kernel(150.0)
        s.sync()
    w = Trace.load(s.trace()).window("ProfilerStep#3")
    assert az.data(w) == pytest.approx(8000.0 / w.length)
    assert w.idle_causes()["lead-in"] == pytest.approx(40.0 + 6.0 + 4.0)  # host, call, latency
    assert az.named(az.diagnose(w)) == ["data"]


def test_fragmentation_counts_from_the_windows_start():
    """The second H200 run's decode windows: [1, d] outputs in a process whose other programs
    left 13 % of the reserved memory free in partly used segments. Measured on the process's
    totals that named `fragment` (0.13); the window's own growth is nothing."""
    s = Sim()
    s.memory(PERSISTENT, fresh=True)
    s.reserved += CACHED
    s.memory(0)
    s.host(10.0)
    with s.span("sop:decode"):
        for _ in range(8):
            s.memory(32 * 1024)
            s.kernel(150.0)
            s.memory(-32 * 1024)
    w = Trace.load(s.trace()).window("sop:decode")
    totals = w.memory[-1]
    assert (totals["Total Reserved"] - totals["Total Allocated"]) / totals["Total Reserved"] > 0.1
    assert w.before["Total Reserved"] == PERSISTENT + CACHED
    assert az.fragmentation(w) == 0.0


def test_fragmentation_without_an_earlier_event_starts_from_the_first():
    s = Sim()
    s.memory(100 * MIB, fresh=True)  # inside the window: its first event
    with s.span("sop:f"):
        pass
    s.events[-1]["ts"], s.events[-1]["dur"] = -1.0, 1e6  # the range covers the first event
    for i in (1, 2):
        s.memory(-(99 + i) * MIB)
        s.memory((100 + i) * MIB, fresh=True)
    w = Trace.load(s.trace()).window("sop:f")
    assert w.before is None
    assert az.fragmentation(w) == pytest.approx(201 / 303)  # 303 MiB reserved, 102 at most


def test_record_warms_each_program_up_outside_its_range(tmp_path):
    """record() runs `run.warmup` steps (default 1) before each range, in the session: the
    range holds only the steady steps; a program with warmup = 0 gets none."""
    calls = {"a": [], "b": []}

    def program(name, warmup=None):
        a, b = torch.randn(8, 8), torch.randn(8, 8)

        def run(steps):
            calls[name].append(steps)
            for _ in range(steps):
                torch.mm(a, b)

        if warmup is not None:
            run.warmup = warmup
        return run

    path = record({"a": program("a"), "b": program("b", warmup=0)}, tmp_path / "t.json",
                  default_steps=3, cuda=False)  # fmt: skip
    trace = Trace.load(path)
    mms = [s for s in trace.spans if s.name == "aten::mm"]
    in_a = [s for s in trace.window("sop:a").host if s.name == "aten::mm"]
    assert calls == {"a": [1, 3], "b": [3]}
    assert len(mms) == 7 and len(in_a) == 3


def test_workers_come_from_a_fork_server():
    """Forked from a process running CUDA and CUPTI threads, the loader's workers took 40 s to
    shut down on the H200 machine (8 x the 5 s join timeout); a fork server's are forked from
    a single-threaded process."""
    loader = token_loader(CPU_SIZES, 0.0, 2, torch.device("cpu"))
    assert loader.multiprocessing_context.get_start_method() == "forkserver"
    assert token_loader(CPU_SIZES, 0.0, 0, torch.device("cpu")).multiprocessing_context is None


def test_small_kernels_lost_sm_time_by_hand():
    s = Sim(sms=100)
    with s.span("sop:k"):
        s.graph([(10.0, (25, 1, 1)), (10.0, (200, 1, 1))], gap=0.0)
        s.sync()
    w = Trace.load(s.trace()).window("sop:k")
    assert az.small_kernels(w) == pytest.approx(10.0 * (1 - 25 / 100) / w.length)


def test_small_kernels_needs_the_sm_count():
    s = Sim()
    s.props = [{"id": 0, "name": "NVIDIA H200"}]
    s.kernel(5.0)
    with pytest.raises(ValueError, match="no numSms"):
        az.small_kernels(Trace.load(s.trace(), source="t.json").window())


def test_roofline_arithmetic():
    h200 = load_hardware()["h200-sxm"]
    assert az.ridge(h200, 2) == pytest.approx(989.5 / 4.8)
    assert az.intensity(1, 1, 8192, 8192, 2) == pytest.approx(8192**2 / (8192**2 + 2 * 8192))
    assert az.intensity(1, 512, 8192, 8192, 2) > az.ridge(h200, 2)  # the fix's batch
    assert az.intensity(1, 1, 8192, 8192, 2) < az.ridge(h200, 2) / 100


def test_matmul_shapes_from_a_real_cpu_trace(tmp_path):
    a, b, c = torch.randn(3, 5), torch.randn(5, 7), torch.randn(2, 3, 5)
    with torch.profiler.profile(record_shapes=True) as prof:
        torch.mm(a, b)
        torch.addmm(torch.zeros(7), a, b)
        torch.bmm(c, torch.randn(2, 5, 7))
    prof.export_chrome_trace(str(tmp_path / "t.json"))
    w = Trace.load(tmp_path / "t.json").window()
    shapes = {o.name: az.matmul_shape(o) for o in w.host if o.name in az.MATMULS}
    assert shapes == {"aten::mm": (1, 3, 5, 7, 4), "aten::addmm": (1, 3, 5, 7, 4),
                      "aten::bmm": (2, 3, 5, 7, 4)}  # fmt: skip
    assert az.batch_too_small(w) == 0.0  # no GPU work: no roofline


def test_batch_needs_a_known_gpu(simulated):
    s = Sim(device="Some Other GPU")
    with s.span("sop:b"):
        s.kernel(50.0, op=("aten::mm", [[1, 8192], [8192, 8192]], ["c10::BFloat16"] * 2))
    assert az.batch_too_small(Trace.load(s.trace()).window("sop:b")) == 0.0
    assert az.gpu_of(simulated.window("sop:batch")).id == "h200-sxm"


def test_fragmentation_floor():
    s = Sim()
    with s.span("sop:f"):
        s.memory(10 * MIB, fresh=True)
        s.memory(-10 * MIB)
        s.memory(11 * MIB, fresh=True)  # 10 MiB wasted: under one segment of each pool
    assert az.fragmentation(Trace.load(s.trace()).window("sop:f")) == 0.0
    with s.span("sop:g"):
        s.memory(-11 * MIB)
        s.memory(12 * MIB, fresh=True)
        s.memory(-12 * MIB)
        s.memory(13 * MIB, fresh=True)  # 46 MiB reserved for at most 13 allocated
    w = Trace.load(s.trace()).window("sop:g")
    assert az.fragmentation(w) == pytest.approx(33 / 46)


def test_a_trace_without_gpu_work_blames_no_launches():
    s = Sim()
    with s.span("sop:h"):
        s.host(100.0, name="enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__")
        s.host(300.0)
    w = Trace.load(s.trace()).window("sop:h")
    assert w.idle_causes() == {"data": 100.0, "host": 300.0}
    assert az.launch(w) == 0.0 and az.data(w) == pytest.approx(0.25)


def test_bad_traces(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{oops")
    with pytest.raises(TraceError, match=r"bad\.json: not a Chrome trace JSON"):
        Trace.load(bad)
    bad.write_text('{"events": []}')
    with pytest.raises(TraceError, match=r"bad\.json: no 'traceEvents'"):
        Trace.load(bad)
    event = {"ph": "X", "cat": "kernel", "name": "k", "ts": 1.0, "dur": 2.0, "args": {}}
    with pytest.raises(TraceError, match=r"t: traceEvents\[1\] \('k'\): a kernel event without"):
        Trace.load({"traceEvents": [{"ph": "M"}, event]}, source="t")
    with pytest.raises(TraceError, match=r"t: traceEvents\[0\] \('k'\): .* numeric ts and dur"):
        Trace.load({"traceEvents": [{**event, "ts": "1"}]}, source="t")
    memory = {"ph": "i", "name": "[memory]", "ts": 1.0, "args": {"Bytes": 4}}
    with pytest.raises(TraceError, match=r"traceEvents\[0\]: a \[memory\] event without"):
        Trace.load({"traceEvents": [memory]}, source="t")


def test_unknown_range_lists_the_known_ones(simulated):
    with pytest.raises(TraceError, match=r"0 ranges named 'sop:nope'.*sop:batch"):
        simulated.window("sop:nope")


def test_gzip_and_the_command_line(tmp_path, capsys):
    path = tmp_path / "trace.json.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        json.dump(simulated_trace(["healthy", "launch"]), f)
    assert az.main([str(path), "--each"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split(" | ")[0] for ln in lines] == [
        "sop:healthy: nothing named",
        "sop:launch: launch",
    ]
    assert az.main([]) == 2


def test_cpu_programs_run_on_the_cpu():
    progs = programs(CPU_SIZES, "cpu", only=["launch", "batch", "batch_fixed"])
    for program in progs.values():
        program(1)
    assert progs["batch"].weights is progs["batch_fixed"].weights
    assert progs["batch_fixed"].forward().shape == (CPU_SIZES.big_batch, CPU_SIZES.decode_d)


def test_missing_fields_on_the_simulated_trace(simulated):
    """The check bench_gpu.py runs on its real trace: nothing missing on a trace that has the
    fields; a renamed copy, a lost grid, a wrong decode shape each named."""
    windows = {name: simulated.window(f"sop:{name}") for name in SIMULATED}
    assert az.missing_fields(windows, 16384) == []
    assert az.missing_fields(windows, 4096) == ["batch: no matmul of shape 1 x 4096 x 4096"]
    raw = simulated_trace()
    for e in raw["traceEvents"]:
        if e.get("cat") == "kernel":
            e["args"].pop("grid", None)
        if e.get("cat") == "gpu_memcpy":
            e["name"] = e["name"].replace("Pageable", "Paged")
    broken = Trace.load(raw, source="broken")
    windows = {name: broken.window(f"sop:{name}") for name in SIMULATED}
    assert az.missing_fields(windows, 16384) == [
        "small: kernels without a grid",
        "pageable: no 'Memcpy HtoD (Pageable -> Device)' among ['Memcpy HtoD (Paged -> Device)', "
        "'Memcpy HtoD (Pinned -> Device)']",
    ]


def test_expandable_setting_is_read_from_the_environment():
    assert expandable_setting({}) is False
    assert expandable_setting({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64,"
                               "expandable_segments:True"}) is True  # fmt: skip
    assert expandable_setting({"PYTORCH_ALLOC_CONF": "expandable_segments:False"}) is False
    with pytest.raises(ValueError, match="disagree"):
        expandable_setting({"PYTORCH_ALLOC_CONF": "expandable_segments:True",
                            "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False"})  # fmt: skip


def test_the_growth_refuses_a_process_started_with_the_other_setting(monkeypatch):
    """Switching expandable_segments inside a live process is what crashed the first GPU run's
    neighbourhood; the program checks the setting it was started with instead."""
    for var in ALLOC_ENV:
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(RuntimeError, match="in_fresh_process"):
        growing(CPU_SIZES, torch.device("cpu"), expandable=True)
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    assert callable(growing(CPU_SIZES, torch.device("cpu"), expandable=True))


def test_no_allocator_setting_is_changed_at_run_time():
    """No snippet of this post calls the allocator-settings setters (only the environment of a
    fresh process carries the setting)."""
    package = Path(programs_module.__file__).parent
    for path in package.glob("*.py"):
        text = path.read_text(encoding="utf-8")
        for setter in ("_set_allocator_settings", "setAllocatorSettings"):
            assert setter not in text, f"{path.name} calls {setter}"


def test_each_side_of_the_fragment_pair_starts_with_its_setting(monkeypatch, tmp_path):
    started = []
    monkeypatch.setattr(programs_module.subprocess, "Popen",
                        lambda cmd, env, cwd: started.append((cmd, env)))  # fmt: skip
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "expandable_segments:True")
    for name in sorted(FRESH):
        in_fresh_process(name, tmp_path, CPU_SIZES)
    (cmd0, env0), (_, env1) = started
    assert cmd0[1:4] == ["-m", "snippets.gpu_sop.fresh", "fragment"]
    assert expandable_setting(env0) is False and expandable_setting(env1) is True
    assert "PYTORCH_ALLOC_CONF" not in env0
    assert fresh_main(["nope"]) == 2


def test_host_watch_tells_a_busy_thread_from_a_waiting_one():
    import time

    from snippets.gpu_sop.programs import host_watch

    with host_watch({}) as busy:
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 0.2:
            pass
    with host_watch({}) as waiting:
        time.sleep(0.2)
    assert busy["cpu_over_wall"] > 0.5 > 0.2 > waiting["cpu_over_wall"]
    for state in (busy, waiting):
        assert state["steal"] is None or 0.0 <= state["steal"] <= 1.0
        assert state["loop_ms_before"] > 0 and state["loop_ms_after"] > 0
