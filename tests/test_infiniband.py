"""InfiniBand adapters beside the GPUs: the profile's section, the staged sysfs, and the real tools.

Debian's infiniband-diags (``ibstat``, ``ibstatus``), pciutils (``lspci``) and nvidia-smi's
``topo -m`` read the staged tree through the sysfs shim, unmodified; ``mokka exec`` runs them on a
throw-away node as a user would.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from test_profile import BUILTINS

from gpumodel import fabric, fleet, ib_ports, infiniband, pcie
from gpumodel import profile as profiles
from gpumodel.profile import format_guid
from hostsetup import infiniband as ibsysfs
from hostsetup import sysfs

REPO = Path(__file__).resolve().parent.parent
# The built-in profiles that are servers with an InfiniBand compute fabric, and its adapters.
FABRICS = {"a100": 8, "b200": 8, "gb200": 4, "gb300": 4, "h100": 8, "h200": 8}


def mokka(*args: str, timeout: float = 120, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "mokka.cli", *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=cwd)


def tool(name: str) -> str:
    path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")
    if path is None:
        pytest.fail(f"{name} not found: install Debian's infiniband-diags (.ci/setup --tests does)")
    return path


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An h100 node staged by `mokka host setup` (driver, sysfs, shim)."""
    root = tmp_path_factory.mktemp("ib-node")
    res = mokka("host", "setup", "--profile", "h100", "--root", str(root))
    assert res.returncode == 0, res.stderr
    return root


def shim_env(root: Path) -> dict[str, str]:
    return {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "LD_PRELOAD": str(root / "lib/libmokka-sysfs.so"),
        "MOKKA_SYSFS_ROOT": str(root),
        "LD_LIBRARY_PATH": str(root / "driver/usr/lib64"),
    }


def shimmed(root: Path, argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=shim_env(root), capture_output=True, text=True, timeout=60)


# ---- the profile ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", BUILTINS)
def test_builtin_servers_carry_their_fabric(name: str) -> None:
    prof = profiles.load(name)
    hcas = infiniband.adapters(prof)
    assert len(hcas) == FABRICS.get(name, 0)
    assert [h.name for h in hcas] == [f"mlx5_{i}" for i in range(len(hcas))]
    guids = [h.node_guid for h in hcas]
    assert len(set(guids)) == len(guids)
    assert all(g >> 40 == infiniband.OUI for g in guids)
    for h in hcas:
        assert h.gpu == h.index  # one per GPU
        assert h.ports[0].guid == h.node_guid  # single-port mlx5: port GUID = node GUID
        assert 1 <= h.ports[0].lid <= 0xBFFF


def test_fewer_gpus_fewer_adapters_and_fleet_nodes_have_their_own_guids() -> None:
    prof = profiles.load("h100")
    assert len(infiniband.adapters(prof.with_count(3))) == 3
    one, two = (infiniband.adapters(fleet.as_node(prof, n)) for n in ("node-a", "node-b"))
    assert not {h.node_guid for h in one} & {h.node_guid for h in two}
    assert [h.node_guid for h in one] == [h.node_guid for h in infiniband.adapters(fleet.as_node(prof, "node-a"))]


def test_each_gpu_shares_a_pcie_switch_with_its_adapter() -> None:
    prof = profiles.load("h100")
    behind = pcie.switches(prof)
    assert sorted(behind) == list(range(8))
    for h in infiniband.adapters(prof):
        switch = behind[h.gpu]
        assert h.bus_id == switch.adapter
        assert switch.path(h.bus_id)[:2] == switch.path(prof.devices()[h.gpu].bus_id)[:2]  # one upstream port


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"ports": 0}, r"infiniband\.ports: .*greater than or equal to 1"),
        ({"count": 0}, r"infiniband\.count: .*greater than or equal to 1"),
        ({"guids": ["a088:c203:0000:0001", "0xa088c20300000001"]}, r"infiniband\.guids: .*appears twice"),
        ({"guids": ["a088:c203"]}, r"infiniband\.guids: bad GUID 'a088:c203'"),
        ({"gpus": [70]}, r"infiniband\.gpus\.0: GPU 70 is not a GPU index"),
        ({"bus_ids": ["00000000:53:00.0"]}, r"infiniband\.bus_ids\.0: bus of 00000000:53:00\.0 is a GPU's"),
        ({"speed": "ZDR"}, r"infiniband\.speed: "),
    ],
)
def test_bad_adapters_are_one_line(tmp_path: Path, change: dict[str, object], message: str) -> None:
    data = yaml.safe_load((REPO / "gpumodel/profiles/h100.yaml").read_text())
    data["infiniband"].update(change)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    res = mokka("profile", "validate", str(path))
    assert res.returncode != 0
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    assert re.search(message, lines[0]), lines[0]


# ---- the staged tree -----------------------------------------------------------------------


