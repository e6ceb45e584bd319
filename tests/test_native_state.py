"""The live state: carried inside the library, read through the latch, written by one writer.

A state whose counter a killed writer left odd must not cost readers anything (they answer
from the intact copy), the next writer or a re-run of host setup repairs it, two writers
serialise, and 16 reader threads never see a torn update while a writer applies 10 000.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import Staged

from gpumodel import native, profile, state
from hostsetup import node

NATIVE = Path(__file__).resolve().parent.parent / "native"


def live_copy(staged: Staged, tmp_path: Path) -> Path:
    """A private copy of a staged library (with the state it carries) to scribble on."""
    live = tmp_path / "libnvidia-ml.so.1"
    shutil.copyfile(staged.root.library, live)
    return live


def region_offset(path: Path) -> int:
    fd = os.open(path, os.O_RDONLY)
    try:
        return state.locate(fd, str(path))[0]
    finally:
        os.close(fd)


def seq_of(path: Path) -> int:
    at = region_offset(path) + state.ffi().offsetof("mokka_header_t", "seq")
    with open(path, "rb") as fh:
        fh.seek(at)
        return int.from_bytes(fh.read(4), "little")


def kill_writer_midway(path: Path) -> None:
    """Leave what a writer killed while rewriting copy 0 leaves: an odd counter and a
    half-written copy 0 (here: garbage over its first GPU record, name included)."""
    f = state.ffi()
    base = region_offset(path)
    copy0 = base + f.sizeof("mokka_header_t") + f.sizeof("mokka_node_t")
    with open(path, "r+b") as fh:
        fh.seek(base + f.offsetof("mokka_header_t", "seq"))
        fh.write((1).to_bytes(4, "little"))
        fh.seek(copy0)
        fh.write(b"\xff" * f.sizeof("mokka_gpu_t"))


def test_the_library_carries_its_state(tmp_path: Path, stage: Callable[..., Staged]) -> None:
    """The staged libnvidia-ml.so.<version> alone, copied anywhere, still shows the node."""
    staged = stage("h100", 2)
    alone = tmp_path / "lib"
    alone.mkdir()
    shutil.copyfile(staged.root.library, alone / "libnvidia-ml.so.1")
    code = (
        "import pynvml as N; N.nvmlInit()\n"
        "print(N.nvmlDeviceGetCount(), N.nvmlDeviceGetName(N.nvmlDeviceGetHandleByIndex(1)))"
    )
    res = subprocess.run(
        [sys.executable, "-c", code],
        env={"PATH": os.environ["PATH"], "LD_LIBRARY_PATH": str(alone)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert res.stdout.split(maxsplit=1) == ["2", staged.profile.gpu.name + "\n"]
    assert not list(alone.rglob("*.bin"))


def test_a_build_without_state_says_so(tmp_path: Path) -> None:
    lib = tmp_path / "libnvidia-ml.so.1"
    shutil.copyfile(native.library_path(), lib)
    res = subprocess.run(
        [sys.executable, "-c", "import pynvml as N; N.nvmlInit()"],
        env={"PATH": os.environ["PATH"], "LD_LIBRARY_PATH": str(tmp_path)},
        capture_output=True,
        text=True,
    )
    assert res.returncode != 0
    assert (
        f"mokka: cannot use state file {lib}: not a Mokka state file (bad magic), nor a library carrying one"
        in res.stderr
    )


def test_mokka_state_naming_a_directory(tmp_path: Path, stage: Callable[..., Staged]) -> None:
    res = stage("h100").python("import pynvml as N; N.nvmlInit()", check=False, MOKKA_STATE=str(tmp_path))
    assert res.returncode != 0
    assert f"mokka: cannot use state file {tmp_path}: is a directory; MOKKA_STATE names a state file" in res.stderr
    assert "No such device" not in res.stderr


@pytest.mark.consumers
def test_stuck_counter_costs_readers_nothing(
    tmp_path: Path, stage: Callable[..., Staged], smi: tuple[str, Path]
) -> None:
    """A writer killed mid-update: nvidia-smi -q answers in full from the intact copy."""
    staged = stage("h100", 2)
    live = live_copy(staged, tmp_path)
    kill_writer_midway(live)
    res = staged.run([str(smi[1]), "-q"], MOKKA_STATE=str(live), timeout=60)
    names = [ln.split(":", 1)[1].strip() for ln in res.stdout.splitlines() if ln.strip().startswith("Product Name")]
    assert names == [staged.profile.gpu.name] * 2, res.stdout[-2000:]
    assert seq_of(live) == 1  # readers never write


def test_the_next_writer_repairs_a_stuck_counter(tmp_path: Path, stage: Callable[..., Staged]) -> None:
    staged = stage("h100", 2)
    live = live_copy(staged, tmp_path)
    good = state.read(live)
    kill_writer_midway(live)

    def cool(node: object, gpus: object) -> None:
        gpus[0].temp_gpu = 33  # type: ignore[index]

    state.update(live, cool)
    assert seq_of(live) % 2 == 0
    region = state.read(live)
    f = state.ffi()
    hsize, copy = f.sizeof("mokka_header_t"), (len(good) - f.sizeof("mokka_header_t")) // 2
    assert region[hsize : hsize + copy] == region[hsize + copy :], "both copies hold the repaired state"
    # the cast keeps no reference to its source: the buffer must outlive `first`
    gpus_raw = f.from_buffer(bytearray(region[hsize + f.sizeof("mokka_node_t") :]))
    first = f.cast("mokka_gpu_t *", gpus_raw)
    assert f.string(first[0].name).decode() == staged.profile.gpu.name and first[0].temp_gpu == 33


def test_host_setup_rerun_repairs_a_stuck_counter(tmp_path: Path) -> None:
    root = tmp_path / "root"
    prof = profile.load("t4")
    node.apply(node.plan(prof, node.Options(root=root)))
    lib = root / "driver/usr/lib64" / f"libnvidia-ml.so.{prof.driver.version}"
    inode = lib.stat().st_ino
    kill_writer_midway(lib)
    node.apply(node.plan(prof, node.Options(root=root)))
    assert seq_of(lib) % 2 == 0
    fresh = bytearray(state.compile_profile(prof))
    repaired = bytearray(state.read(lib))
    seq = state.ffi().offsetof("mokka_header_t", "seq")
    repaired[seq : seq + 4] = fresh[seq : seq + 4]
    assert repaired == fresh
    assert lib.stat().st_ino == inode, "repaired in place: containers keep the inode they mounted"
    node.cleanup(root)


COUNTER = """
import sys
from pathlib import Path
from gpumodel import state
def bump(node, gpus):
    gpus[0].events.count += 1
