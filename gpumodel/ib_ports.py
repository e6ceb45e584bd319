"""A staged node's InfiniBand ports as they are now, and the faults that change them in place.

The ports live in the node's sysfs tree (staged by ``hostsetup/infiniband.py``); every reader
(``ibstat``, the shim's MAD responder, containers through the NRI plugin's mount) sees a change
at once. ``mokka fault ib-port-down | ib-link-errors | ib-traffic | ib-clear`` and fault scenarios (steps
with ``hca``: the cluster's fault ConfigMap too) go through these functions alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from . import atomic, fabric
from .infiniband import lid_of

MTU = 4096  # octets per packet: the adapters' active MTU

__all__ = [
    "PortFaultError",
    "add_link_errors",
    "add_traffic",
    "apply",
    "clear_all",
    "clear_port",
    "phys_state_text",
    "port_dir",
    "port_up",
    "ports",
    "set_link",
    "state_text",
    "write_value",
]


def state_text(up: bool) -> str:
    return "4: ACTIVE" if up else "1: DOWN"


def phys_state_text(up: bool) -> str:
    return "5: LinkUp" if up else "3: Disabled"


class PortFaultError(Exception):
    """An InfiniBand fault cannot be applied; nothing was changed."""


def port_dir(root: Path, hca: int, port: int) -> Path:
    """``ports/<port>`` of adapter ``mlx5_<hca>`` in the tree staged under ``root``."""
    base = root / "sys/class/infiniband"
    if not base.is_dir():
        raise PortFaultError(f"{root}: the staged node has no InfiniBand adapters (its profile has no infiniband)")
    names = sorted(p.name for p in base.iterdir())
    dev = base / f"mlx5_{hca}"
    if not dev.exists():
        raise PortFaultError(f"--hca {hca}: no adapter mlx5_{hca} on this node (it has {', '.join(names)})")
    ports = sorted(int(p.name) for p in (dev / "ports").iterdir())
    if port not in ports:
        raise PortFaultError(f"--port {port}: mlx5_{hca} has port {', '.join(map(str, ports))}")
    return (dev / "ports" / str(port)).resolve()


def _read_int(path: Path) -> int:
    return int(path.read_text().strip() or "0")


def write_value(path: Path, value: str) -> None:
    """A sysfs-style file (``value`` and a newline), written atomically."""
    atomic.write(path, (value + "\n").encode(), 0o644)


def port_up(pdir: Path) -> bool:
    """The port (its ``ports/<n>`` directory) is Active."""
    return pdir.joinpath("state").read_text().strip() == state_text(True)


def _port_guid(pdir: Path) -> int:
    return int(pdir.joinpath("gids/0").read_text().strip().replace(":", "")[16:], 16)


def _lid(root: Path, pdir: Path) -> int:
    """The port's LID: the subnet manager's, as the node's fabric file says (else its GUID's hash)."""
    guid = _port_guid(pdir)
    try:
        return fabric.file_lids((root / fabric.FILE).read_text()).get(guid) or lid_of(guid)
    except OSError:
        return lid_of(guid)


def set_link(root: Path, hca: int, port: int, up: bool) -> str:
    """Take the port's link down (Down, Disabled, no LID, LinkDownedCounter + 1) or bring it up."""
    pdir = port_dir(root, hca, port)
    was_up = port_up(pdir)
    infiniband = pdir.joinpath("link_layer").read_text().strip() == "InfiniBand"
    write_value(pdir / "state", state_text(up))
    write_value(pdir / "phys_state", phys_state_text(up))
    write_value(pdir / "lid", f"0x{_lid(root, pdir):x}" if up and infiniband else "0x0")
    write_value(pdir / "sm_lid", "0x1" if up and infiniband else "0x0")
    if was_up and not up:
        write_value(pdir / "counters/link_downed", str(_read_int(pdir / "counters/link_downed") + 1))
    return f"mlx5_{hca} port {port}: {'Active, LinkUp' if up else 'Down, Disabled'}"