def test_tree_is_what_the_kernel_shows(tmp_path: Path) -> None:
    prof = profiles.load("h100")
    sysfs.write_tree(prof, tmp_path)
    hcas = infiniband.adapters(prof)
    assert sorted(os.listdir(tmp_path / "sys/class/infiniband")) == [h.name for h in hcas]
    assert (tmp_path / "sys/class/infiniband_mad/abi_version").read_text() == "5\n"
    assert (tmp_path / "sys/class/infiniband_verbs/abi_version").read_text() == "6\n"
    for h in hcas:
        dev = (tmp_path / "sys/class/infiniband" / h.name).resolve()
        pci = dev.parent.parent
        assert pci.name == sysfs.PciName.of(h.bus_id).slot
        assert (pci / "vendor").read_text() == "0x15b3\n" and (pci / "class").read_text() == "0x020700\n"
        assert os.readlink(pci / "driver").endswith("bus/pci/drivers/mlx5_core")
        assert (dev / "node_guid").read_text() == format_guid(h.node_guid) + "\n"
        assert (dev / "hca_type").read_text() == "MT4129\n"
        port = dev / "ports/1"
        assert (port / "state").read_text() == "4: ACTIVE\n"
        assert (port / "rate").read_text() == "400 Gb/sec (4X NDR)\n"
        assert (port / "gids/0").read_text() == "fe80:0000:0000:0000:" + format_guid(h.node_guid) + "\n"
        umad = tmp_path / "sys/class/infiniband_mad" / f"umad{h.index}"
        assert (umad / "ibdev").read_text() == f"{h.name}\n" and (umad / "dev").read_text() == f"231:{h.index}\n"
        verbs = tmp_path / "sys/class/infiniband_verbs" / f"uverbs{h.index}"
        assert (verbs / "dev").read_text() == f"231:{192 + h.index}\n"
        assert (verbs / "device").resolve() == pci


# ---- the real tools ------------------------------------------------------------------------


@pytest.mark.consumers
def test_ibstat_and_ibstatus_read_the_adapters(node: Path) -> None:
    hcas = infiniband.adapters(profiles.load("h100"))
    res = shimmed(node, [tool("ibstat"), "-l"])
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == [h.name for h in hcas]
    h = hcas[5]
    out = shimmed(node, [tool("ibstat"), h.name]).stdout
    for line in (
        f"CA '{h.name}'",
        "CA type: MT4129",
        "Number of ports: 1",
        "Firmware version: 28.39.1002",
        "Hardware version: 0",
        f"Node GUID: 0x{h.node_guid:016x}",
        "State: Active",
        "Physical state: LinkUp",
        "Rate: 400",
        f"Base lid: {h.ports[0].lid}",
        "Capability mask: 0xa751e848",
        f"Port GUID: 0x{h.node_guid:016x}",
        "Link layer: InfiniBand",
    ):
        assert line in out, out
    status = shimmed(node, [tool("ibstatus")])
    assert status.returncode == 0, status.stdout + status.stderr
    assert status.stdout.count("state:\t\t 4: ACTIVE") == len(hcas)
    assert "rate:\t\t 400 Gb/sec (4X NDR)" in status.stdout


@pytest.mark.consumers
def test_lspci_lists_the_adapters_behind_the_gpus_switches(node: Path) -> None:
    res = shimmed(node, ["lspci", "-nn"])
    assert res.returncode == 0, res.stderr
    nics = [ln for ln in res.stdout.splitlines() if "[15b3:1021]" in ln]
    assert len(nics) == 8 and all("Infiniband controller [0207]" in ln and "ConnectX-7" in ln for ln in nics)
    tree = shimmed(node, ["lspci", "-t"]).stdout
    # root port, the switch's upstream port, then the NIC's and the GPU's downstream ports
    assert re.search(r"\[0000:4f\]---01\.0-\[50-53\]----00\.0-\[51-53\]--\+-00\.0-\[52\]----00\.0", tree), tree


@pytest.mark.consumers
def test_topo_shows_each_gpu_beside_its_nic(node: Path) -> None:
    res = shimmed(node, [str(node / "driver/usr/bin/nvidia-smi"), "topo", "-m"])
    assert res.returncode == 0, res.stdout + res.stderr
    rows = {ln.split("\t")[0]: ln.split("\t")[1:] for ln in res.stdout.splitlines() if ln.startswith(("GPU", "NIC"))}
    for gpu in range(8):
        cells = [c.strip() for c in rows[f"GPU{gpu}"][8:16]]
        for nic, cell in enumerate(cells):
            want = "PIX" if nic == gpu else "NODE" if nic // 4 == gpu // 4 else "SYS"
            assert cell == want, (gpu, nic, rows[f"GPU{gpu}"])
    assert "NIC Legend:" in res.stdout and "NIC7: mlx5_7" in res.stdout


@pytest.mark.consumers
@pytest.mark.parametrize("name", BUILTINS)
def test_topo_runs_on_every_profile_at_every_count(name: str) -> None:
    """The matrix never fails ("Failed to run topology matrix"), whatever GPUs and NICs a node has."""
    for gpus in (1, 2, 4, 8):
        res = mokka("exec", "--profile", name, "--gpus", str(gpus), "--", "nvidia-smi", "topo", "-m")
        assert res.returncode == 0, (gpus, res.stdout, res.stderr)
        header = res.stdout.splitlines()[0]
        nics = min(gpus, FABRICS.get(name, 0))
        assert header.count("NIC") == nics, (gpus, header)


@pytest.mark.consumers
def test_libibverbs_lists_the_adapters(node: Path) -> None:
    """ibv_devices: libibverbs finds each adapter in sysfs, matches Debian's mlx5 provider by the PCI
    id, and lists it once its /dev/infiniband/uverbsN exists (host setup makes the nodes, and the
    connection manager's one rdma_cm, a misc device)."""
    hcas = infiniband.adapters(profiles.load("h100"))
    assert sorted(os.listdir(node / "dev/infiniband")) == sorted(
        [f"uverbs{i}" for i in range(8)] + [f"umad{i}" for i in range(8)] + [f"issm{i}" for i in range(8)]
        + ["rdma_cm"]
    )  # fmt: skip
    assert os.major((node / "dev/infiniband/uverbs3").stat().st_rdev) == 231
    rdma_cm = (node / "dev/infiniband/rdma_cm").stat()
    assert (os.major(rdma_cm.st_rdev), os.minor(rdma_cm.st_rdev), rdma_cm.st_mode & 0o777) == (10, 58, 0o666)
    res = shimmed(node, [tool("ibv_devices")])
    assert res.returncode == 0, res.stderr
    listed = {ln.split()[0]: ln.split()[1] for ln in res.stdout.splitlines()[2:]}
    assert listed == {h.name: f"{h.node_guid:016x}" for h in hcas}
    res = mokka("exec", "--profile", "a100", "--gpus", "2", "--", "ibv_devices")
    assert res.returncode == 0 and len(res.stdout.splitlines()) == 4, res.stdout + res.stderr


