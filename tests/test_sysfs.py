"""The staged procfs/sysfs tree (hostsetup/sysfs.py) and the LD_PRELOAD redirect (native/sysfs).

Unit tests check the tree against the profile and the real H200 capture; a small C probe
calls every hooked libc entry point with and without ``MOKKA_SYSFS_ROOT``; the consumer
tests run Debian's lspci and hwloc (lstopo) and nvidia-smi ``topo -m`` through the shim.
"""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import Staged
from test_profile import BUILTINS

from gpumodel import infiniband, pcie
from gpumodel import profile as profiles
from gpumodel.profile import Device, Profile
from hostsetup import infiniband as ibsysfs
from hostsetup import sysfs

REPO = Path(__file__).resolve().parent.parent
CAPTURE = REPO / "tests" / "captures" / "h200"
SMI_TABLE_ID = bytes.fromhex("c4fe3e6cc98f6c4ea327ee696e12f7c4")
TOPOLOGY_SLOT = 0xB8  # nvidia-smi topo -m: GPU-pair link type, private export table


@pytest.fixture(scope="session")
def shim() -> Path:
    res = subprocess.run(["make", "-s", "-C", str(REPO / "native" / "sysfs")], capture_output=True, text=True)
    if res.returncode != 0:
        pytest.fail(f"make -C native/sysfs failed:\n{res.stdout}\n{res.stderr}")
    path = REPO / "native" / "build" / "libmokka-sysfs.so"
    assert path.is_file()
    return path


@pytest.fixture(scope="session")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., tuple[Profile, Path]]:
    made: dict[tuple[str, int | None], tuple[Profile, Path]] = {}

    def _tree(name: str = "h100", gpus: int | None = None) -> tuple[Profile, Path]:
        if (name, gpus) not in made:
            prof = profiles.load(name).with_count(gpus)
            root = tmp_path_factory.mktemp(f"sysfs-{name}-{gpus or 'default'}")
            sysfs.write_tree(prof, root)
            made[name, gpus] = (prof, root)
        return made[name, gpus]

    return _tree


def read(path: Path) -> str:
    return path.read_text().rstrip("\n")


def cpus_of(text: str) -> list[int]:
    out: list[int] = []
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def capabilities(config: bytes) -> dict[int, int]:
    """Standard capability id -> offset, following the list from 0x34."""
    found: dict[int, int] = {}
    pos = config[0x34]
    while pos:
        assert pos >= 0x40 and pos not in found.values(), f"broken capability list at {pos:#x}"
        found[config[pos]] = pos
        pos = config[pos + 1]
    return found


def extended_capabilities(config: bytes) -> dict[int, int]:
    found: dict[int, int] = {}
    pos = 0x100
    while pos:
        (header,) = struct.unpack_from("<I", config, pos)
        if header == 0:
            break
        found[header & 0xFFFF] = pos
        pos = header >> 20
    return found


