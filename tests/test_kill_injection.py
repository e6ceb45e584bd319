"""SIGKILL `mokka host setup`, `mokka host cleanup` and `mokka containerd-config install` at every
step boundary of their journal and at random moments, then converge: `setup` + `cleanup`, or
`cleanup` alone, leaves the host byte-identical to before (files, links, directories, modes,
owners, times, device nodes, a fake /run/nvidia), and a second `cleanup` has nothing to do.

Step boundaries are exact and reproducible: ``MOKKA_JOURNAL_KILL_AT=N`` makes the process kill
itself at its Nth boundary; N runs from 1 until a run completes, so every boundary is hit.
Random kills come from outside at seeded random delays. The commands run as real processes
(forked from the test, Mokka already imported, so a run costs milliseconds, not an interpreter
start), on tmpfs where there is one; one test runs the CLI the ordinary way.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import random
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from hostsetup.journal import KILL_ENV
from mokka.cli import main

pytestmark = [pytest.mark.slow, pytest.mark.root]

SEED = 20240610
LONG_AGO = 1_600_000_000 * 10**9
PROFILE = ["--profile", "t4", "--majors", "real"]
V3 = '# site config\nversion = 3\n\n[plugins."io.containerd.nri.v1.nri"]\n  disable = true  # not yet\n'
V2 = '# site config\nversion = 2\n[plugins."io.containerd.grpc.v1.cri"]\n  sandbox_image = "pause:3.9"\n'


@pytest.fixture(autouse=True)
def _needs_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("host setup makes device nodes: needs root")


class Mokka:
    """Runs `mokka ...` in a child process forked from this one (Mokka imported and its caches warm,
    so a run costs milliseconds); returns (exit code, output), -9 meaning killed."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.runs = 0
        from gpumodel import profile, state

        state.compile_profile(profile.load("t4"))  # imports and parses what every run needs, once

    def __call__(self, *args: str, kill_at: int | None = None, kill_after: float | None = None) -> tuple[int, str]:
        self.runs += 1
        log = self.logs / f"run-{self.runs}.log"
        pid = os.fork()
        if pid == 0:  # the child: `mokka ARGS`, output into the log, never back into pytest
            code = 70
            try:
                fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(fd, 1)
                os.dup2(fd, 2)
                sys.stdout = sys.stderr = open(fd, "w", buffering=1, closefd=False)  # noqa: SIM115 (pytest's capture)
                if kill_at is not None:
                    os.environ[KILL_ENV] = str(kill_at)
                try:
                    main(list(args), prog_name="mokka")
                    code = 0
                except SystemExit as exc:
                    code = exc.code if isinstance(exc.code, int) else 1
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)
        if kill_after is not None:
            time.sleep(kill_after)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        return os.waitstatus_to_exitcode(status), log.read_text() if log.exists() else ""  # killed before it began

    def ok(self, *args: str) -> str:
        code, out = self(*args)
        assert code == 0, f"mokka {' '.join(args)} exited {code}:\n{out}"
        return out


@pytest.fixture
def scratch(tmp_path: Path) -> Iterator[Path]:
    """A directory on tmpfs where there is one: fsync costs nothing there, and a kill is a kill."""
    shm = Path("/dev/shm")
    if not shm.is_dir():
        yield tmp_path
        return
    path = Path(tempfile.mkdtemp(prefix="mokka-kill-", dir=shm))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def mokka(tmp_path: Path) -> Mokka:
    logs = tmp_path / "logs"
    logs.mkdir()
    return Mokka(logs)


def snapshot(top: Path, *, times: bool = True, skip: tuple[str, ...] = ()) -> dict[str, tuple[object, ...]]:
    """Every path under ``top``: type, mode, owner, and bytes / link target / device number (and times)."""
    out: dict[str, tuple[object, ...]] = {}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in sorted(dirnames + filenames):
            p = Path(dirpath) / name
            rel = str(p.relative_to(top))
            st = p.lstat()
            rel = re.sub(r"\.mokka-[0-9a-f]{16}", ".mokka-RANDOM", rel)  # names of saved originals
            row: tuple[object, ...] = (stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid)
            if stat.S_ISLNK(st.st_mode):
                row += (os.readlink(p),)
            elif stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
                row += (os.major(st.st_rdev), os.minor(st.st_rdev))
            elif stat.S_ISREG(st.st_mode):
                row += (st.st_nlink, "" if rel in skip else hashlib.sha256(p.read_bytes()).hexdigest())
            if times and not stat.S_ISDIR(st.st_mode):
                row += (st.st_mtime_ns,)
            out[rel] = row
    return out


# --------------------------------------------------------------------------- host setup