@pytest.mark.consumers
def test_a_program_given_some_adapters_lists_those_alone(tmp_path: Path) -> None:
    """As in RDMA's exclusive namespace mode (DRA NIC drivers set it): a program that sees the
    uverbs devices of some adapters lists only them in the InfiniBand classes — libibverbs,
    libibumad (scandir), a shell's listing and nvidia-smi topo -m's hwloc — and one that sees
    none lists all (the shared mode). ibstat then finds no other adapter by name either."""
    root = tmp_path / "node"
    assert mokka("host", "setup", "--profile", "h100", "--root", str(root)).returncode == 0
    every = [f"mlx5_{i}" for i in range(8)]
    given = {"mlx5_3": 3, "mlx5_6": 6}
    for name in os.listdir(root / "dev/infiniband"):
        if name.startswith("uverbs") and int(name[6:]) not in given.values():
            (root / "dev/infiniband" / name).unlink()
    devices = shimmed(root, [tool("ibv_devices")]).stdout.splitlines()[2:]
    assert sorted(ln.split()[0] for ln in devices) == sorted(given)
    assert shimmed(root, [tool("ibstat"), "-l"]).stdout.split() == sorted(given)
    classes = [f"/sys/class/infiniband{suffix}" for suffix in ("", "_mad", "_verbs")]
    assert shimmed(root, ["ls", *classes]).stdout.split() == [
        f"{classes[0]}:", *sorted(given), f"{classes[1]}:", "abi_version", "issm3", "issm6", "umad3", "umad6",
        f"{classes[2]}:", "abi_version", "uverbs3", "uverbs6",
    ]  # fmt: skip
    topo = shimmed(root, [str(root / "driver/usr/bin/nvidia-smi"), "topo", "-m"])
    assert topo.returncode == 0, topo.stdout + topo.stderr
    assert "NIC0: mlx5_3" in topo.stdout and "NIC1: mlx5_6" in topo.stdout and "NIC2" not in topo.stdout
    rows = {ln.split("\t")[0]: ln.split("\t")[1:] for ln in topo.stdout.splitlines() if ln.startswith("GPU")}
    assert [rows[f"GPU{g}"][8:10] for g in (3, 6)] == [["PIX", "SYS"], ["SYS", "PIX"]], topo.stdout
    assert "'mlx5_0' IB device can't be found" in shimmed(root, [tool("ibstat"), "mlx5_0"]).stderr
    for name in given.values():
        (root / "dev/infiniband" / f"uverbs{name}").unlink()
    assert shimmed(root, [tool("ibstat"), "-l"]).stdout.split() == every


def test_cdi_generate_writes_the_adapters_spec_beside_the_gpus(node: Path, tmp_path: Path) -> None:
    """One file per kind: the GPUs' and, on a node with adapters, theirs (each adapter's
    /dev/infiniband nodes by its name, and `all`); a node without adapters gets the GPUs' alone."""
    out = tmp_path / "cdi"
    res = mokka("cdi", "generate", "--root", str(node), "--output", str(out))
    assert res.returncode == 0, res.stderr
    assert sorted(p.name for p in out.iterdir()) == ["mokka.io-hca.json", "nvidia.com-gpu.json"]
    assert f"wrote {out}/mokka.io-hca.json (cdiVersion 0.5.0, kind mokka.io/hca, 9 devices:" in res.stdout
    spec = json.loads((out / "mokka.io-hca.json").read_text())
    nodes = {d["name"]: [n["path"] for n in d["containerEdits"]["deviceNodes"]] for d in spec["devices"]}
    assert nodes["mlx5_5"] == ["/dev/infiniband/uverbs5", "/dev/infiniband/issm5", "/dev/infiniband/umad5"]
    assert len(nodes["all"]) == 24
    bare = tmp_path / "t4"
    assert mokka("host", "setup", "--profile", "t4", "--root", str(bare)).returncode == 0
    res = mokka("cdi", "generate", "--root", str(bare), "--output", str(tmp_path / "t4-cdi"))
    assert res.returncode == 0 and [p.name for p in (tmp_path / "t4-cdi").iterdir()] == ["nvidia.com-gpu.json"]


@pytest.mark.consumers
def test_mokka_exec_runs_ibstat_on_a_throwaway_node() -> None:
    res = mokka("exec", "--profile", "gb300", "--", "ibstat", "mlx5_3")
    assert res.returncode == 0, res.stderr
    assert "CA type: MT4131" in res.stdout and "Firmware version: 40.47.2526" in res.stdout
    assert "Rate: 800" in res.stdout  # 4X XDR