# ---- the tree -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", BUILTINS)
def test_tree_matches_profile(tree: Callable[..., tuple[Profile, Path]], name: str) -> None:
    prof, root = tree(name)
    devices = prof.devices()
    listed = sorted(os.listdir(root / "sys/bus/pci/devices"))
    switches = [sysfs.PciName.of(b).slot for b in prof.topology.nvswitches]  # HGX NVSwitches beside the GPUs
    behind = pcie.switches(prof)  # GPUs that share a PCIe switch with their InfiniBand adapter
    bridges = [sysfs.PciName.of(b).slot for s in behind.values() for b, _, _ in s.bridges()]
    adapters = [sysfs.PciName.of(h.bus_id).slot for h in infiniband.adapters(prof)]
    assert listed == sorted([sysfs.sysfs_name(d) for d in devices] + switches + bridges + adapters)
    for d in devices:
        p = d.spec.pci
        slot = sysfs.sysfs_name(d)
        assert slot == d.bus_id[4:].lower()  # 4-digit domain, lowercase, as the kernel names it
        link = root / "sys/bus/pci/devices" / slot
        assert link.is_symlink() and not os.path.isabs(os.readlink(link))
        dev = link.resolve()
        assert dev == (root / sysfs.device_dir(d, behind.get(d.index))).resolve()
        if d.index in behind:  # root port, the switch's upstream and downstream ports, then the GPU
            chain = [dev.parent.parent.parent.name, dev.parent.parent.name, dev.parent.name]
            assert chain == [sysfs.PciName.of(b).slot for b in behind[d.index].path(d.bus_id)[:3]]
            assert dev.parents[3].name == sysfs.PciName.of(behind[d.index].root_port).root_bus
        else:
            assert dev.parent.name == f"pci{slot[:7]}" and dev.parent.parent == (root / "sys/devices").resolve()
        assert read(dev / "vendor") == f"0x{p.vendor_id:04x}"
        assert read(dev / "device") == f"0x{p.device_id:04x}"
        assert read(dev / "class") == f"0x{p.class_code:06x}"
        assert read(dev / "revision") == f"0x{p.revision:02x}"
        assert read(dev / "subsystem_vendor") == f"0x{p.subsystem_vendor_id:04x}"
        assert read(dev / "subsystem_device") == f"0x{p.subsystem_device_id:04x}"
        numa = int(read(dev / "numa_node"))
        assert numa == (d.numa_node if prof.topology.numa_nodes > 1 else -1)
        local = cpus_of(read(dev / "local_cpulist"))
        assert local == sysfs.node_cpus(d, prof) and local
        assert int(read(dev / "local_cpus").replace(",", ""), 16) == sum(1 << c for c in local)
        gen = p.current_link_gen or p.max_link_gen
        assert read(dev / "current_link_speed") == sysfs.LINK_SPEEDS[gen]
        assert read(dev / "max_link_width") == str(p.max_link_width)
        assert read(dev / "driver_override") == "(null)"
        assert (dev / "driver").resolve() == (root / "sys/bus/pci/drivers/nvidia").resolve()
        assert (dev / "subsystem").resolve() == (root / "sys/bus/pci").resolve()
        assert (root / "sys/bus/pci/drivers/nvidia" / slot).resolve() == dev
        assert len((dev / "resource").read_text().splitlines()) == 7

        config = (dev / "config").read_bytes()
        assert len(config) == 4096
        vendor, device = struct.unpack_from("<HH", config, 0)
        assert (vendor, device) == (p.vendor_id, p.device_id)
        assert config[8] == p.revision and int.from_bytes(config[9:12], "little") == p.class_code
        assert config[0x0E] == 0  # endpoint header
        assert struct.unpack_from("<HH", config, 0x2C) == (p.subsystem_vendor_id, p.subsystem_device_id)
        caps = capabilities(config)
        assert set(caps) == {0x01, 0x05, 0x10, 0x11}  # PM, MSI, PCIe, MSI-X
        (lnkcap,) = struct.unpack_from("<I", config, caps[0x10] + 0x0C)
        (lnksta,) = struct.unpack_from("<H", config, caps[0x10] + 0x12)
        assert (lnkcap >> 4) & 0x3F == p.max_link_width
        assert lnksta & 0xF == gen and (lnksta >> 4) & 0x3F == (p.current_link_width or p.max_link_width)
        assert set(extended_capabilities(config)) == {0x0001, 0x0003}  # AER, serial number

        info = dict(
            line.split(":", 1)
            for line in (root / "proc/driver/nvidia/gpus" / slot / "information").read_text().splitlines()
        )
        assert info["Model"].strip() == d.spec.name
        assert info["GPU UUID"].strip() == d.uuid
        assert info["Bus Location"].strip() == slot
        assert info["Device Minor"].strip() == str(d.index)
        assert info["IRQ"].strip() == read(dev / "irq")
        assert info["Video BIOS"].strip() == d.spec.vbios_version.lower()
    # every link of the tree lands inside it
    for path in root.rglob("*"):
        if path.is_symlink():
            assert path.resolve().is_relative_to(root.resolve()), path
            assert path.exists(), f"{path} dangles"


def test_every_nvidia_function_has_a_resource_file(tree: Callable[..., tuple[Profile, Path]]) -> None:
    """NVIDIA's PCI enumeration (go-nvlib: the MIG manager, the toolkit) reads every function of
    vendor 0x10de, GPU or NVSwitch, and fails on one without a resource file of three fields a line."""
    _, root = tree("h100")
    functions = [
        f for f in sorted((root / "sys/bus/pci/devices").iterdir()) if (f / "vendor").read_text() == "0x10de\n"
    ]
    assert len(functions) == 8 + 4
    for f in functions:
        assert (f / "vendor").read_text() == "0x10de\n"
        rows = [ln.split(" ") for ln in (f / "resource").read_text().splitlines()]
        assert rows and all(len(r) == 3 and all(int(x, 16) >= 0 for x in r) for r in rows), f.name
        start, end, _ = (int(x, 16) for x in rows[0])
        assert end > start, f.name  # BAR0: the registers


def test_driver_footprint(tree: Callable[..., tuple[Profile, Path]]) -> None:
    prof, root = tree("h100")
    version = prof.driver.version
    text = (root / "proc/driver/nvidia/version").read_text()
    assert re.match(rf"NVRM version: NVIDIA UNIX .*Kernel Module.*  {re.escape(version)}  ", text)
    assert text.splitlines()[1].startswith("GCC version:")
    assert read(root / "sys/module/nvidia/version") == version
    modules = [line.split() for line in (root / "proc/modules").read_text().splitlines()]
    assert [m[0] for m in modules] == ["nvidia_drm", "nvidia_modeset", "nvidia_uvm", "nvidia"]
    for m in modules:
        assert len(m) == 7 and m[1].isdigit() and m[4] == "Live" and m[5].startswith("0x")
    params = (root / "proc/driver/nvidia/params").read_text()
    assert "NvLinkDisable: 0" in params  # the h100 profile has NVLink
    assert (root / "proc/driver/nvidia/capabilities/gpu7/mig").is_dir()
    assert list((root / "sys/bus/pci/slots").iterdir()) == []


