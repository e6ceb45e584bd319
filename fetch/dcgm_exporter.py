"""NVIDIA's dcgm-exporter, run against a mock driver root: where its binary is, how to start it
and read its /metrics. No registry here serves the exporter: a user brings their own build and
names its directory in ``MOKKA_DCGM_DIR`` (holding ``dcgm-exporter`` or ``dcgm-exporter.xz``
and optionally its ``default-counters.csv``); the project's checkout finds the one in
``../shared/thirdparty/dcgm``."""

from __future__ import annotations

import lzma
import os
import re
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from fetch import thirdparty

ENV_DIR = "MOKKA_DCGM_DIR"
SHARED = thirdparty.SHARED / "dcgm"
_LINE = re.compile(r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>.*)\})? (?P<value>\S+)$")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


class ExporterMissing(RuntimeError):
    """No dcgm-exporter binary where MOKKA_DCGM_DIR or the checkout's shared/ point."""


def directory() -> Path | None:
    """The directory holding the exporter: $MOKKA_DCGM_DIR, else the checkout's shared/ copy."""
    return thirdparty.directory(ENV_DIR, "dcgm")


def binary(cache: Path) -> Path:
    """The exporter's executable, unpacked into ``cache`` once when it comes compressed."""
    d = directory()
    if d is None:
        raise ExporterMissing(f"no dcgm-exporter: set {ENV_DIR} to a directory holding dcgm-exporter")
    plain, packed = d / "dcgm-exporter", d / "dcgm-exporter.xz"
    if plain.is_file():
        return plain
    if not packed.is_file():
        raise ExporterMissing(f"{d}: neither dcgm-exporter nor dcgm-exporter.xz ({ENV_DIR})")
    out = cache / "dcgm-exporter"
    if not out.is_file() or out.stat().st_mtime < packed.stat().st_mtime:
        cache.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        tmp.write_bytes(lzma.decompress(packed.read_bytes()))
        tmp.chmod(0o755)
        tmp.rename(out)
    return out


def default_counters() -> Path | None:
    d = directory()
    return d / "default-counters.csv" if d is not None and (d / "default-counters.csv").is_file() else None


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def parse(text: str) -> list[Sample]:
    """Prometheus text exposition: one Sample per series line."""
    out = []
    for line in text.splitlines():
        m = _LINE.match(line)
        if m and not line.startswith("#"):
            out.append(Sample(m["name"], dict(_LABEL.findall(m["labels"] or "")), float(m["value"])))
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Exporter:
    process: subprocess.Popen[bytes]
    port: int
    log: Path

    def text(self, timeout: float = 10) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=timeout) as r:
            return str(r.read().decode())

    def scrape(self) -> list[Sample]:
        return parse(self.text())


@contextmanager
def running(
    exe: Path, libdir: Path, counters: Path, log: Path, *args: str, env: dict[str, str] | None = None
) -> Iterator[Exporter]:
    """The exporter serving /metrics from the mock libdcgm in ``libdir`` (embedded mode, the
    exporter's default), stopped on exit. Startup validation is off: it asks ldconfig's cache,
    which a driver root is not in."""
    port = free_port()
    environ = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LD_LIBRARY_PATH": str(libdir), **(env or {})}
    argv = [str(exe), "--disable-startup-validate", "-f", str(counters), "-a", f"127.0.0.1:{port}", *args]
    with log.open("wb") as sink:
        proc = subprocess.Popen(argv, env=environ, stdout=sink, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    exporter = Exporter(proc, port, log)
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"dcgm-exporter exited {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                exporter.text(timeout=2)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"dcgm-exporter served no /metrics in 30 s:\n{log.read_text()[-3000:]}"
                    ) from None
                time.sleep(0.05)
        yield exporter
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