class Host:
    """A fake host under ``base``: a Mokka root and a /run/nvidia, in one of a few starting states."""

    def __init__(self, base: Path, smi: Path) -> None:
        self.base = base
        self.smi = smi
        self.root = base / "var/lib/mokka"
        self.run = base / "run/nvidia"

    def fresh(self) -> None:
        """Nothing there yet: root and /run/nvidia and their parents are missing."""
        shutil.rmtree(self.base, ignore_errors=True)
        self.base.mkdir(parents=True)

    def lived_in(self) -> None:
        """A root with someone's files (even a node.json) and a /run/nvidia/driver link of another driver."""
        self.fresh()
        self.root.mkdir(parents=True)
        (self.root / "notes.txt").write_text("keep me\n")
        (self.root / "node.json").write_text('{"someone": "else"}\n')
        os.chown(self.root / "node.json", 4321, 4321)
        os.chmod(self.root / "node.json", 0o600)
        self.run.mkdir(parents=True)
        os.symlink("/opt/old-driver", self.run / "driver")
        os.lchown(self.run / "driver", 1234, 1234)
        for path in (self.root / "notes.txt", self.root / "node.json", self.run / "driver"):
            os.utime(path, ns=(LONG_AGO, LONG_AGO), follow_symlinks=False)  # the same every time it is prepared

    def setup_args(self, gpus: int = 2) -> list[str]:
        return [
            "host",
            "setup",
            *PROFILE,
            "--gpus",
            str(gpus),
            "--root",
            str(self.root),
            "--nvidia-smi",
            str(self.smi),
            "--run-nvidia",
            str(self.run),
            "--toolkit-ready",
        ]

    def cleanup_args(self) -> list[str]:
        return ["host", "cleanup", "--root", str(self.root)]

    def snapshot(self, *, times: bool = True) -> dict[str, tuple[object, ...]]:
        return snapshot(self.base, times=times, skip=("var/lib/mokka/.mokka/journal.jsonl",))


@pytest.fixture
def host(scratch: Path) -> Host:
    smi = scratch / "nvidia-smi"
    smi.write_bytes(b"\x7fELF a stand-in binary: staged, never run\n")
    return Host(scratch / "host", smi)


def boundaries(run: Callable[[int], int]) -> Iterator[int]:
    """1, 2, 3... until a run completes without reaching its boundary."""
    n = 1
    while True:
        code = run(n)
        if code == 0:
            return
        assert code == -signal.SIGKILL, f"kill point {n}: exit {code}"
        yield n
        n += 1


def converge(mokka: Mokka, host: Host, prepare: Callable[[], None], killed: list[str], *, rerun: list[str]) -> int:
    """Kill ``killed`` at every boundary; then cleanup alone, and ``rerun`` + cleanup: both end at the start.

    ``rerun`` must also end in the same host as an uninterrupted run. Returns the number of boundaries.
    """
    prepare()
    before = host.snapshot()
    mokka.ok(*rerun)
    expected = host.snapshot(times=False)
    mokka.ok(*host.cleanup_args())
    assert host.snapshot() == before, "an uninterrupted run is not undone exactly"

    def killed_at(n: int) -> int:
        prepare()
        code, out = mokka(*killed, kill_at=n)
        assert code in (0, -signal.SIGKILL), out
        return code

    count = 0
    for n in boundaries(killed_at):
        count += 1
        mokka.ok(*host.cleanup_args())
        assert host.snapshot() == before, f"cleanup after a kill at boundary {n}"
        assert "nothing to clean up" in mokka.ok(*host.cleanup_args())
        assert killed_at(n) == -signal.SIGKILL
        mokka.ok(*rerun)
        assert host.snapshot(times=False) == expected, f"setup re-run after a kill at boundary {n}"
        mokka.ok(*host.cleanup_args())
        assert host.snapshot() == before, f"setup + cleanup after a kill at boundary {n}"
    return count


def test_setup_killed_on_a_fresh_host(mokka: Mokka, host: Host) -> None:
    n = converge(mokka, host, host.fresh, host.setup_args(), rerun=host.setup_args())
    assert n >= 30


def test_setup_killed_on_a_lived_in_host(mokka: Mokka, host: Host) -> None:
    n = converge(mokka, host, host.lived_in, host.setup_args(), rerun=host.setup_args())
    assert n >= 30


def test_setup_with_fewer_gpus_killed(mokka: Mokka, host: Host) -> None:
    """A re-run with fewer GPUs, killed anywhere, then re-run: as if staged with fewer GPUs from the start."""

    def staged_with_four() -> None:
        host.lived_in()
        mokka.ok(*host.setup_args(gpus=4))

    staged_with_four()
    assert (host.root / "dev/nvidia3").exists()
    mokka.ok(*host.cleanup_args())
    host.lived_in()
    original = host.snapshot()

    two = host.setup_args(gpus=2)
    n = 0

    def killed_at(k: int) -> int:
        staged_with_four()
        return mokka(*two, kill_at=k)[0]

    host.lived_in()
    mokka.ok(*two)
    expected = host.snapshot(times=False)
    mokka.ok(*host.cleanup_args())
    for k in boundaries(killed_at):
        n += 1
        mokka.ok(*two)
        assert host.snapshot(times=False) == expected, f"re-run after a kill at boundary {k}"
        assert not (host.root / "dev/nvidia2").exists()
        mokka.ok(*host.cleanup_args())
        assert host.snapshot() == original, f"cleanup after a kill at boundary {k}"
    assert n >= 10