@pytest.mark.consumers
def test_ibv_devinfo_opens_each_adapter(node: Path) -> None:
    """ibv_devinfo (libibverbs, unmodified) opens each adapter and reads its device and port
    attributes: the shim answers the device verbs from the adapter's sysfs files."""
    hcas = infiniband.adapters(profiles.load("h100"))
    res = shimmed(node, [tool("ibv_devinfo"), "-l"])
    assert res.returncode == 0 and res.stdout.startswith("8 HCAs found:"), res.stdout + res.stderr
    assert sorted(res.stdout.split()[3:]) == [h.name for h in hcas]
    for hca in (hcas[0], hcas[5]):
        res = shimmed(node, [tool("ibv_devinfo"), "-v", "-d", hca.name])
        assert res.returncode == 0, res.stderr
        out = res.stdout
        guid = format_guid(hca.node_guid)
        for line in (
            f"hca_id:\t{hca.name}",
            "transport:\t\t\tInfiniBand (0)",
            f"fw_ver:\t\t\t\t{hca.spec.fw_version}",
            f"node_guid:\t\t\t{guid}",
            "vendor_id:\t\t\t0x02c9",
            f"vendor_part_id:\t\t\t{hca.spec.device_id}",
            f"board_id:\t\t\t{hca.spec.board_id}",
            "phys_port_cnt:\t\t\t1",
            "state:\t\t\tPORT_ACTIVE (4)",
            f"port_lid:\t\t{hca.ports[0].lid}",
            "link_layer:\t\tInfiniBand",
            "active_width:\t\t4X (2)",
            "active_speed:\t\t100.0 Gbps (128)",
            "phys_state:\t\tLINK_UP (5)",
            f"GID[  0]:\t\t{infiniband.gid0(hca.ports[0])}",
        ):
            assert line in out, (line, out)
    # The data path is not simulated: a program that goes on to allocate resources is told so.
    res = shimmed(node, [tool("ibv_rc_pingpong"), "-d", hcas[0].name])
    assert res.returncode != 0 and "Couldn't allocate PD" in res.stderr, res.stdout + res.stderr