def capture_sections(name: str) -> dict[str, str]:
    """A capture file split at its ``== path`` / ``-- name:`` headers."""
    out: dict[str, str] = {}
    key = ""
    for line in (CAPTURE / name).read_text().splitlines():
        m = re.match(r"^(?:== (\S+)|-- (\w+):\s?(.*))$", line)
        if m:
            key = m.group(1) or m.group(2)
            out[key] = (m.group(3) or "") + ("\n" if m.group(3) else "")
        elif key:
            out[key] += line + "\n"
    return out


def test_matches_h200_capture(tree: Callable[..., tuple[Profile, Path]]) -> None:
    """The single-GPU H200 profile against the real H200's files (ids, layout, wording)."""
    prof, root = tree("h200", 1)
    d = prof.devices()[0]
    dev = root / sysfs.device_dir(d, pcie.switches(prof).get(d.index))
    sections = capture_sections("sysfs-pci.txt")
    for key in ("vendor", "device", "class", "revision", "subsystem_vendor", "subsystem_device", "driver_override"):
        assert read(dev / key) == sections[key].strip(), key
    # the capture's GPU sits on a root bus of its own (a pass-through VM); here it is behind the
    # PCIe switch it shares with its NIC: a longer relative link to the same driver directory
    depth = len(sysfs.device_dir(d, pcie.switches(prof).get(d.index)).parts) - 4
    assert os.readlink(dev / "driver") == "../" * depth + sections["driver"].strip()
    rows = [ln.split() for ln in sections["config"].splitlines() if re.match(r"^[0-9a-f]{6}( [0-9a-f]{2})+$", ln)]
    dump = bytes(int(b, 16) for row in rows for b in row[1:])
    ours = (dev / "config").read_bytes()
    bars = set(range(0x10, 0x28))
    for off in range(0x100):
        if off not in bars:
            assert ours[off] == dump[off], f"config byte {off:#x}: {ours[off]:#04x} != capture {dump[off]:#04x}"
    proc = capture_sections("proc-driver-nvidia.txt")
    real_info = next(v for k, v in proc.items() if k.endswith("/information"))
    ours_info = (root / "proc/driver/nvidia/gpus" / sysfs.sysfs_name(d) / "information").read_text()
    assert [ln.split(":")[0] + ":" + ln.split(":")[1][:3] for ln in ours_info.splitlines()] == [
        ln.split(":")[0] + ":" + ln.split(":")[1][:3] for ln in real_info.splitlines()
    ]  # same keys, same tab layout
    for key in ("Model", "Video BIOS", "Bus Type", "DMA Size", "DMA Mask", "Device Minor", "GPU Excluded"):
        assert line_of(key, ours_info) == line_of(key, real_info)
    real_keys = [ln.split(":")[0] for ln in proc["/proc/driver/nvidia/params"].splitlines()]
    assert [ln.split(":")[0] for ln in (root / "proc/driver/nvidia/params").read_text().splitlines()] == real_keys
    # identical but for NvLinkDisable: the capture's pass-through VM had NVLink off, the profile's board has links
    ours_params = (root / "proc/driver/nvidia/params").read_text()
    assert ours_params.replace("NvLinkDisable: 0", "NvLinkDisable: 1") == proc["/proc/driver/nvidia/params"]
    real_version = proc_version_line()
    ours_version = (root / "proc/driver/nvidia/version").read_text().splitlines()[0]
    assert ours_version.replace(prof.driver.version, "V").split("(")[0] == real_version.split("(")[0]


def line_of(key: str, text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(key + ":"))


def proc_version_line() -> str:
    first = (CAPTURE / "proc-driver-nvidia.txt").read_text().splitlines()[0]
    return re.sub(r"\d+\.\d+\.\d+", "V", first)


