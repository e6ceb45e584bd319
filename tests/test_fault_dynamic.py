"""Time-varying metrics from the profile (no daemon), the Samples API's history, an
nvidia-smi-based exporter watching power change, and 16 readers under 10 000 faults."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from conftest import Staged

from gpumodel import driver_root, faults, profile
from gpumodel import faultspec as fs

NATIVE = Path(__file__).resolve().parent.parent / "native"


def dynamic_profile(
    name: str, count: int, dynamic: dict[str, Any], gpus: dict[int, Any] | None = None
) -> profile.Profile:
    data = profile.load(name).with_count(count).model_dump()
    data["gpu"]["dynamic"] = dynamic
    data["gpus"] = gpus or {}
    return profile.Profile.model_validate(data)


def stage(tmp_path: Path, prof: profile.Profile, where: str = "root") -> Staged:
    return Staged(driver_root.stage(prof, tmp_path / where), prof)


SAMPLES = r"""
import json, sys, pynvml as N
N.nvmlInit()
out = {}
for i in range(N.nvmlDeviceGetCount()):
    h = N.nvmlDeviceGetHandleByIndex(i)
    _, samples = N.nvmlDeviceGetSamples(h, int(sys.argv[1]), 0)
    out[i] = [(s.timeStamp, s.sampleValue.uiVal) for s in samples]
print(json.dumps(out))
"""


def samples(staged: Staged, kind: int = 0) -> dict[str, list[list[int]]]:
    """Every GPU's samples of one type (0: power), as [timestamp, value] pairs."""
    res = staged.run([sys.executable, "-c", SAMPLES, str(kind)], MOKKA_IGNORE_DEVICE_NODES="1")
    data: dict[str, list[list[int]]] = json.loads(res.stdout)
    return data


def test_a_sine_power_draw_moves_and_its_samples_are_a_consistent_history(tmp_path: Path) -> None:
    prof = dynamic_profile(
        "h100", 2, {"seed": 3, "power_w": {"pattern": "sine", "mean": 400, "amplitude": 200, "period_s": 4}}
    )
    node = stage(tmp_path, prof)
    code = (
        "import pynvml as N, time; N.nvmlInit(); h = N.nvmlDeviceGetHandleByIndex(0); seen = set()\n"
        "while len(seen) < 5:\n    seen.add(N.nvmlDeviceGetPowerUsage(h)); time.sleep(0.05)\n"
        "print(min(seen) >= 200000, max(seen) <= 600000)"
    )
    assert node.python(code).stdout.split() == ["True", "True"]
    first = samples(node)
    second = samples(node)
    for gpu in ("0", "1"):
        assert len(first[gpu]) == 120
        stamps = [t for t, _ in first[gpu]]
        assert stamps == sorted(stamps) and len(set(stamps)) == 120
        assert all(200_000 <= v <= 600_000 for _, v in first[gpu])
        again = dict(map(tuple, second[gpu]))  # type: ignore[arg-type]
        common = [(t, v) for t, v in first[gpu] if t in again]
        assert common and all(again[t] == v for t, v in common), "the same instant has the same value"
    assert first["0"] != first["1"], "each GPU draws its own stream from the seed"


def test_the_same_seed_gives_the_same_series_on_two_nodes(tmp_path: Path) -> None:
    dyn = {"seed": 11, "temperature_c": {"pattern": "walk", "low": 35, "high": 80, "step_s": 0.5},
           "power_w": {"pattern": "sine", "mean": 300, "amplitude": 50, "period_s": 7}}  # fmt: skip
    a = stage(tmp_path, dynamic_profile("h100", 2, dyn), "a")
    b = stage(tmp_path, dynamic_profile("h100", 2, dyn), "b")
    c = stage(tmp_path, dynamic_profile("h100", 2, {**dyn, "seed": 12}), "c")
    sa, sb, sc = samples(a), samples(b), samples(c)
    for gpu in ("0", "1"):
        in_b, in_c = dict(map(tuple, sb[gpu])), dict(map(tuple, sc[gpu]))  # type: ignore[arg-type]
        common = [(t, v) for t, v in sa[gpu] if t in in_b]
        assert len(common) > 100 and all(in_b[t] == v for t, v in common)
        assert any(in_c.get(t) != v for t, v in sa[gpu]), "another seed, another series"


def test_busy_follows_the_processes(tmp_path: Path) -> None:
    dyn = {"utilization_gpu": {"pattern": "busy", "idle": 0, "busy": 93},
           "memory_used_mib": {"pattern": "busy", "idle": 0, "busy": 30000}}  # fmt: skip
    busy = {1: {"processes": [{"pid": 4242, "name": "python3", "used_memory_mib": 30000}]}}
    node = stage(tmp_path, dynamic_profile("h100", 2, dyn, busy))
    code = (
        "import pynvml as N; N.nvmlInit()\n"
        "for i in range(2):\n    h = N.nvmlDeviceGetHandleByIndex(i)\n"
        "    print(N.nvmlDeviceGetUtilizationRates(h).gpu, N.nvmlDeviceGetMemoryInfo(h).used // 2**20)"
    )
    lines = [line.split() for line in node.python(code).stdout.splitlines()]
    assert lines[0][0] == "0" and lines[1][0] == "93"
    assert int(lines[1][1]) >= 30000 > int(lines[0][1])