for _ in range(int(sys.argv[2])):
    state.update(Path(sys.argv[1]), bump)
"""


def test_two_writers_serialise(tmp_path: Path, stage: Callable[..., Staged]) -> None:
    """Read-modify-write from two processes at once: no update is lost."""
    live = live_copy(stage("h100", 1), tmp_path)
    writers = [subprocess.Popen([sys.executable, "-c", COUNTER, str(live), "400"]) for _ in range(2)]
    assert [w.wait(timeout=120) for w in writers] == [0, 0]
    f = state.ffi()
    region = bytearray(state.read(live))
    gpus = f.cast("mokka_gpu_t *", f.from_buffer(region) + f.sizeof("mokka_header_t") + f.sizeof("mokka_node_t"))
    assert gpus[0].events.count == 800
    node_ = f.cast("mokka_node_t *", f.from_buffer(region) + f.sizeof("mokka_header_t"))
    assert node_.generation == 800


@pytest.fixture(scope="module")
def torn_readers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    build = tmp_path_factory.mktemp("build")
    subprocess.run(
        ["make", "-s", "-C", str(NATIVE), f"BUILD={build}", f"PYTHON={sys.executable}", f"{build}/test/torn_readers"],
        check=True,
    )
    return build / "test/torn_readers"


def test_sixteen_readers_never_see_a_torn_update(
    tmp_path: Path, stage: Callable[..., Staged], torn_readers: Path
) -> None:
    """16 reader threads while a writer applies 10 000 updates: 0 torn reads."""
    staged = stage("h100", 1)
    live = live_copy(staged, tmp_path)
    inode = live.stat().st_ino

    def change(n: int) -> Callable[[object, object], None]:
        def apply(node: object, gpus: object) -> None:
            g = gpus[0]  # type: ignore[index]
            g.mem_used = g.mem_reserved = n << 20
            g.n_procs = 12
            for i in range(12):
                g.procs[i].pid, g.procs[i].type, g.procs[i].used_memory = n, 0, n << 20

        return apply

    state.update(live, change(1))  # the invariants hold from the start
    readers = subprocess.Popen(
        [str(torn_readers), str(live)],
        env={"MOKKA_STATE": str(live), "MOKKA_IGNORE_DEVICE_NODES": "1"},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: os.nice(19),  # 16 spinning threads on a small machine: leave the writer its CPU
    )
    assert readers.stdout is not None and readers.stdin is not None
    try:
        assert readers.stdout.readline().strip() == "ready"
        for n in range(2, 10_002):
            state.update(live, change(n))
    finally:
        readers.stdin.close()
        out = readers.stdout.read()
        readers.wait(timeout=60)
    reads, torn, values = (int(x) for x in out.split()[1::2])
    assert torn == 0, out
    assert reads > 10_000 and values > 100, f"the readers must overlap the writer: {out}"
    assert live.stat().st_ino == inode, "updates rewrite in place, never replace the file"


HOLD_LOCK = """
import sys, time
from pathlib import Path
from gpumodel import state
with state.locked(Path(sys.argv[1])):
    print("locked", flush=True)
    time.sleep(600)
"""


def test_a_killed_writer_does_not_block_the_next(tmp_path: Path, stage: Callable[..., Staged]) -> None:
    live = live_copy(stage("h100", 1), tmp_path)
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(live)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
    holder.kill()  # SIGKILL while holding the writer lock
    holder.wait(timeout=10)
    res = subprocess.run([sys.executable, "-c", COUNTER, str(live), "1"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