def test_the_shims_verbs_structures_are_libibverbs_own() -> None:
    """The structures the shim fills (native/sysfs/ibverbs_abi.h) have the sizes and offsets of
    libibverbs' public header (libibverbs-dev; .ci/setup --tests installs it)."""
    header = Path("/usr/include/infiniband/verbs.h")
    if not header.exists():
        pytest.fail("infiniband/verbs.h not found: install Debian's libibverbs-dev (.ci/setup --tests does)")
    pairs = {
        "ibv_device_attr": (
            "mokka_ibv_device_attr",
            ["node_guid", "max_qp", "atomic_cap", "max_pkeys", "phys_port_cnt"],
        ),
        "ibv_port_attr": ("mokka_ibv_port_attr", ["gid_tbl_len", "lid", "sm_lid", "active_speed", "link_layer"]),
        "ibv_context": ("mokka_ibv_context", ["cmd_fd", "async_fd", "num_comp_vectors", "mutex", "abi_compat"]),
    }
    checks = []
    for real, (ours, fields) in pairs.items():
        checks.append(f'_Static_assert(sizeof(struct {real}) == sizeof(struct {ours}), "{real}");')
        for f in fields:
            checks.append(
                f'_Static_assert(offsetof(struct {real}, {f}) == offsetof(struct {ours}, {f}), "{real}.{f}");'
            )
    source = '#include <stddef.h>\n#include <infiniband/verbs.h>\n#include "ibverbs_abi.h"\n' + "\n".join(checks)
    res = subprocess.run(
        ["cc", "-fsyntax-only", "-I", str(REPO / "native/sysfs"), "-x", "c", "-"],
        input=source,
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr


@pytest.mark.consumers
def test_mad_tools_ask_the_port(node: Path) -> None:
    """perfquery, smpquery, ibaddr and sminfo (libibmad and libibumad, unmodified) send their MADs
    through the umad device; the shim answers what the port itself holds, and libibmad decodes it."""
    hca = infiniband.adapters(profiles.load("h100"))[2]
    port = hca.ports[0]
    ca = ["-C", hca.name]
    res = shimmed(node, [tool("smpquery"), *ca, "-D", "nodeinfo", "0"])
    assert res.returncode == 0, res.stderr
    for line in (
        "NodeType:........................Channel Adapter",
        "NumPorts:........................1",
        f"Guid:............................0x{hca.node_guid:016x}",
        f"PortGuid:........................0x{port.guid:016x}",
        f"DevId:...........................0x{hca.spec.device_id:04x}",
        "VendorId:........................0x0002c9",
    ):
        assert line in res.stdout, (line, res.stdout)
    res = shimmed(node, [tool("smpquery"), *ca, "-D", "portinfo", "0"])
    assert res.returncode == 0, res.stderr
    for line in (
        f"Lid:.............................{port.lid}",
        "SMLid:...........................1",
        "LinkWidthActive:.................4X",
        "LinkState:.......................Active",
        "PhysLinkState:...................LinkUp",
        "LinkSpeedExtActive:..............106.25 Gbps",  # NDR
        f"CapMask:.........................0x{ibsysfs.CAP_MASK:x}",
    ):
        assert line in res.stdout, (line, res.stdout)
    assert f"h100 {hca.name}" in shimmed(node, [tool("smpquery"), *ca, "-D", "nodedesc", "0"]).stdout
    res = shimmed(node, [tool("ibaddr"), *ca])
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == f"GID fe80::{_ipv6_tail(port.guid)} LID start 0x{port.lid:x} end 0x{port.lid:x}"
    res = shimmed(node, [tool("sminfo"), *ca])
    spine = fabric.switch_guid("spine")  # the subnet manager
    assert res.returncode == 0 and f"sm lid 1 sm guid 0x{spine:016x}," in res.stdout, res.stdout + res.stderr
    assert res.stdout.rstrip().endswith("state 3 SMINFO_MASTER")
    res = shimmed(node, [tool("perfquery"), *ca])
    assert res.returncode == 0, res.stderr
    assert f"# Port counters: Lid {port.lid} port 1 (CapMask: 0x5A00)" in res.stdout
    assert "SymbolErrorCounter:..............0" in res.stdout
    res = shimmed(node, [tool("perfquery"), *ca, "-x"])
    assert res.returncode == 0 and "PortXmitData:....................0" in res.stdout, res.stderr


@pytest.fixture(scope="module")
def subnet(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[str, profiles.Profile, Path]]:
    """Two h100 nodes of a fleet (each with adapters of its own) staged by host setup, then given
    the subnet of both as the local cluster gives it its nodes: the subnet's relay directory
    shared, and each node's view of the fabric."""
    from hostsetup import node as hostnode

    relay = tmp_path_factory.mktemp("ib-relay")
    relay.chmod(hostnode.RELAY_MODE)
    out = []
    for name in ("h100-0", "h100-1"):
        prof = fleet.as_node(profiles.load("h100"), name)
        root = tmp_path_factory.mktemp(name)
        hostnode.apply(hostnode.plan(prof, hostnode.Options(root=root, ib_relay=relay)))
        out.append((name, prof, root))
    ibsysfs.write_fabric(out)
    return out


@pytest.mark.consumers
def test_the_fabric_walks_to_the_other_node(subnet: list[tuple[str, profiles.Profile, Path]]) -> None:
    """ibnetdiscover and iblinkinfo (libibnetdisc) from one node walk the rails' leaf switches and
    the spine to the other node's adapters; sminfo finds the spine's subnet manager; smpquery by
    LID reaches the other node's adapter."""
    (_, _, root0), (_, prof1, _) = subnet
    other = infiniband.adapters(prof1)
    res = shimmed(root0, [tool("ibnetdiscover"), "-p"])
    assert res.returncode == 0, res.stderr
    cas = [ln for ln in res.stdout.splitlines() if ln.startswith("CA ")]
    assert len(cas) == 16, res.stdout  # 8 adapters on each node
    for hca in other:
        assert f"0x{hca.node_guid:016x} 4x NDR - SW" in res.stdout and f"'h100-1 {hca.name}'" in res.stdout
    switches = {ln.split("'")[1] for ln in res.stdout.splitlines() if ln.startswith("SW ")}
    assert switches == {f"{fabric.SWITCH_DESC} leaf{r}" for r in range(8)} | {f"{fabric.SWITCH_DESC} spine"}
    res = shimmed(root0, [tool("iblinkinfo"), "-l"])
    assert res.returncode == 0, res.stderr
    spine_links = [ln for ln in res.stdout.splitlines() if "spine" in ln and "Active" in ln]
    assert len(spine_links) >= 8, res.stdout
    res = shimmed(root0, [tool("sminfo")])
    assert f"sm lid 1 sm guid 0x{fabric.switch_guid('spine'):016x}" in res.stdout, res.stdout + res.stderr
    target = other[3].ports[0]
    res = shimmed(root0, [tool("smpquery"), "nodedesc", str(target.lid)])
    assert res.returncode == 0 and "h100-1 mlx5_3" in res.stdout, res.stdout + res.stderr


@pytest.mark.consumers
def test_a_port_down_on_one_node_is_a_link_down_in_the_others_view(
    subnet: list[tuple[str, profiles.Profile, Path]],
) -> None:
    (_, _, root0), (_, _, root1) = subnet
    leaf5 = fabric.switch_guid("leaf5")
    try:
        ib_ports.set_link(root1, 5, 1, up=False)
        ibsysfs.sync_fabric([root0, root1])
        out = shimmed(root0, [tool("iblinkinfo"), "-S", f"0x{leaf5:016x}"]).stdout
        assert "    2[  ] ==(                Down/Disabled)" in out, out
        assert "h100-1 mlx5_5" not in shimmed(root0, [tool("ibnetdiscover"), "-p"]).stdout
    finally:
        ib_ports.clear_port(root1, 5, 1)
        ibsysfs.sync_fabric([root0, root1])
    assert "h100-1 mlx5_5" in shimmed(root0, [tool("ibnetdiscover"), "-p"]).stdout


@pytest.mark.consumers
def test_perfquery_reads_another_nodes_port_as_the_fabric_last_saw_it(
    subnet: list[tuple[str, profiles.Profile, Path]],
) -> None:
    """perfquery by LID: another node's adapter port answers with its counters as the cluster last
    synced them (a fault there shows once the fabric is synced, as `mokka fault --node` does), a
    switch with zeros, another adapter of the same node from its own files; a LID behind a link
    that is down gets no answer."""
    (_, prof0, root0), (_, prof1, root1) = subnet
    target = infiniband.adapters(prof1)[2].ports[0]
    try:
        ib_ports.add_link_errors(root1, 2, 1, 25)
        res = shimmed(root0, [tool("perfquery"), str(target.lid), "1"])
        assert "SymbolErrorCounter:..............0" in res.stdout, res.stdout + res.stderr  # not synced yet
        ibsysfs.sync_fabric([root0, root1])
        res = shimmed(root0, [tool("perfquery"), str(target.lid), "1"])
        assert res.returncode == 0, res.stderr
        assert f"# Port counters: Lid {target.lid} port 1 (CapMask: 0x5A00)" in res.stdout
        assert (
            "SymbolErrorCounter:..............25" in res.stdout and "PortRcvErrors:...................25" in res.stdout
        )
        spine = shimmed(root0, [tool("perfquery"), str(fabric.SM_LID), "5"])
        assert spine.returncode == 0 and "SymbolErrorCounter:..............0" in spine.stdout, spine.stderr
        ib_ports.add_link_errors(root0, 6, 1, 7)
        mine = infiniband.adapters(prof0)[6].ports[0]
        res = shimmed(root0, [tool("perfquery"), "-C", "mlx5_0", str(mine.lid), "1"])
        assert "SymbolErrorCounter:..............7" in res.stdout, res.stdout + res.stderr  # its files, at once
        ib_ports.set_link(root1, 2, 1, up=False)
        ibsysfs.sync_fabric([root0, root1])
        gone = shimmed(root0, [tool("perfquery"), "-t", "200", str(target.lid), "1"])
        assert gone.returncode != 0, gone.stdout
    finally:
        for root, hca in ((root1, 2), (root0, 6)):
            ib_ports.clear_port(root, hca, 1)
        ibsysfs.sync_fabric([root0, root1])


def port_lid(root: Path, hca: str) -> int:
    return int((root / "sys/class/infiniband" / hca / "ports/1/lid").read_text(), 16)


@pytest.mark.consumers
def test_ibping_reaches_the_server_on_the_other_node(subnet: list[tuple[str, profiles.Profile, Path]]) -> None:
    """ibping -S on the other node's mlx5_2 answers ibping from this node through the subnet's relay
    directory (each node's ib-relay links to it): every ping gets its pong with the server's host
    name; once the server has ended, a ping gets no answer (100% loss), as towards a node that does
    not run it."""
    (_, _, root0), (_, _, root1) = subnet
    lid = port_lid(root1, "mlx5_2")
    argv = [tool("ibping"), "-S", "-C", "mlx5_2"]
    server = subprocess.Popen(argv, env=shim_env(root1), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 10
        while not (root1 / "ib-relay" / f"{lid}.32").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        res = shimmed(root0, [tool("ibping"), "-c", "3", str(lid)])
        assert res.returncode == 0, res.stdout + res.stderr
        pongs = [ln for ln in res.stdout.splitlines() if ln.startswith("Pong from ")]
        assert len(pongs) == 3 and all(f"(Lid {lid})" in p for p in pongs), res.stdout
        assert "3 packets transmitted, 3 received, 0% packet loss" in res.stdout, res.stdout
        assert (root0 / "ib-relay").resolve() == (root1 / "ib-relay").resolve()
    finally:
        server.terminate()
        server.wait(10)
    res = shimmed(root0, [tool("ibping"), "-c", "1", "-t", "200", str(lid)])
    assert "1 packets transmitted, 0 received, 100% packet loss" in res.stdout, res.stdout + res.stderr


def test_the_subnet_manager_gives_two_ports_that_hash_alike_two_lids(tmp_path: Path) -> None:
    """LIDs are the SM's: two nodes whose adapter GUIDs hash to one LID get two, in their trees and
    in the fabric; smpquery by each LID reaches its own node; a port brought back up gets its LID
    from the fabric again."""
    from hostsetup import node as hostnode

    first = (infiniband.OUI << 40) | 0x1000
    nodes = []
    for i, guid in enumerate((first, first + 0xBFFE)):  # lid_of: 1 + guid % 0xbffe, the same for both
        base = profiles.load("h100").with_count(1)
        assert base.infiniband is not None
        ib = base.infiniband.model_copy(update={"guids": [format_guid(guid)]})
        prof = base.model_copy(update={"name": f"h100-{i}", "infiniband": ib})
        root = tmp_path / f"h100-{i}"
        hostnode.apply(hostnode.plan(prof, hostnode.Options(root=root)))
        nodes.append((f"h100-{i}", prof, root))
    assert infiniband.lid_of(first) == infiniband.lid_of(first + 0xBFFE)
    ibsysfs.write_fabric(nodes)

    def lid(root: Path) -> int:
        return int((root / "sys/class/infiniband/mlx5_0/ports/1/lid").read_text(), 16)

    lids = [lid(root) for _, _, root in nodes]
    assert lids[0] == infiniband.lid_of(first) and lids[1] != lids[0], lids
    assert fabric.file_lids((nodes[0][2] / fabric.FILE).read_text())[first + 0xBFFE] == lids[1]
    for (name, _, _), target in zip(nodes, lids, strict=True):
        res = shimmed(nodes[0][2], [tool("smpquery"), "nodedesc", str(target)])
        assert f"{name} mlx5_0" in res.stdout, res.stdout + res.stderr
    root1 = nodes[1][2]
    ib_ports.set_link(root1, 0, 1, up=False)
    assert lid(root1) == 0
    ib_ports.clear_port(root1, 0, 1)
    assert lid(root1) == lids[1]


def _ipv6_tail(guid: int) -> str:
    """The GUID's four groups as an IPv6 address prints them (leading zeros dropped)."""
    return ":".join(f"{(guid >> s) & 0xFFFF:x}" for s in (48, 32, 16, 0))


@pytest.mark.consumers
def test_mokka_exec_runs_the_rdma_tools_on_a_throwaway_node() -> None:
    res = mokka("exec", "--profile", "h100", "--", "sh", "-c", "ibv_devinfo -d mlx5_7 && perfquery -C mlx5_7")
    assert res.returncode == 0, res.stderr
    assert "hca_id:\tmlx5_7" in res.stdout and "# Port counters: Lid" in res.stdout


# ---- faults --------------------------------------------------------------------------------


@pytest.mark.consumers
def test_port_faults_and_clear(node: Path) -> None:
    ibstat = tool("ibstat")
    port = node / "sys/class/infiniband/mlx5_2/ports/1"
    lid = shimmed(node, [ibstat, "mlx5_2"]).stdout.split("Base lid: ")[1].split()[0]

    res = mokka("fault", "ib-port-down", "--hca", "2", "--root", str(node))
    assert res.returncode == 0 and res.stdout.strip() == "mlx5_2 port 1: Down, Disabled", res.stderr
    out = shimmed(node, [ibstat, "mlx5_2"]).stdout
    assert "State: Down" in out and "Physical state: Disabled" in out and "Base lid: 0" in out
    assert "1: DOWN" in shimmed(node, [tool("ibstatus"), "mlx5_2"]).stdout
    smpquery = [tool("smpquery"), "-C", "mlx5_2", "-P", "1", "-D", "portinfo", "0"]  # a down port: named
    smp = shimmed(node, smpquery).stdout
    assert "LinkState:.......................Down" in smp and "PhysLinkState:...................Disabled" in smp
    assert (port / "counters/link_downed").read_text() == "1\n"
    assert "State: Active" in shimmed(node, [ibstat, "mlx5_3"]).stdout  # the others untouched

    res = mokka("fault", "ib-link-errors", "--hca", "2", "--count", "25", "--root", str(node))
    assert res.returncode == 0 and "SymbolErrorCounter 25" in res.stdout, res.stderr
    assert (port / "counters/symbol_error").read_text() == "25\n"
    assert (port / "counters/link_error_recovery").read_text() == "1\n"

    res = mokka("fault", "ib-clear", "--hca", "2", "--root", str(node))
    assert res.returncode == 0, res.stderr
    out = shimmed(node, [ibstat, "mlx5_2"]).stdout
    assert "State: Active" in out and f"Base lid: {lid}" in out
    assert all(f.read_text() == "0\n" for f in (port / "counters").iterdir())


@pytest.mark.consumers
def test_perfquery_counts_injected_link_errors(node: Path) -> None:
    """perfquery reads the port's counters as they move: injected symbol errors, the link's recovery
    and its going down, and zeros again once cleared."""
    perfquery = [tool("perfquery"), "-C", "mlx5_6"]
    assert mokka("fault", "ib-link-errors", "--hca", "6", "--count", "7", "--root", str(node)).returncode == 0
    out = shimmed(node, perfquery).stdout
    assert "SymbolErrorCounter:..............7" in out and "LinkErrorRecoveryCounter:........1" in out, out
    assert "PortRcvErrors:...................7" in out, out
    assert mokka("fault", "ib-link-errors", "--hca", "6", "--count", "70000", "--root", str(node)).returncode == 0
    assert "SymbolErrorCounter:..............65535" in shimmed(node, perfquery).stdout  # 16 bits, saturated
    assert mokka("fault", "ib-clear", "--hca", "6", "--root", str(node)).returncode == 0
    out = shimmed(node, perfquery).stdout
    assert "SymbolErrorCounter:..............0" in out and "LinkErrorRecoveryCounter:........0" in out, out


def test_perfquery_counts_injected_traffic(node: Path) -> None:
    """`mokka fault ib-traffic`: the port counts the octets each way in 4-octet words (PortXmitData,
    PortRcvData: 32 bits in perfquery's PortCounters, saturated; 64 in -x) and in 4096-octet
    packets; a port that is down carries none."""
    perfquery = [tool("perfquery"), "-C", "mlx5_5"]
    res = mokka("fault", "ib-traffic", "--hca", "5", "--bytes", "1000000", "--root", str(node))
    assert res.returncode == 0 and "mlx5_5 port 1: PortXmitData 250000 (4-octet words)" in res.stdout, res.stderr
    out = shimmed(node, perfquery).stdout
    assert "PortXmitData:....................250000" in out and "PortRcvData:.....................250000" in out
    assert "PortXmitPkts:....................245" in out and "PortRcvPkts:.....................245" in out, out
    assert mokka("fault", "ib-traffic", "--hca", "5", "--bytes", str(1 << 40), "--root", str(node)).returncode == 0
    assert "PortXmitData:....................4294967295" in shimmed(node, perfquery).stdout  # 32 bits, saturated
    assert f"PortXmitData:....................{250000 + (1 << 38)}" in shimmed(node, [*perfquery, "-x"]).stdout
    try:
        assert mokka("fault", "ib-port-down", "--hca", "5", "--root", str(node)).returncode == 0
        res = mokka("fault", "ib-traffic", "--hca", "5", "--root", str(node))
        assert res.returncode != 0 and res.stderr.strip().splitlines() == [
            "mokka: error: mlx5_5 port 1 is down: a link that is down carries no traffic"
        ]
    finally:
        assert mokka("fault", "ib-clear", "--hca", "5", "--root", str(node)).returncode == 0
    assert "PortXmitData:....................0" in shimmed(node, perfquery).stdout


SCENARIO = """
steps:
  - {hca: 1, ib-link-errors: 12}
  - {hca: 0, ib-traffic: 4096}
  - {at: 0.2s, hca: [2, 3], ib-port-down: true}
  - {at: 0.2s, gpu: 0, xid: 79}
"""


def test_a_scenario_steps_on_the_adapters(tmp_path: Path) -> None:
    """`mokka fault run`: InfiniBand steps (hca, not gpu) beside GPU steps, on a staged node."""
    root = tmp_path / "node"
    assert mokka("host", "setup", "--profile", "h100", "--gpus", "4", "--root", str(root)).returncode == 0
    (tmp_path / "s.yaml").write_text(SCENARIO)
    res = mokka("fault", "run", str(tmp_path / "s.yaml"), "--root", str(root))
    assert res.returncode == 0, res.stderr
    assert "mlx5_1 port 1: ib-link-errors count=12" in res.stdout and "mlx5_2,mlx5_3 port 1: ib-port-down" in res.stdout
    ports = root / "sys/class/infiniband"
    assert (ports / "mlx5_1/ports/1/counters/symbol_error").read_text() == "12\n"
    assert (ports / "mlx5_0/ports/1/counters/port_xmit_data").read_text() == "1024\n"
    assert [(ports / f"mlx5_{i}/ports/1/state").read_text() for i in (2, 3, 0)] == ["1: DOWN\n"] * 2 + ["4: ACTIVE\n"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("steps:\n  - {ib-port-down: true}\n", "s.yaml: steps.0: ib-port-down names its adapter with hca: N"),
        ("steps:\n  - {hca: 0, gpu: 1, ib-clear: true}\n", "s.yaml: steps.0: ib-clear names its adapter"),
        ("steps:\n  - {hca: 0, xid: 79}\n", "s.yaml: steps.0: xid names GPUs, not hca"),
        ("steps:\n  - {hca: 0, ib-link-errors: 0}\n", "s.yaml: steps.0.ib-link-errors.count: Input should be greater"),
        ("steps:\n  - {hca: 0, ib-traffic: -1}\n", "s.yaml: steps.0.ib-traffic.octets: Input should be greater"),
        ("steps:\n  - {gpu: 0, xid: 13}\n  - {hca: 6, ib-port-down: true}\n", "s.yaml: steps.1: --hca 6: no adapter"),
    ],
)
def test_a_bad_infiniband_step_is_one_line_and_changes_nothing(tmp_path: Path, text: str, message: str) -> None:
    from gpumodel import faults

    root = tmp_path / "node"
    assert mokka("host", "setup", "--profile", "h100", "--gpus", "2", "--root", str(root)).returncode == 0
    before = {p: p.read_bytes() for p in (root / "sys/class/infiniband/mlx5_0/ports/1").rglob("*") if p.is_file()}
    state = faults.for_root(root).state.read_bytes()
    (tmp_path / "s.yaml").write_text(text)
    res = mokka("fault", "run", "s.yaml", "--root", str(root), cwd=tmp_path)
    assert res.returncode != 0 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert message in res.stderr, res.stderr
    assert before == {p: p.read_bytes() for p in before}
    assert state == faults.for_root(root).state.read_bytes()  # no GPU step either


def test_the_fault_config_map_reaches_the_adapters(tmp_path: Path) -> None:
    """The chart's fault watcher (k8snode.faultwatch): an entry's InfiniBand steps change the
    node's ports; the entry's removal brings them back as staged."""
    from gpumodel import faults
    from k8snode.faultwatch import FaultWatcher

    root = tmp_path / "node"
    assert mokka("host", "setup", "--profile", "h100", "--gpus", "2", "--root", str(root)).returncode == 0
    lines: list[str] = []
    w = FaultWatcher(faults.for_root(root), "ConfigMap mokka/mokka-faults key node-a", report=lines.append)
    w.reconcile("steps:\n  - {hca: 1, ib-port-down: true}\n  - {hca: 0, ib-link-errors: 3}\n")
    w.wait()
    port1 = root / "sys/class/infiniband/mlx5_1/ports/1"
    assert (port1 / "state").read_text() == "1: DOWN\n", lines
    assert (root / "sys/class/infiniband/mlx5_0/ports/1/counters/symbol_error").read_text() == "3\n"
    w.reconcile(None)
    assert (port1 / "state").read_text() == "4: ACTIVE\n" and (port1 / "counters/link_downed").read_text() == "0\n"
    assert ib_ports.clear_all(root) == []  # nothing left to clear
    assert any("mlx5_1 port 1: cleared" in line for line in lines), lines


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["ib-port-down", "--hca", "8"], r"^mokka: error: --hca 8: no adapter mlx5_8 on this node \(it has mlx5_0, "),
        (["ib-clear", "--hca", "0", "--port", "2"], r"^mokka: error: --port 2: mlx5_0 has port 1$"),
        (["ib-link-errors", "--hca", "0", "--count", "0"], r"^mokka: error: --count 0: at least 1 symbol error$"),
        (["ib-traffic", "--hca", "0", "--bytes", "0"], r"^mokka: error: --bytes 0: at least 1 octet$"),
    ],
)
def test_bad_port_faults_are_one_line_and_change_nothing(node: Path, args: list[str], message: str) -> None:
    before = {p: p.read_bytes() for p in (node / "sys/class/infiniband/mlx5_0/ports/1").rglob("*") if p.is_file()}
    res = mokka("fault", *args, "--root", str(node))
    assert res.returncode != 0 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert re.search(message, res.stderr.strip()), res.stderr
    assert before == {p: p.read_bytes() for p in before}


def test_a_node_without_adapters_says_so(tmp_path: Path) -> None:
    res = mokka("host", "setup", "--profile", "l40s", "--gpus", "1", "--root", str(tmp_path), "--no-nvidia-smi")
    assert res.returncode == 0, res.stderr
    res = mokka("fault", "ib-port-down", "--hca", "0", "--root", str(tmp_path))
    assert res.returncode != 0
    assert res.stderr.strip().endswith("the staged node has no InfiniBand adapters (its profile has no infiniband)")
    assert not ib_ports.ports(tmp_path)
