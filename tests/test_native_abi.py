"""ABI safety: every versioned NVML export (and its unversioned legacy name) writes no
more than its own version's struct.

``native/test/abi_canary.c`` calls each into a buffer of exactly that size, followed by
canary bytes and then ending at a guard page; this test runs it on two profiles and checks
that it covers every versioned name the library implements (stubs write nothing).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import Staged

from gpumodel import faults, native, state

NATIVE = Path(__file__).resolve().parent.parent / "native"
VERSIONED = re.compile(r"(_v\d+|V)$")


@pytest.fixture(scope="module")
def canary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    build = tmp_path_factory.mktemp("build")
    subprocess.run(
        ["make", "-s", "-C", str(NATIVE), f"BUILD={build}", f"PYTHON={sys.executable}", f"{build}/test/abi_canary"],
        check=True,
    )
    return build / "test/abi_canary"


def implemented_versioned() -> set[str]:
    """Versioned exports the library implements, and the legacy names they version."""
    out = subprocess.run(
        ["nm", "-D", "--defined-only", str(native.library_path())], check=True, capture_output=True, text=True
    ).stdout
    names = {line.split()[-1] for line in out.splitlines()}
    stubs = set(re.findall(r"STUB int (\w+)\(", (native.library_path().parent / "stubs.c").read_text()))
    implemented = names - stubs
    versioned = {n for n in implemented if VERSIONED.search(n)}
    bases = {VERSIONED.sub("", n) for n in versioned}
    return versioned | (implemented & bases)


def run_canaries(exe: Path, staged: Staged, tmp_path: Path) -> list[str]:
    """Run the canary program against a copy of the staged state in which GPU 0 has two
    processes of each kind; record a new Xid whenever it asks."""
    live = tmp_path / "libnvidia-ml.so.1"
    shutil.copyfile(staged.root.library, live)

    def processes(node: object, gpus: object) -> None:
        g = gpus[0]  # type: ignore[index]
        g.n_procs = 6
        for i in range(6):
            g.procs[i].pid, g.procs[i].type, g.procs[i].used_memory = 4000 + i, i // 2, 1 << 30

    def xid(node: object, gpus: object) -> None:
        faults.raise_event(node, gpus[0], faults.EVENT_XID, 79)  # type: ignore[index]

    state.update(live, processes)
    proc = subprocess.Popen(
        [str(exe), str(native.library_path())],
        env={"MOKKA_STATE": str(live), "MOKKA_IGNORE_DEVICE_NODES": "1"},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdin is not None and proc.stderr is not None
    lines = []
    for line in proc.stdout:
        if line.strip() == "bump":
            state.update(live, xid)
            proc.stdin.write("go\n")
            proc.stdin.flush()
        else:
            lines.append(line.strip())
    err = proc.stderr.read()
    rc = proc.wait(timeout=60)
    last = err.strip().splitlines()[-1:] if err.strip() else []
    assert rc == 0, f"exit {rc} (a negative one is a signal: the guard page was hit) after {last}\n" + "\n".join(lines)
    return lines


@pytest.mark.parametrize("name", ["h100", "gb200"])
def test_no_versioned_entry_point_writes_past_its_struct(
    name: str, canary: Path, stage: Callable[..., Staged], tmp_path: Path
) -> None:
    lines = run_canaries(canary, stage(name, 2), tmp_path)
    clobbered = [ln for ln in lines if not ln.endswith(" ok")]
    assert not clobbered, clobbered
    # Calls that succeed actually wrote (the sizes were exercised, not skipped).
    rc = {ln.split()[0]: ln.split()[3] for ln in lines if " canaries " in ln}
    for written in ("nvmlDeviceGetPciInfo_v2", "nvmlDeviceGetComputeRunningProcesses", "nvmlEventSetWait"):
        assert rc[written] == "rc=0", lines
    mig = [ln for ln in lines if "Instance" in ln]  # the MIG calls, on GPU 1
    assert len(mig) == 2 * 12 and all(" rc=0 " in ln for ln in mig), mig


def test_every_versioned_export_is_covered(canary: Path) -> None:
    source = (NATIVE / "test/abi_canary.c").read_text()
    covered = set(re.findall(r'both\("(\w+)', source)) | set(re.findall(r'probe\("(\w+)', source))
    missing = implemented_versioned() - covered
    assert not missing, f"versioned exports without an ABI canary: {sorted(missing)}"


LEGACY_PCI = r"""
import ctypes, gc, pynvml as N
N.nvmlInit()
h = N.nvmlDeviceGetHandleByIndex(0)
for name in ("nvmlDeviceGetPciInfo", "nvmlDeviceGetPciInfo_v2"):
    for _ in range(200):
        info = N.nvmlPciInfo_v2_t()  # nvidia-ml-py's own 52-byte legacy layout, on the heap
        N._nvmlCheckReturn(N._nvmlGetFunctionPointer(name)(h, ctypes.byref(info)))
        assert str(info.busId).count(":") == 2, info.busId
    del info
gc.collect()
N.nvmlShutdown()
print("clean")
"""


@pytest.mark.consumers
def test_legacy_pci_info_under_a_debug_allocator(stage: Callable[..., Staged]) -> None:
    """The legacy layout through nvidia-ml-py's ctypes struct, with CPython's debug allocator
    checking every heap block: a write past the 52 bytes aborts the interpreter."""
    res = stage("h100", 2).python(LEGACY_PCI, check=False, PYTHONMALLOC="debug")
    assert res.returncode == 0 and res.stdout.strip() == "clean", res.stderr[-2000:]
