"""Unit tests for snippets/cli_toolkit/, and the runner of the page's CPU-image commands.

The page's shell fences that use this repository's CPU image (Debian tools, the PyPI tools
pinned in pyproject.toml) are marked `skip` on the page with a reason that starts with
CPU_IMAGE: the GPU machine's image lacks several of those tools, and gpu_docs runs every fence
it does not skip. test_cpu_image_fence runs each of them here, on the CPU, with the page
machinery's own shell runner (the same `#>` check, the same --update-examples rewrite).
"""

import cProfile
import sys
from pathlib import Path

import pytest
import torch

from snippets.cli_toolkit import planted
from snippets.cli_toolkit.hot import hottest
from snippets.cli_toolkit.runner import MAX_LINES, run
from snippets.cli_toolkit.smi import COMMAND, QUERY, parse_query
from snippets.cli_toolkit.stacks import NO_FRAME, frame_name, read_collapsed
from snippets.common.markup import SHELL, scan
from tests import pages

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "posts" / "cli-toolkit.md"
CPU_IMAGE = "CPU 镜像的命令"


def cpu_image_fences(page: Path = PAGE):
    return [f for f in scan(page) if f.lang in SHELL and (f.skip or "").startswith(CPU_IMAGE)]


def test_the_page_has_cpu_image_fences():
    assert len(cpu_image_fences()) >= 8


@pytest.mark.skipif(torch.cuda.is_available(),
                    reason="the GPU machine's image is another one: capture_gpu.py records "
                           "what its tools print")  # fmt: skip
@pytest.mark.parametrize("fence", cpu_image_fences(), ids=lambda f: f"line{f.line}")
def test_cpu_image_fence(fence):
    new = pages.run_shell(fence, ROOT)
    if new is not None and pages.UPDATE:
        pages._rewrite_fence(fence, new)


# --------------------------------------------------------------------------- stacks


