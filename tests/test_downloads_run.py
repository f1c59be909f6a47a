"""The downloads run outside the repository (issue 19): one post of each kind is copied from the
built site into a fresh folder under the system's temporary directory and run there by this
interpreter, with the handbook's code installed from the wheel that the download names. On the
GPU, `nox -s gpu_docs` runs every post's download the same way (tests/downloads_run.py)."""

import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests import downloads_run as dr
from tests.test_built_site import site  # noqa: F401  (the built site: a fixture)

ROOT = Path(__file__).resolve().parents[1]
KINDS = {
    "kv-cache": "formulas, data files and computed records",
    "triton-kernels": "Triton kernels in the interpreter (fp32 on the CPU)",
    "gradient-accumulation": "gloo ranks from torch.multiprocessing's forkserver",
}
CPU = {"TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}


def installed(site: Path, where: Path) -> list[str]:  # noqa: F811
    """The wheel that the kv-cache download names, installed into `where`."""
    script = (site / "downloads" / "kv-cache.py").read_text(encoding="utf-8")
    return dr.install(site / "downloads" / dr.wheel_named_in(script), where)


@pytest.fixture(scope="module")
def runs(site, tmp_path_factory):  # noqa: F811
    base = tmp_path_factory.mktemp("downloads")
    assert not base.resolve().is_relative_to(ROOT), f"{base} lies inside the repository"
    path = installed(site, base / "site-packages")
    with ThreadPoolExecutor(len(KINDS)) as pool:  # they share the cores; about 25 s in all
        futures = {
            slug: pool.submit(dr.run, site / "downloads" / f"{slug}.py", base / slug, path,
                              env=CPU, timeout=300)
            for slug in KINDS
        }  # fmt: skip
        return {slug: f.result() for slug, f in futures.items()}


@pytest.mark.slow  # about 25 s: three posts' code, two of them in worker processes or Triton
@pytest.mark.parametrize("slug", KINDS)
def test_a_download_runs_outside_the_repository(runs, slug):
    run = runs[slug]
    assert not run.problems, f"{slug} ({KINDS[slug]}):\n{run.report()}"
    if slug == "triton-kernels":  # its benchmark needs CUDA: skipped with a line, not an error
        assert "skipped snippets/triton_kernels/bench_gpu.py: needs CUDA" in run.output


@pytest.mark.slow  # one short run: the first cell of a download and the planted faults
def test_the_run_check_sees_planted_faults(site, tmp_path):  # noqa: F811
    """A download that fails, prints a figure differing from the record, writes into its folder
    and changes an installed record: each is reported, with the page and the output's tail."""
    script = (site / "downloads" / "kv-cache.py").read_text(encoding="utf-8")
    cells = script.split("\n# %%")
    first_code = next(i for i, c in enumerate(cells) if i and not c.startswith(" [markdown]"))
    planted = "\n# %%".join(cells[: first_code + 1]) + (
        "\n# %%\n"
        "from snippets.common.results import computed_result\n"
        'computed_result("kv-cache", "formulas", {"opt_token_kib": 1})\n'
        'open("stray.txt", "w").close()\n'
        'with open(download.path("results/kv-cache/prefix.json"), "a") as f:\n'
        '    f.write(" ")\n'
        'raise RuntimeError("planted fault")\n'
    )
    copy = tmp_path / "site" / "downloads" / "kv-cache.py"
    copy.parent.mkdir(parents=True)
    copy.write_text(planted, encoding="utf-8")
    path = installed(site, tmp_path / "site-packages")
    run = dr.run(copy, tmp_path / "run", path, env=CPU, timeout=120)
    report = run.report()
    assert report.startswith("downloads/kv-cache.py: exited with 1; "), report
    for problem in ("a computed figure differs from the page's published record",
                    "wrote stray.txt into its folder",
                    "changed the installed results/kv-cache/prefix.json",
                    "RuntimeError: planted fault"):  # fmt: skip
        assert problem in report, report
    shutil.rmtree(tmp_path / "site-packages")