def test_cleanup_killed(mokka: Mokka, host: Host) -> None:
    host.lived_in()
    before = host.snapshot()
    n = 0

    def killed_at(k: int) -> int:
        host.lived_in()
        mokka.ok(*host.setup_args())
        return mokka(*host.cleanup_args(), kill_at=k)[0]

    for k in boundaries(killed_at):
        n += 1
        mokka.ok(*host.cleanup_args())
        assert host.snapshot() == before, f"cleanup after a cleanup killed at boundary {k}"
    assert n >= 10


def test_setup_killed_at_random_moments(mokka: Mokka, host: Host) -> None:
    host.lived_in()
    before = host.snapshot()
    start = time.perf_counter()
    mokka.ok(*host.setup_args())
    expected = host.snapshot(times=False)
    span = time.perf_counter() - start
    mokka.ok(*host.cleanup_args())
    rng = random.Random(SEED)
    for i in range(12):
        delay = rng.uniform(0, span)
        host.lived_in()
        mokka(*host.setup_args(), kill_after=delay)
        if i % 2:
            mokka.ok(*host.setup_args())
            assert host.snapshot(times=False) == expected, f"re-run after a kill at {delay:.3f} s"
        mokka.ok(*host.cleanup_args())
        assert host.snapshot() == before, f"after a kill at {delay:.3f} s (seed {SEED}, kill {i})"
        assert "nothing to clean up" in mokka.ok(*host.cleanup_args())


def test_the_real_command_line(host: Host) -> None:
    """The hook works in `python -m mokka.cli` as a user runs it, and cleanup converges there too."""
    host.lived_in()
    before = host.snapshot()
    env = {**os.environ, KILL_ENV: "20"}
    cli = [sys.executable, "-m", "mokka.cli"]
    res = subprocess.run([*cli, *host.setup_args()], env=env, capture_output=True, text=True)
    assert res.returncode == -signal.SIGKILL, res.stderr
    res = subprocess.run([*cli, *host.cleanup_args()], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert host.snapshot() == before


# --------------------------------------------------------------------------- containerd config


CONFIGS = {
    "2.1 drop-in": ("etc/containerd/config.toml", V3, "2.1"),
    "1.7 in place": ("etc/containerd/config.toml", V2, "1.7"),
    "no config yet, no directory": ("etc/containerd/config.toml", None, "2.1"),
}


@pytest.mark.parametrize("case", sorted(CONFIGS))
def test_containerd_install_killed(mokka: Mokka, scratch: Path, case: str) -> None:
    rel, text, version = CONFIGS[case]
    base = scratch / "host"
    config = base / rel

    def prepare() -> None:
        shutil.rmtree(base, ignore_errors=True)
        base.mkdir()
        if text is not None:
            config.parent.mkdir(parents=True)
            config.write_text(text)
            os.chown(config, 4321, 4321)
            os.chmod(config, 0o640)
            os.utime(config, ns=(LONG_AGO, LONG_AGO))

    install = ["containerd-config", "install", "--config", str(config), "--containerd-version", version]
    install += ["--runtime", "/usr/sbin/runc", "--no-restart"]
    remove = ["containerd-config", "remove", "--config", str(config), "--no-restart"]
    prepare()
    before = snapshot(base)
    journal = str(Path(rel).with_name(Path(rel).name + ".mokka-journal"))  # names random temporaries
    mokka.ok(*install)
    expected = snapshot(base, times=False, skip=(journal,))
    mokka.ok(*remove)
    assert snapshot(base) == before

    def killed_at(k: int) -> int:
        prepare()
        return mokka(*install, kill_at=k)[0]

    n = 0
    for k in boundaries(killed_at):
        n += 1
        mokka.ok(*remove)
        assert snapshot(base) == before, f"remove after a kill at boundary {k}"
        assert "nothing to remove" in mokka.ok(*remove)
        assert killed_at(k) == -signal.SIGKILL
        mokka.ok(*install)
        assert snapshot(base, times=False, skip=(journal,)) == expected, f"install re-run after a kill at boundary {k}"
        mokka.ok(*remove)
        assert snapshot(base) == before, f"install + remove after a kill at boundary {k}"
    assert n >= 4
    rng = random.Random(SEED)
    for _ in range(4):
        prepare()
        mokka(*install, kill_after=rng.uniform(0, 0.05))
        mokka.ok(*remove)
        assert snapshot(base) == before