def add_link_errors(root: Path, hca: int, port: int, symbols: int) -> str:
    """Errors on a live link: symbol errors (SymbolErrorCounter), one link error recovery and the
    receive errors they cause (PortRcvErrors)."""
    if symbols < 1:
        raise PortFaultError(f"--count {symbols}: at least 1 symbol error")
    pdir = port_dir(root, hca, port)
    for name, added in (("symbol_error", symbols), ("link_error_recovery", 1), ("port_rcv_errors", symbols)):
        write_value(pdir / "counters" / name, str(_read_int(pdir / "counters" / name) + added))
    total = _read_int(pdir / "counters/symbol_error")
    return f"mlx5_{hca} port {port}: SymbolErrorCounter {total}"


def add_traffic(root: Path, hca: int, port: int, octets: int) -> str:
    """Traffic through a live port: ``octets`` sent and as many received, as the port counts them:
    PortXmitData/PortRcvData in 4-octet words, PortXmitPkts/PortRcvPkts (and their unicast
    counters) in packets of the 4096-octet MTU."""
    if octets < 1:
        raise PortFaultError(f"--bytes {octets}: at least 1 octet")
    pdir = port_dir(root, hca, port)
    if not port_up(pdir):
        raise PortFaultError(f"mlx5_{hca} port {port} is down: a link that is down carries no traffic")
    words, packets = -(-octets // 4), -(-octets // MTU)
    added = {"port_xmit_data": words, "port_rcv_data": words}
    added |= {f"{kind}_{way}_packets": packets for kind in ("port", "unicast") for way in ("xmit", "rcv")}
    for name, n in added.items():
        write_value(pdir / "counters" / name, str(_read_int(pdir / "counters" / name) + n))
    total = _read_int(pdir / "counters/port_xmit_data")
    return f"mlx5_{hca} port {port}: PortXmitData {total} (4-octet words), {packets} packets each way"


def clear_port(root: Path, hca: int, port: int) -> str:
    """The port as staged: up, every counter back to 0."""
    pdir = port_dir(root, hca, port)
    set_link(root, hca, port, True)
    for sub in ("counters", "hw_counters"):
        for f in sorted((pdir / sub).iterdir()):
            if f.read_text().strip() != "0":
                write_value(f, "0")
    return f"mlx5_{hca} port {port}: cleared (Active, counters 0)"


def ports(root: Path) -> list[tuple[int, int]]:
    """Every (adapter, port) of the node staged under ``root``."""
    base = root / "sys/class/infiniband"
    if not base.is_dir():
        return []
    out = []
    for dev in sorted(base.iterdir(), key=lambda p: int(p.name.rpartition("_")[2])):
        out += [(int(dev.name.rpartition("_")[2]), int(p.name)) for p in sorted((dev / "ports").iterdir())]
    return out


def clear_all(root: Path) -> list[str]:
    """Every port of the node as staged (up, counters 0) where it is not; what was cleared."""
    done = []
    for hca, port in ports(root):
        pdir = port_dir(root, hca, port)
        pristine = port_up(pdir) and all(
            f.read_text().strip() == "0" for sub in ("counters", "hw_counters") for f in (pdir / sub).iterdir()
        )
        if not pristine:
            done.append(clear_port(root, hca, port))
    return done


def apply(root: Path, hca: int, port: int, fault: Any) -> str:
    """A scenario's InfiniBand fault (:mod:`gpumodel.faultspec`: ib-port-down, ib-link-errors, ib-traffic,
    ib-clear)."""
    if fault.kind == "ib-port-down":
        return set_link(root, hca, port, up=False)
    if fault.kind == "ib-link-errors":
        return add_link_errors(root, hca, port, fault.count)
    if fault.kind == "ib-traffic":
        return add_traffic(root, hca, port, fault.octets)
    if fault.kind == "ib-clear":
        return clear_port(root, hca, port)
    raise ValueError(f"not an InfiniBand fault: {fault.kind}")
