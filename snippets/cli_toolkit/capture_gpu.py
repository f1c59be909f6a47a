"""On the GPU machine (`nox -s gpu_docs`): run each GPU-side tool of the page once and record
what it printed, or the real error it gave. The record's provenance carries the date, GPU,
driver, CUDA and torch of the run; the page shows the record."""

from snippets.cli_toolkit.runner import run
from snippets.cli_toolkit.smi import COMMAND, parse_query
from snippets.common.results import write_result

# --8<-- [start:commands]
# (id, stage, command): ids are short words, the page selects rows by them
MATMUL = ("python3 -c \"import torch; a = torch.randn(2048, 2048, device='cuda'); "
          "(a @ a).sum().item()\"")  # fmt: skip
COMMANDS = [
    ("smi", "gpu", COMMAND),
    ("dmon", "gpu", "nvidia-smi dmon -c 3 -s pucm"),
    ("nvitop", "gpu", "nvitop --once"),
    ("ncu", "profile", "ncu --version"),
    (
        "ncu_gemm",
        "profile",
        "ncu --clock-control none --launch-count 1 --kernel-name regex:gemm "
        f"--metrics gpu__time_duration.sum {MATMUL}",
    ),
    ("nsys", "profile", "nsys --version"),
    ("pyspy", "profile", "py-spy --version"),
    ("rg", "search", "rg --version"),
    ("strace", "process", "strace -V"),
    ("gdb", "process", "gdb --version"),
    ("tmux", "remote", "tmux -V"),
    ("jq", "search", "jq --version"),
]
# --8<-- [end:commands]

# --8<-- [start:capture]
rows, lines = [], []
for tool, stage, command in COMMANDS:
    ran = run(command, timeout=25.0 if tool == "ncu_gemm" else 10.0)
    first = next((ln for ln in ran.lines if ln.strip()), "")
    rows.append({"tool": tool, "stage": stage, "command": command,
                 "exit": -1 if ran.exit is None else ran.exit, "first": first})  # fmt: skip
    lines += [{"tool": tool, "n": i, "text": ln} for i, ln in enumerate(ran.lines, 1)]
smi = run(COMMAND)
gpus = parse_query("\n".join(smi.lines)) if smi.ok else []
write_result(
    "cli-toolkit",
    "gpu-tools",
    {
        "rows": rows,
        "lines": lines,
        "gpus": len(gpus),
        "memory_total_mib": gpus[0]["memory.total"] if gpus else 0.0,
        "clocks_max_sm_mhz": gpus[0]["clocks.max.sm"] if gpus else 0.0,
    },
)
# --8<-- [end:capture]