def test_cpu_formats() -> None:
    assert sysfs.cpulist([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert sysfs.cpulist(list(range(16))) == "0-15"
    assert sysfs.cpumask(list(range(16)), 16) == "ffff"  # the capture's 16-CPU machine
    assert sysfs.cpumask(list(range(20)), 20) == "fffff"
    assert sysfs.cpumask(list(range(32, 64)), 64) == "ffffffff,00000000"
    assert sysfs.cpumask([0], 72) == "00,00000000,00000001"


def test_numa_split_matches_state(tree: Callable[..., tuple[Profile, Path]]) -> None:
    prof, root = tree("b200")
    by_node: dict[int, set[int]] = {}
    behind = pcie.switches(prof)
    for d in prof.devices():
        dev = root / sysfs.device_dir(d, behind.get(d.index))
        by_node.setdefault(int(read(dev / "numa_node")), set()).update(cpus_of(read(dev / "local_cpulist")))
    assert sorted(by_node) == [0, 1]
    if sysfs.cpu_count(prof) > 1:
        assert not by_node[0] & by_node[1]


def test_written_into_an_empty_directory_only(tmp_path: Path) -> None:
    """The tree is built whole into a new directory (host setup's journal moves it into place and
    undoes it); modes do not depend on the umask."""
    prof = profiles.load("h100").with_count(4)
    old = os.umask(0o077)
    try:
        sysfs.write_tree(prof, tmp_path / "t")
    finally:
        os.umask(old)
    assert (tmp_path / "t/proc/modules").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "t/sys/bus/pci/slots").stat().st_mode & 0o777 == 0o755
    with pytest.raises(FileExistsError):
        sysfs.write_part(sysfs.files(prof), [], "proc", tmp_path / "t/proc")
    # No temporary file is left: the one dot file is the subnet the MAD responder reads.
    assert [p for p in tmp_path.rglob(".*")] == [tmp_path / "t" / ibsysfs.FABRIC]


def test_pure_function_of_profile(tmp_path: Path) -> None:
    prof = profiles.load("gb300")
    sysfs.write_tree(prof, tmp_path / "a")
    sysfs.write_tree(prof, tmp_path / "b")
    a = {p.relative_to(tmp_path / "a"): p.read_bytes() for p in (tmp_path / "a").rglob("*") if p.is_file()}
    b = {p.relative_to(tmp_path / "b"): p.read_bytes() for p in (tmp_path / "b").rglob("*") if p.is_file()}
    assert a == b
    assert (tmp_path / "a/sys/bus/pci/devices/0018:06:00.0").is_symlink()  # domains other than 0


# ---- the shim, through a C probe ------------------------------------------------------------

PROBE = r"""
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int __open_2(const char *, int);
int __open64_2(const char *, int);
int __openat_2(int, const char *, int);
int __openat64_2(int, const char *, int);
int __xstat(int, const char *, struct stat *);
int __xstat64(int, const char *, struct stat64 *);
int __lxstat(int, const char *, struct stat *);
int __lxstat64(int, const char *, struct stat64 *);
int __fxstatat(int, int, const char *, struct stat *, int);
int __fxstatat64(int, int, const char *, struct stat64 *, int);
char *__realpath_chk(const char *, char *, size_t);
ssize_t __readlink_chk(const char *, char *, size_t, size_t);
ssize_t __readlinkat_chk(int, const char *, char *, size_t, size_t);

static int fail(void) { printf("error %s\n", strerrorname_np(errno)); return 0; }
static int fd_line(int fd) {
    char buf[256] = {0};
    if (fd < 0) return fail();
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n < 0) return fail();
    buf[strcspn(buf, "\n")] = 0;
    printf("%s\n", buf);
    return 0;
}
static int file_line(FILE *f) { if (!f) return fail(); int fd = dup(fileno(f)); fclose(f); return fd_line(fd); }
static int kind(int rc, mode_t mode, long long size) {
    if (rc != 0) return fail();
    printf("%s %lld\n", S_ISLNK(mode) ? "link" : S_ISDIR(mode) ? "dir" : S_ISREG(mode) ? "file" : "other",
           S_ISREG(mode) ? size : 0);
    return 0;
}
static int cmp(const struct dirent **a, const struct dirent **b) { return strcmp((*a)->d_name, (*b)->d_name); }
static int cmp64(const struct dirent64 **a, const struct dirent64 **b) { return strcmp((*a)->d_name, (*b)->d_name); }
static int visible(const struct dirent *e) { return e->d_name[0] != '.'; }
static int visible64(const struct dirent64 *e) { return e->d_name[0] != '.'; }
static int names(int n, struct dirent **list) {
    if (n < 0) return fail();
    for (int i = 0; i < n; i++) { printf("%s%s", i ? " " : "", list[i]->d_name); free(list[i]); }
    printf("\n"); free(list); return 0;
}
static int names64(int n, struct dirent64 **list) {
    if (n < 0) return fail();
    for (int i = 0; i < n; i++) { printf("%s%s", i ? " " : "", list[i]->d_name); free(list[i]); }
    printf("\n"); free(list); return 0;
}
static int text(ssize_t n, char *buf) { if (n < 0) return fail(); buf[n] = 0; printf("%s\n", buf); return 0; }
static int str(const char *s) { if (!s) return fail(); printf("%s\n", s); return 0; }

/* the call first, then its result (argument evaluation order is unspecified) */
#define ST(call, mode, size) do { int rc_ = (call); return kind(rc_, (mode), (size)); } while (0)

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    const char *c = argv[1], *p = argv[2];
    struct stat st = {0}; struct stat64 st64 = {0}; struct statx sx = {0}; char buf[PATH_MAX];
    volatile int rdonly = O_RDONLY; /* not a constant: what fortified callers pass to __open_2 */
    if (!strcmp(c, "open")) return fd_line(open(p, O_RDONLY));
    if (!strcmp(c, "open64")) return fd_line(open64(p, O_RDONLY));
    if (!strcmp(c, "openat")) return fd_line(openat(AT_FDCWD, p, O_RDONLY));
    if (!strcmp(c, "openat64")) return fd_line(openat64(-1, p, O_RDONLY));
    if (!strcmp(c, "__open_2")) return fd_line(__open_2(p, rdonly));
    if (!strcmp(c, "__open64_2")) return fd_line(__open64_2(p, rdonly));
    if (!strcmp(c, "__openat_2")) return fd_line(__openat_2(AT_FDCWD, p, rdonly));
    if (!strcmp(c, "__openat64_2")) return fd_line(__openat64_2(AT_FDCWD, p, rdonly));
    if (!strcmp(c, "fopen")) return file_line(fopen(p, "r"));
    if (!strcmp(c, "fopen64")) return file_line(fopen64(p, "r"));
    if (!strcmp(c, "stat")) ST(stat(p, &st), st.st_mode, st.st_size);
    if (!strcmp(c, "stat64")) ST(stat64(p, &st64), st64.st_mode, st64.st_size);
    if (!strcmp(c, "lstat")) ST(lstat(p, &st), st.st_mode, st.st_size);
    if (!strcmp(c, "lstat64")) ST(lstat64(p, &st64), st64.st_mode, st64.st_size);
    if (!strcmp(c, "fstatat")) ST(fstatat(AT_FDCWD, p, &st, AT_SYMLINK_NOFOLLOW), st.st_mode, st.st_size);
    if (!strcmp(c, "fstatat64")) ST(fstatat64(-1, p, &st64, 0), st64.st_mode, st64.st_size);
    if (!strcmp(c, "__xstat")) ST(__xstat(1, p, &st), st.st_mode, st.st_size);
    if (!strcmp(c, "__xstat64")) ST(__xstat64(1, p, &st64), st64.st_mode, st64.st_size);
    if (!strcmp(c, "__lxstat")) ST(__lxstat(1, p, &st), st.st_mode, st.st_size);
    if (!strcmp(c, "__lxstat64")) ST(__lxstat64(1, p, &st64), st64.st_mode, st64.st_size);
    if (!strcmp(c, "__fxstatat")) ST(__fxstatat(1, -1, p, &st, 0), st.st_mode, st.st_size);
    if (!strcmp(c, "__fxstatat64")) ST(__fxstatat64(1, -1, p, &st64, 0), st64.st_mode, st64.st_size);
    if (!strcmp(c, "statx"))
        ST(statx(AT_FDCWD, p, AT_SYMLINK_NOFOLLOW, STATX_BASIC_STATS, &sx), sx.stx_mode, (long long)sx.stx_size);
    if (!strcmp(c, "access")) return access(p, R_OK) ? fail() : str("ok");
    if (!strcmp(c, "faccessat")) return faccessat(AT_FDCWD, p, R_OK, 0) ? fail() : str("ok");
    if (!strcmp(c, "euidaccess")) return euidaccess(p, R_OK) ? fail() : str("ok");
    if (!strcmp(c, "eaccess")) return eaccess(p, R_OK) ? fail() : str("ok");
    if (!strcmp(c, "opendir")) {
        DIR *d = opendir(p);
        if (!d) return fail();
        struct dirent **list = NULL; int n = 0; struct dirent *e;
        while ((e = readdir(d))) {
            if (e->d_name[0] == '.') continue;
            list = realloc(list, sizeof *list * (n + 1));
            list[n] = malloc(sizeof *e); memcpy(list[n], e, sizeof *e); n++;
        }
        closedir(d);
        qsort(list, n, sizeof *list, (int (*)(const void *, const void *))cmp);
        return names(n, list);
    }
    if (!strcmp(c, "chdir")) {
        if (chdir(p)) return fail();
        struct dirent **l = NULL; int n = scandir(".", &l, visible, cmp); return names(n, l);
    }
    if (!strcmp(c, "scandir")) { struct dirent **l = NULL; int n = scandir(p, &l, visible, cmp); return names(n, l); }
    if (!strcmp(c, "scandir64")) {
        struct dirent64 **l = NULL; int n = scandir64(p, &l, visible64, cmp64); return names64(n, l);
    }
    if (!strcmp(c, "readlink")) return text(readlink(p, buf, sizeof buf - 1), buf);
    if (!strcmp(c, "readlinkat")) return text(readlinkat(AT_FDCWD, p, buf, sizeof buf - 1), buf);
    if (!strcmp(c, "__readlink_chk")) return text(__readlink_chk(p, buf, sizeof buf - 1, sizeof buf), buf);
    if (!strcmp(c, "__readlinkat_chk")) return text(__readlinkat_chk(-1, p, buf, sizeof buf - 1, sizeof buf), buf);
    if (!strcmp(c, "realpath")) return str(realpath(p, buf));
    if (!strcmp(c, "realpath-alloc")) { char *r = realpath(p, NULL); str(r); free(r); return 0; }
    if (!strcmp(c, "__realpath_chk")) return str(__realpath_chk(p, buf, sizeof buf));
    if (!strcmp(c, "canonicalize_file_name")) { char *r = canonicalize_file_name(p); str(r); free(r); return 0; }
    return 2;
}
"""

OPENS = ["open", "open64", "openat", "openat64"]
READERS = [*OPENS, "__open_2", "__open64_2", "__openat_2", "__openat64_2", "fopen", "fopen64"]
STATS = ["stat", "stat64", "__xstat", "__xstat64", "fstatat64", "__fxstatat", "__fxstatat64"]
LSTATS = ["lstat", "lstat64", "fstatat", "__lxstat", "__lxstat64", "statx"]
ACCESS = ["access", "faccessat", "euidaccess", "eaccess"]
LISTS = ["opendir", "scandir", "scandir64", "chdir"]  # chdir: then the working directory's listing
LINKS = ["readlink", "readlinkat", "__readlink_chk", "__readlinkat_chk"]
REALPATHS = ["realpath", "realpath-alloc", "__realpath_chk", "canonicalize_file_name"]
ALL_CALLS = READERS + STATS + LSTATS + ACCESS + LISTS + LINKS + REALPATHS


@pytest.fixture(scope="session")
def probe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.fail("no C compiler (cc) to build the probe")
    folder = tmp_path_factory.mktemp("probe")
    (folder / "probe.c").write_text(PROBE)
    out = folder / "probe"
    # -U_FORTIFY_SOURCE: the probe calls the fortified entry points itself, by name
    res = subprocess.run(
        [cc, "-std=gnu11", "-O0", "-U_FORTIFY_SOURCE", "-Wall", "-Werror", "-o", str(out), str(folder / "probe.c")],
        capture_output=True,
        text=True,
    )
    if res.returncode != 0:
        pytest.fail(f"probe did not build:\n{res.stderr}")
    return out


def run_probe(probe: Path, shim: Path | None, root: Path | None, call: str, path: str) -> str:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    if shim is not None:
        env["LD_PRELOAD"] = str(shim)
    if root is not None:
        env["MOKKA_SYSFS_ROOT"] = str(root)
    res = subprocess.run([str(probe), call, path], env=env, capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, f"probe {call} {path}: exit {res.returncode}\n{res.stderr}"
    return res.stdout.rstrip("\n")


@pytest.mark.parametrize("call", ALL_CALLS)
def test_every_hook_redirects(probe: Path, shim: Path, tree: Callable[..., tuple[Profile, Path]], call: str) -> None:
    prof, root = tree("h100")
    d: Device = prof.devices()[0]
    slot = sysfs.sysfs_name(d)
    dev_path = "/" + str(sysfs.device_dir(d, pcie.switches(prof).get(d.index)))  # behind its NIC's switch
    bus_path = f"/sys/bus/pci/devices/{slot}"
    driver = os.path.relpath("/sys/bus/pci/drivers/nvidia", dev_path)
    if call in READERS:
        version = (root / "proc/driver/nvidia/version").read_text().splitlines()[0]
        assert run_probe(probe, shim, root, call, "/proc/driver/nvidia/version") == version
        assert run_probe(probe, shim, root, call, f"{bus_path}/class") == f"0x{d.spec.pci.class_code:06x}"
        assert run_probe(probe, shim, root, call, "/sys/module/nvidia/version") == prof.driver.version
        assert run_probe(probe, shim, root, call, "/proc/self/comm") == "probe"  # elsewhere: untouched
    elif call in STATS:
        assert run_probe(probe, shim, root, call, f"{bus_path}/config") == "file 4096"
        assert run_probe(probe, shim, root, call, bus_path) == "dir 0"
    elif call in LSTATS:
        assert run_probe(probe, shim, root, call, bus_path) == "link 0"
        assert run_probe(probe, shim, root, call, f"{dev_path}/config") == "file 4096"
    elif call in ACCESS:
        assert run_probe(probe, shim, root, call, "/proc/driver/nvidia/gpus") == "ok"
        assert run_probe(probe, shim, root, call, "/sys/bus/pci/drivers/nvidia/nothing") == "error ENOENT"
    elif call in LISTS:
        gpus = [sysfs.sysfs_name(x) for x in prof.devices()]
        listed = sorted(os.listdir(root / "sys/bus/pci/devices"))  # GPUs, NVSwitches, bridges, NICs
        assert set(gpus) < set(listed)
        assert run_probe(probe, shim, root, call, "/sys/bus/pci/devices") == " ".join(listed)
        assert run_probe(probe, shim, root, call, "/proc/driver/nvidia/gpus") == " ".join(sorted(gpus))
    elif call in LINKS:
        assert run_probe(probe, shim, root, call, bus_path) == f"../../..{dev_path[4:]}"
        assert run_probe(probe, shim, root, call, f"{bus_path}/driver") == driver
    else:
        assert run_probe(probe, shim, root, call, bus_path) == dev_path  # the root does not show
        assert run_probe(probe, shim, root, call, f"{bus_path}/driver") == "/sys/bus/pci/drivers/nvidia"


@pytest.mark.parametrize("call", ALL_CALLS)
def test_unset_root_changes_nothing(probe: Path, shim: Path, call: str) -> None:
    """Without MOKKA_SYSFS_ROOT every hook answers exactly as libc does."""
    paths = ["/sys/bus/pci/devices", "/proc/driver/nvidia/version", "/sys/module/nvidia/version", "/proc/self/exe"]
    paths.append("/proc/modules")
    real = sorted(os.listdir("/sys/bus/pci/devices"))
    if real:
        paths += [f"/sys/bus/pci/devices/{real[0]}", f"/sys/bus/pci/devices/{real[0]}/vendor"]
    for path in paths:
        plain = run_probe(probe, None, None, call, path)
        assert run_probe(probe, shim, None, call, path) == plain, (call, path)
        assert run_probe(probe, shim, Path(""), call, path) == plain, (call, path)


def test_real_functions_reachable(probe: Path, shim: Path, tree: Callable[..., tuple[Profile, Path]]) -> None:
    """Paths the staged tree lacks fall through to the real ones (the host's own PCI functions)."""
    _, root = tree("h100")
    real = sorted(os.listdir("/sys/bus/pci/devices"))
    if not real:
        pytest.skip("this machine has no PCI functions")
    vendor = f"/sys/bus/pci/devices/{real[0]}/vendor"
    assert run_probe(probe, shim, root, "open", vendor) == run_probe(probe, None, None, "open", vendor)
    target = os.path.realpath(f"/sys/bus/pci/devices/{real[0]}")
    assert run_probe(probe, shim, root, "realpath", f"/sys/bus/pci/devices/{real[0]}") == target
    assert run_probe(probe, shim, root, "open", "/sys/devices/system/cpu/online") == read(
        Path("/sys/devices/system/cpu/online")
    )


def test_nvidia_runtime_wrappers_see_the_mock_driver(shim: Path, tree: Callable[..., tuple[Profile, Path]]) -> None:
    """NVIDIA's container toolkit installs its runtimes behind a shell wrapper that runs
    ``cat /proc/modules | grep -e "^nvidia "`` and, when that fails (no driver loaded), runs runc
    directly: with the shim the staged node's module list answers, as a GPU node's kernel does."""
    _, root = tree("h100")
    check = ["sh", "-c", 'cat /proc/modules | grep -e "^nvidia "']
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    shimmed = subprocess.run(check, env={**env, "LD_PRELOAD": str(shim), "MOKKA_SYSFS_ROOT": str(root)},
                             capture_output=True, text=True, timeout=30)  # fmt: skip
    assert shimmed.returncode == 0 and shimmed.stdout.startswith("nvidia "), shimmed
    assert shimmed.stdout == "".join(ln + "\n" for ln in (root / "proc/modules").read_text().splitlines()
                                     if ln.startswith("nvidia "))  # fmt: skip
    plain = subprocess.run(check, env={**env, "LD_PRELOAD": str(shim)}, capture_output=True, text=True, timeout=30)
    real = Path("/proc/modules")
    assert plain.stdout == (
        "".join(ln + "\n" for ln in real.read_text().splitlines() if ln.startswith("nvidia ")) if real.exists() else ""
    )


def test_shim_exports_only_hooks(shim: Path) -> None:
    res = subprocess.run(["nm", "-D", "--defined-only", str(shim)], capture_output=True, text=True, check=True)
    exported = {line.split()[-1] for line in res.stdout.splitlines() if " T " in line or " W " in line}
    # The path hooks, the umad device's ioctl() and close(), the InfiniBand class listings' streams
    # (listing.c), libibverbs' device verbs.
    devices = {"ioctl", "close"}
    listings = {"fdopendir", "readdir", "readdir64", "closedir"}
    verbs = {
        "ibv_open_device",
        "ibv_close_device",
        "ibv_query_device",
        "ibv_query_port",
        "ibv_query_gid",
        "ibv_query_gid_type",
        "ibv_query_pkey",
        "ibv_alloc_pd",
        "ibv_create_comp_channel",
        "ibv_create_cq",
    }
    assert exported == set(ALL_CALLS) - {"realpath-alloc"} | devices | listings | verbs


# ---- real consumers -----------------------------------------------------------------------


def tool(name: str, package: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} not found: install Debian's {package} (.ci/setup does)")
    return path


def run_with_shim(argv: list[str], shim: Path, root: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LD_PRELOAD": str(shim), "MOKKA_SYSFS_ROOT": str(root)}
    env.update(extra)
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.consumers
@pytest.mark.parametrize("name", ["h100", "gb300", "t4", "l40s"])
def test_lspci_lists_profile_gpus(shim: Path, tree: Callable[..., tuple[Profile, Path]], name: str) -> None:
    lspci = tool("lspci", "pciutils")
    prof, root = tree(name)
    res = run_with_shim([lspci, "-D", "-nn"], shim, root)
    assert res.returncode == 0, res.stderr
    # NVSwitches: test_nvswitch.py; PCIe switches and InfiniBand adapters: test_infiniband.py
    lines = [ln for ln in res.stdout.splitlines() if "[10de:" in ln and " Bridge [0680]: " not in ln]
    devices = prof.devices()
    assert len(lines) == len(devices)
    for d, line in zip(sorted(devices, key=sysfs.sysfs_name), lines, strict=True):
        p = d.spec.pci
        assert line.startswith(f"{sysfs.sysfs_name(d)} 3D controller [0302]: NVIDIA Corporation "), line
        assert f"[10de:{p.device_id:04x}] (rev {p.revision:02x})" in line
    if name == "h100":
        assert "H100 SXM5" in lines[0]  # the name pci.ids gives device 0x2330
    d = devices[-1]
    verbose = run_with_shim([lspci, "-vvv", "-s", sysfs.sysfs_name(d)], shim, root).stdout
    assert "Kernel driver in use: nvidia" in verbose
    gen = d.spec.pci.current_link_gen or d.spec.pci.max_link_gen
    width = d.spec.pci.current_link_width or d.spec.pci.max_link_width
    speed = re.escape(sysfs.LINK_SPEEDS[gen].split()[0].removesuffix(".0"))
    assert re.search(rf"LnkSta:\tSpeed {speed}GT/s( \(\w+\))?, Width x{width}\b", verbose), verbose
    if prof.topology.numa_nodes > 1:
        assert f"NUMA node: {d.numa_node}" in verbose


@pytest.mark.consumers
def test_lspci_unchanged_without_root(shim: Path) -> None:
    lspci = tool("lspci", "pciutils")
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    plain = subprocess.run([lspci, "-vvv"], env=env, capture_output=True, text=True)
    shimmed = subprocess.run([lspci, "-vvv"], env={**env, "LD_PRELOAD": str(shim)}, capture_output=True, text=True)
    assert (shimmed.returncode, shimmed.stdout, shimmed.stderr) == (plain.returncode, plain.stdout, plain.stderr)


@pytest.mark.consumers
def test_hwloc_places_gpus(shim: Path, tree: Callable[..., tuple[Profile, Path]]) -> None:
    """Debian's hwloc (the library nvidia-smi embeds) finds every GPU and its CPU locality."""
    lstopo = tool("lstopo-no-graphics", "hwloc-nox")
    prof, root = tree("h100")
    res = run_with_shim([lstopo, "--of", "xml", "--whole-io"], shim, root, HWLOC_COMPONENTS="-gl,-opencl,-cuda,-nvml")
    assert res.returncode == 0, res.stderr
    found = dict(re.findall(r'pci_busid="([0-9a-f:.]+)" pci_type="(0302 \[10de:[0-9a-f]{4}\])', res.stdout))
    assert found == {sysfs.sysfs_name(d): f"0302 [10de:{d.spec.pci.device_id:04x}]" for d in prof.devices()}


def topology_slot_answers(staged: Staged) -> bool:
    """Whether the mock's private table serves the slot nvidia-smi asks for each GPU pair's link type:
    byte offset 0xb8, ``int (const char *busId_a, const char *busId_b, int *level)``, level 0..22 =
    PIX, PXB, PHB, NODE, SYS, NV1..NV18 (found by tracing nvidia-smi 550 and 535)."""
    a, b = (d.bus_id for d in staged.profile.devices()[:2])
    code = (
        "import ctypes\n"
        "lib = ctypes.CDLL('libnvidia-ml.so.1')\n"
        "assert lib.nvmlInit_v2() == 0\n"
        "table = ctypes.c_void_p()\n"
        f"assert lib.nvmlInternalGetExportTable(ctypes.byref(table), bytes.fromhex('{SMI_TABLE_ID.hex()}')) == 0\n"
        "size = ctypes.c_size_t.from_address(table.value).value\n"
        f"slot = {TOPOLOGY_SLOT}\n"
        "addr = ctypes.c_void_p.from_address(table.value + slot).value if size > slot else None\n"
        "proto = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p, ctypes.POINTER(ctypes.c_int))\n"
        "level = ctypes.c_int(-1)\n"
        f"rc = proto(addr)(b'{a}', b'{b}', ctypes.byref(level)) if addr else -1\n"
        "print(rc, level.value)\n"
    )
    rc, level = staged.python(code).stdout.split()
    return rc == "0" and 0 <= int(level) <= 22


@pytest.mark.consumers
def test_nvidia_smi_topo_matrix(
    shim: Path, tree: Callable[..., tuple[Profile, Path]], stage: Callable[..., Staged], smi: tuple[str, Path]
) -> None:
    staged = stage("h100")
    _, root = tree("h100")
    res = staged.run([str(smi[1]), "topo", "-m"], check=False, LD_PRELOAD=str(shim), MOKKA_SYSFS_ROOT=str(root))
    assert topology_slot_answers(staged), "without slot 0xb8 nvidia-smi prints 'Failed to run topology matrix'"
    assert res.returncode == 0, res.stdout + res.stderr
    rows = [line.split("\t") for line in res.stdout.splitlines() if re.match(r"^GPU\d+\t", line)]
    assert [r[0] for r in rows] == [f"GPU{i}" for i in range(8)]
    for i, row in enumerate(rows):
        cells = [c.strip() for c in row[1:9]]
        assert cells[i] == "X" and all(c for c in cells), row