def write(tmp_path, text, name="prof.txt"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_collapsed_self_and_total(tmp_path):
    path = write(tmp_path, "main (a.py:1);work (a.py:5) 7\n"
                           "main (a.py:1);work (a.py:6);work (a.py:5) 2\n"
                           "main (a.py:2) 1\n"
                           " 3\n")  # fmt: skip
    p = read_collapsed(path)
    assert p.samples == 13
    assert p.self_ == {"work (a.py)": 9, "main (a.py)": 1, NO_FRAME: 3}
    # recursion (work under work) counts once per sample in the total
    assert p.total["work (a.py)"] == 9 and p.total["main (a.py)"] == 10
    assert p.top(1) == [("work (a.py)", 9 / 13)]


def test_frame_name_drops_path_and_line():
    assert frame_name("f (snippets/x/y.py:12)", "w") == "f (y.py)"
    assert frame_name("<module> (<frozen runpy>:88)", "w") == "<module> (<frozen runpy>)"
    assert frame_name("Event.wait (threading.py:629)", "w") == "Event.wait (threading.py)"


def test_collapsed_bad_input(tmp_path):
    with pytest.raises(ValueError, match=r"prof.txt:2: not a collapsed stack"):
        read_collapsed(write(tmp_path, "a (x.py:1) 3\nno count here\n"))
    with pytest.raises(ValueError, match=r"prof.txt:1: not a py-spy frame"):
        read_collapsed(write(tmp_path, "a;b (x.py:1) 3\n"))
    with pytest.raises(ValueError, match=r"no samples"):
        read_collapsed(write(tmp_path, "\n"))


def test_hottest_from_cprofile(tmp_path):
    out = tmp_path / "p.prof"
    cProfile.runctx("planted.main(20)", {"planted": planted}, {}, str(out))
    func, share = hottest(out)
    assert func == "slow_tokenize (planted.py)" and share > 0.5


def test_hottest_from_py_spy_raw(tmp_path):
    path = write(tmp_path, "main (p.py:3);slow (p.py:9) 80\nmain (p.py:4) 20\n")
    assert hottest(path) == ("slow (p.py)", 0.8)


# --------------------------------------------------------------------------- nvidia-smi

# Laid out as nvidia-smi(1) documents --format=csv (a header of field names with the unit in
# brackets, values with their unit); the name, memory and driver are those KINDS.md of this
# workplace records for the H200 machine. A constructed fixture, not a capture: the capture
# is results/cli-toolkit/gpu-tools.json, written on the GPU.
SMI_CSV = """name, driver_version, memory.total [MiB], memory.used [MiB], utilization.gpu [%], \
clocks.sm [MHz], clocks.max.sm [MHz], power.draw [W], power.limit [W], temperature.gpu
NVIDIA H200, 580.159.03, 143771 MiB, 0 MiB, 0 %, 345 MHz, 1980 MHz, [N/A], 700.00 W, 31
"""


def test_smi_query_parses_units_and_missing():
    (gpu,) = parse_query(SMI_CSV)
    assert gpu["name"] == "NVIDIA H200" and gpu["driver_version"] == "580.159.03"
    assert gpu["memory.total"] == 143771.0 and gpu["clocks.max.sm"] == 1980.0
    assert gpu["power.draw"] is None and gpu["temperature.gpu"] == "31"
    assert set(gpu) == set(QUERY)
    assert COMMAND.startswith("nvidia-smi --query-gpu=name,") and "--format=csv" in COMMAND


def test_smi_nounits_and_two_gpus():
    text = "memory.total [MiB], utilization.gpu [%]\n81559, 97\n81559, 3\n"
    assert parse_query(text) == [{"memory.total": 81559.0, "utilization.gpu": 97.0},
                                 {"memory.total": 81559.0, "utilization.gpu": 3.0}]  # fmt: skip


def test_smi_bad_input():
    with pytest.raises(ValueError, match="no output"):
        parse_query("")
    with pytest.raises(ValueError, match=r"smi:3: 1 values for 2 fields"):
        parse_query("memory.total [MiB], utilization.gpu [%]\n1 MiB, 2 %\n5 MiB\n", "smi")
    with pytest.raises(ValueError, match=r"nvidia-smi:2: memory.total = 'lots MiB' is not"):
        parse_query("memory.total [MiB]\nlots MiB\n")
    with pytest.raises(ValueError, match=r"nvidia-smi:1: not a query header field"):
        parse_query("NVIDIA H200, 143771 MiB\n")  # --format=csv,noheader: no header to check


# --------------------------------------------------------------------------- runner


def test_run_keeps_output_and_exit():
    ran = run("echo out; echo err >&2; exit 3")
    assert ran.exit == 3 and ran.lines == ("out", "err") and not ran.ok


def test_run_missing_tool_is_the_real_error():
    ran = run("handbook-no-such-tool --version")
    assert ran.exit == 127 and ran.lines[-1].endswith("handbook-no-such-tool: command not found")


def test_run_timeout_and_truncation():
    ran = run("sleep 5", timeout=0.3)
    assert ran.exit is None and ran.lines == ("(killed after 0.3 s)",)
    many = run(f"seq 1 {MAX_LINES + 5}")
    assert len(many.lines) == MAX_LINES and many.lines[0] == "1"


def test_run_strips_colours_and_finds_pinned_tools():
    assert run(r"printf '\033[1;31mred\033[0m\n'").lines == ("red",)
    python = Path(sys.executable)
    assert run(f"command -v {python.name}").lines[0].startswith(str(python.parent))
    with pytest.raises(ValueError, match="empty command"):
        run("  ")


def test_run_finds_scripts_of_a_pip_target(tmp_path, monkeypatch):
    tool = tmp_path / "site" / "bin" / "handbook-tool"
    tool.parent.mkdir(parents=True)
    tool.write_text("#!/bin/sh\necho from the target\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    assert run("handbook-tool").lines == ("from the target",)
