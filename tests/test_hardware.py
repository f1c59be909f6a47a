"""data/hardware.yaml loads, validates, and yields sane derived numbers."""

from pathlib import Path

import pytest
import yaml

from snippets.common.hardware import (
    DEFAULT_PATH,
    GPU,
    HardwareDataError,
    gpu_for_device_name,
    load_hardware,
    ridge_point,
)

IDS = {"h100-sxm", "h100-pcie", "h200-sxm", "a100-sxm-80gb", "b200"}

VALID = """\
# a minimal valid file
gpus:
  test-gpu:
    name: Test GPU
    architecture: Hopper
    sms: 132
    memory_gb: 80
    hbm_tb_per_s: 3.35
    bf16_dense_tflops: 989.5
    fp8_dense_tflops: 1979
    fp32_tflops: 67
    tdp_w: 700
    sources:
      - url: https://example.com/datasheet.pdf
        what: every figure
    notes: test entry
"""


def line_of(text: str, needle: str) -> int:
    return next(i for i, ln in enumerate(text.splitlines(), 1) if needle in ln)


def test_real_file_loads_and_validates():
    gpus = load_hardware()
    assert set(gpus) == IDS
    raw = yaml.safe_load(DEFAULT_PATH.read_text(encoding="utf-8"))["gpus"]
    for gpu_id, gpu in gpus.items():
        assert isinstance(gpu, GPU) and gpu.id == gpu_id
        assert set(raw[gpu_id]) == {f for f in GPU.__dataclass_fields__ if f != "id"}
        assert 1 <= len(gpu.sources) <= 3
        assert all(url.startswith("https://") and what for url, what in gpu.sources)
        assert gpu.notes and gpu.sms > 0 and gpu.tdp_w > 0
    # only Ampere lacks FP8 Tensor Cores
    assert [g for g, v in gpus.items() if v.fp8_dense_tflops is None] == ["a100-sxm-80gb"]


def test_ridge_point_h200_bf16():
    entry = yaml.safe_load(DEFAULT_PATH.read_text(encoding="utf-8"))["gpus"]["h200-sxm"]
    expected = entry["bf16_dense_tflops"] * 1e12 / (entry["hbm_tb_per_s"] * 1e12)
    ridge = ridge_point(load_hardware()["h200-sxm"], "bf16")
    assert abs(ridge - expected) < 1
    assert 150 < ridge < 300  # about 206 FLOP/B


def test_ridge_point_rejects_missing_dtype():
    gpus = load_hardware()
    with pytest.raises(ValueError, match="fp8"):
        ridge_point(gpus["a100-sxm-80gb"], "fp8")
    with pytest.raises(ValueError, match="int4"):
        ridge_point(gpus["h100-sxm"], "int4")


SOURCES = (
    "    sources:\n      - url: https://example.com/datasheet.pdf\n        what: every figure\n"
)
# (case, old text, new text, text marking the expected line in the new file, field name)
BAD = [
    ("missing", "    tdp_w: 700\n", "", "test-gpu:", "tdp_w"),
    ("unknown", "    sms: 132\n", "    sms: 132\n    clock_mhz: 1980\n", "clock_mhz", "clock_mhz"),
    ("wrong_type", "sms: 132", "sms: many", "sms:", "sms"),
    ("bool_type", "tdp_w: 700", "tdp_w: true", "tdp_w:", "tdp_w"),
    ("negative", "memory_gb: 80", "memory_gb: -80", "memory_gb:", "memory_gb"),
    ("zero", "hbm_tb_per_s: 3.35", "hbm_tb_per_s: 0", "hbm_tb_per_s:", "hbm_tb_per_s"),
    ("http_url", "url: https://", "url: http://", "url:", "url"),
    ("empty_sources", SOURCES, "    sources: []\n", "sources:", "sources"),
    ("broken_yaml", "sms: 132", "sms: 132: 5", "sms:", "sms"),
]


@pytest.mark.parametrize(("case", "old", "new", "marker", "field"), BAD, ids=[b[0] for b in BAD])
def test_malformed_input_names_file_line_id_field(tmp_path, case, old, new, marker, field):
    assert old in VALID
    text = VALID.replace(old, new, 1)
    path = tmp_path / f"hw_{case}.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(HardwareDataError) as info:
        load_hardware(path)
    msg = str(info.value)
    assert f"{path.name}:{line_of(text, marker)}:" in msg, msg
    assert "test-gpu" in msg and field in msg, msg
    assert isinstance(info.value, ValueError)


def test_valid_template_loads(tmp_path):
    path = tmp_path / "hw.yaml"
    path.write_text(VALID, encoding="utf-8")
    gpu = load_hardware(Path(path))["test-gpu"]
    assert gpu.sources == (("https://example.com/datasheet.pdf", "every figure"),)


@pytest.mark.parametrize(
    ("device_name", "gpu_id"),
    [
        ("NVIDIA H200", "h200-sxm"),
        ("NVIDIA H100 80GB HBM3", "h100-sxm"),
        ("NVIDIA H100 PCIe", "h100-pcie"),
        ("NVIDIA A100-SXM4-80GB", "a100-sxm-80gb"),
        ("NVIDIA B200", "b200"),
        ("NVIDIA GeForce RTX 4090", None),
        ("NVIDIA H100 NVL", None),
        ("NVIDIA A100-SXM4-40GB", None),
        ("NVIDIA GB200", None),
    ],
)
def test_gpu_for_device_name(device_name, gpu_id):
    gpu = gpu_for_device_name(device_name)
    assert (gpu.id if gpu else None) == gpu_id
