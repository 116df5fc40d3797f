"""The device-call tooling run here, on the CPU: tools/prepare_device.py's wheel lists stay closed
over what the project and the carried wheels need, its baseline export holds a commit's sources,
and tools/bench_compare.py reads bench_gpu.json runs into the A/B table tools/gpu_ab.sh prints;
tools/bench_allreduce.py sums exactly over CPU ranks."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
# The device machine's interpreter (the device tool's KINDS.md): markers are read for it.
DEVICE_MARKERS = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
                  "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython",
                  "platform_python_implementation": "CPython", "os_name": "posix", "extra": ""}


def _tool(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


prepare_device = _tool("prepare_device")
bench_compare = _tool("bench_compare")


def _names(names) -> set[str]:
    return {canonicalize_name(n) for n in names}


def _needs_on_device(package: str) -> set[str]:
    """What the installed distribution of package requires on the device (extras left out)."""
    needs = set()
    for line in metadata.requires(package) or ():
        requirement = Requirement(line)
        if requirement.marker is None or requirement.marker.evaluate(DEVICE_MARKERS):
            needs.add(canonicalize_name(requirement.name))
    return needs


def test_every_runtime_dependency_is_on_the_device_image_or_carried():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = _names(Requirement(line).name for line in project["dependencies"])
    covered = _names(prepare_device.ON_DEVICE) | _names(prepare_device.CARRIED)
    assert runtime - covered == set(), "add these to ON_DEVICE (if the image has them) or CARRIED"
    assert _names(prepare_device.ON_DEVICE) <= _names(prepare_device.IMAGE)


@pytest.mark.parametrize("group", ["CARRIED", "SERVER"])
def test_carried_wheels_need_only_what_travels_with_them_or_the_image_holds(group):
    carried = _names(prepare_device.CARRIED)
    travels = carried | (_names(prepare_device.SERVER) if group == "SERVER" else set())
    available = travels | _names(prepare_device.IMAGE)
    for package in getattr(prepare_device, group):
        missing = _needs_on_device(package) - available
        assert missing == set(), f"{package} needs {sorted(missing)} on the device: carry them in {group}"


def test_baseline_export_holds_a_commits_sources_and_nothing_else(tmp_path):
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, check=True, capture_output=True,
                          text=True).stdout.strip()
    dest = tmp_path / "base"
    (dest / "stale").mkdir(parents=True)  # an earlier baseline's files are replaced, not mixed in
    assert prepare_device.export_baseline("HEAD", dest) == head
    assert (dest / "REVISION").read_text().strip() == head
    assert sorted(p.name for p in dest.iterdir()) == sorted([*prepare_device.BASELINE_PATHS, "REVISION"])
    shown = subprocess.run(["git", "show", "HEAD:flare/contract.py"], cwd=ROOT, check=True,
                           capture_output=True).stdout
    assert (dest / "flare" / "contract.py").read_bytes() == shown


def test_an_unknown_baseline_is_refused(tmp_path):
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    with pytest.raises(subprocess.CalledProcessError):
        prepare_device.export_baseline("no-such-revision", tmp_path / "base")
    assert not (tmp_path / "base").exists()


BASE_RUNS = [{"bs1_ms_per_step": 3.8, "bs64_tok_s": 12400.0, "suite_a": {"output_tok_s": 4600, "ttft_p99_ms": 1900},
              "shape": "llama3-8b", "hf_compiled": False, "bs1_round_ms_p10_p50_p90": [3.7, 3.8, 3.9]},
             {"bs1_ms_per_step": 3.6, "bs64_tok_s": 12600.0, "suite_a": {"output_tok_s": 4700, "ttft_p99_ms": 1800}}]
NEW_RUNS = [{"bs1_ms_per_step": 3.5, "bs64_tok_s": 13000.0, "suite_a": {"output_tok_s": 5000}, "bs1_vs_floor": 1.04}]


def test_compare_takes_medians_of_each_side_and_reads_nested_figures():
    rows = {name: (a, b, ratio) for name, a, b, ratio in bench_compare.compare(BASE_RUNS, NEW_RUNS)}
    assert set(rows) == {"bs1_ms_per_step", "bs64_tok_s", "suite_a.output_tok_s", "suite_a.ttft_p99_ms",
                         "bs1_vs_floor"}  # strings, bools and lists are not figures
    assert rows["bs1_ms_per_step"][:2] == ([3.8, 3.6], [3.5])
    assert rows["bs1_ms_per_step"][2] == pytest.approx(3.5 / 3.7)
    assert rows["suite_a.output_tok_s"][2] == pytest.approx(5000 / 4650)
    assert rows["suite_a.ttft_p99_ms"] == ([1900.0, 1800.0], [], None)  # missing on one side: no ratio
    assert rows["bs1_vs_floor"] == ([], [1.04], None)
    kept = [row[0] for row in bench_compare.compare(BASE_RUNS, NEW_RUNS, ("suite_a.", "bs64"))]
    assert kept == ["bs64_tok_s", "suite_a.output_tok_s", "suite_a.ttft_p99_ms"]


def test_the_command_prints_the_table_and_refuses_an_empty_side(tmp_path):
    paths = {}
    for label, runs in (("A", BASE_RUNS), ("B", NEW_RUNS)):
        for i, run in enumerate(runs, 1):
            paths.setdefault(label, []).append(tmp_path / f"{label}{i}.json")
            paths[label][-1].write_text(json.dumps(run))
    tool = [sys.executable, str(ROOT / "tools" / "bench_compare.py")]
    done = subprocess.run([*tool, "--base", *map(str, paths["A"]), "--new", *map(str, paths["B"]),
                           "--keys", "bs"], capture_output=True, text=True, check=True)
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["figure", "base", "new", "new/base"]
    assert lines[1].split() == ["bs1_ms_per_step", "3.8", "/", "3.6", "3.5", "0.946"]
    assert lines[2].split() == ["bs1_vs_floor", "-", "1.04", "-"]
    assert lines[3].split() == ["bs64_tok_s", "12,400", "/", "12,600", "13,000", "1.040"]
    (tmp_path / "broken.json").write_text("{")
    refused = subprocess.run([*tool, "--base", str(tmp_path / "broken.json"), "--new", *map(str, paths["B"])],
                             capture_output=True, text=True)
    assert refused.returncode == 1 and "no readable run" in refused.stderr and "broken.json" in refused.stderr


def test_the_all_reduce_benchmark_sums_exactly_over_cpu_ranks(tmp_path):
    """tools/bench_allreduce.py's CPU smoke run: two gloo ranks, each size summed exactly, the table
    and allreduce.json written (the GPU run adds the symmetric-memory methods and graphs)."""
    done = subprocess.run([sys.executable, str(ROOT / "tools" / "bench_allreduce.py"), "--backend", "gloo",
                           "--rows", "1,8", "--hidden", "256", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads((tmp_path / "allreduce.json").read_text())["results"]
    assert [(r["dtype"], r["rows"], r["method"]) for r in results] == [
        ("bf16", 1, "gloo"), ("bf16", 8, "gloo"), ("fp32", 1, "gloo"), ("fp32", 8, "gloo")]
    assert all(r["exact"] and r["us"] > 0 for r in results)
    assert "gloo" in done.stdout