def test_nvidia_smi_prints_the_sample_blocks(tmp_path: Path, smi: tuple[str, Path]) -> None:
    prof = dynamic_profile("h100", 1, {"power_w": {"pattern": "walk", "low": 100, "high": 600, "step_s": 1}})
    node = stage(tmp_path, prof)
    out = node.run([str(smi[1]), "-q", "-d", "UTILIZATION,POWER"]).stdout
    block = out[out.index("Power Samples") :]
    assert "Number of Samples                 : 120" in block
    values = [
        line.split(":")[1].strip() for line in block.splitlines()[1:6] if line.strip().startswith(("Max", "Min", "Avg"))
    ]
    assert len(values) == 3 and all(v.endswith(" W") and 100 <= float(v.split()[0]) <= 600 for v in values), block


def test_a_pattern_that_does_not_fit_the_board_is_refused() -> None:
    cases = [
        ({"memory_used_mib": {"pattern": "constant", "value": 10**6}}, "h100",
         "gpu.dynamic.memory_used_mib: reaches beyond memory.total_mib - memory.reserved_mib"),
        ({"utilization_gpu": {"pattern": "sine", "mean": 90, "amplitude": 20, "period_s": 5}}, "h100",
         "gpu.dynamic.utilization_gpu: the pattern reaches 70..110 %, outside 0..100"),
        ({"power_w": {"pattern": "walk", "low": 5, "high": 1, "step_s": 1}}, "h100",
         "gpu.dynamic.power_w.walk: need low <= high"),
        ({"power_w": {"pattern": "square"}}, "h100", "gpu.dynamic.power_w: Input tag 'square' found"),
    ]  # fmt: skip
    for dyn, name, problem in cases:
        data = profile.load(name).model_dump()
        data["gpu"]["dynamic"] = dyn
        with pytest.raises(profile.ProfileError) as exc:
            profile.load_text(json.dumps(data), "p.yaml")
        assert problem in str(exc.value), str(exc.value)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.consumers
def test_an_nvidia_smi_exporter_sees_power_change_over_time(tmp_path: Path, smi: tuple[str, Path]) -> None:
    """gpu-watchdog (PyPI) runs nvidia-smi --query-gpu on every scrape of /metrics."""
    _version, exe = smi
    prof = dynamic_profile("h100", 2, {"power_w": {"pattern": "sine", "mean": 350, "amplitude": 250, "period_s": 3}})
    node = stage(tmp_path, prof)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "nvidia-smi").symlink_to(exe)
    port = free_port()
    env = node.env(PATH=f"{bindir}:/usr/bin:/bin", CHECK_INTERVAL="3600", HOME=str(tmp_path))
    proc = subprocess.Popen([sys.executable, "-m", "gpu_monitor", "--web", str(port)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:

        def scrape() -> dict[str, float]:
            for _ in range(200):
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                        text = r.read().decode()
                    break
                except OSError:
                    time.sleep(0.1)
            else:
                raise AssertionError("the exporter never answered")
            return {
                line.split("{")[1].split(",")[0]: float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith("gpu_power_watts{")
            }

        seen: list[dict[str, float]] = []
        while len({s.get('gpu="0"') for s in seen}) < 3:
            seen.append(scrape())
            assert len(seen) < 100, seen
            time.sleep(0.2)
        assert all(100 <= v <= 600 for s in seen for v in s.values()), seen
        target = faults.for_driver_root(node.root.root)
        faults.apply(target, [(faults.gpus(target)[1:], fs.Power(watts=42))])
        assert scrape()['gpu="1"'] == 42.0, "a fault overrides the pattern at the next scrape"
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def fault_readers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    build = tmp_path_factory.mktemp("build")
    subprocess.run(
        ["make", "-s", "-C", str(NATIVE), f"BUILD={build}", f"PYTHON={sys.executable}", f"{build}/test/fault_readers"],
        check=True,
    )
    return build / "test/fault_readers"


def test_sixteen_readers_see_no_torn_read_under_ten_thousand_faults(tmp_path: Path, fault_readers: Path) -> None:
    node = stage(tmp_path, profile.load("h100").with_count(2))
    target = faults.Target(node.root.library, None)
    gpu0 = faults.gpus(target)[:1]
    proc = subprocess.Popen(
        [str(fault_readers), str(node.root.library)],
        env={"MOKKA_IGNORE_DEVICE_NODES": "1"},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: os.nice(19),  # 17 busy threads on a small machine: leave the writer its CPU
    )
    assert proc.stdout is not None and proc.stdin is not None
    assert proc.stdout.readline().strip() == "ready"
    utilization = [fs.Utilization(gpu=u, memory=u) for u in range(101)]
    rows = fs.Remap(correctable=1, uncorrectable=1, pending=False)
    ecc = fs.Ecc(corrected=1, location="l2")  # a corrected error raises no Xid
    for i in range(10_000):
        orders: list[faults.Order] = [(gpu0, utilization[i % 101]), (gpu0, rows), (gpu0, ecc)]
        if i % 20 == 0:
            orders.append((gpu0, fs.Xid(code=100 + i // 20)))  # counting up, clear of 79 (lost)
        faults.apply(target, orders)
    out, _ = proc.communicate("", timeout=120)
    words = out.split()
    got = dict(zip(words[::2], (int(w) for w in words[1::2]), strict=True))
    assert got["torn"] == 0 and got["disorder"] == 0, out
    assert got["reads"] > 0 and got["values"] > 1 and got["events"] > 0, "the readers overlapped the writer"
