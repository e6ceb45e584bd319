"""The kernel log lines the NVIDIA driver prints for an Xid, appended to a staged log file.

Format of the 535/550/570 drivers (``krcReportXid``; see docs/guides/faults.md, "Kernel log")::

    NVRM: GPU at PCI:0000:1a:00: GPU-4f2c...            once per GPU and driver load, before its first Xid
    NVRM: GPU Board Serial Number: 1650000000001
    NVRM: Xid (PCI:0000:1a:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.
    NVRM: GPU 0000:1a:00.0: GPU has fallen off the bus.  (Xid 79 only)

The PCI part is domain, bus and device in lower-case hex without the function; ``pid`` is
``'<unknown>'`` (quoted) and ``name`` ``<unknown>`` when no process is attributed. Each line
is written as rsyslog writes kernel messages to ``/var/log/kern.log``::

    Dec  1 13:25:54 node-a kernel: [ 3461.208113] NVRM: Xid (PCI:0000:1a:00): 79, ...

so parsers of dmesg, journald exports and syslog files (``NVRM: Xid.*?: (\\d+),``) all match.
A real driver writes to the kernel ring buffer; Mokka never touches the host's.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterable
from pathlib import Path

# Default message per Xid, in the form the driver prints it (after "name=..., ").
# Addresses, channels and units are fixed example values; `mokka fault xid --message` overrides.
MESSAGES: dict[int, str] = {
    13: "Graphics SM Warp Exception on (GPC 0, TPC 0, SM 0): Illegal Instruction Parameter",
    31: (
        "Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPC0 GPCCLIENT_T1_0 faulted @ 0x7f3a_8c000000. "
        "Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ"
    ),
    43: "Ch 00000008",
    45: "Ch 00000008",
    48: (
        "An uncorrectable double bit error (DBE) has been detected on GPU in the framebuffer at physAddr "
        "0x{address:x} partition 0, subpartition 0."
    ),
    62: "00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000",
    68: "NVDEC0 Exception",
    69: "Class Error: ChId 0008, Class 0000cbc0, Offset 00000184, Data ffffffff, ErrorCode 00000004",
    74: "NVLink: fatal error detected on link {link}(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)",
    79: "GPU has fallen off the bus.",
    92: "Disabling ECC single-bit error interrupts in framebuffer at logical partition 0, due to high error rate",
    94: "Contained: SM (0x1). RST: No, D-RST: No",
    95: "Uncontained: LTC TAG (0x2,0x0). RST: Yes, D-RST: No",
    109: "Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005",
    119: "Timeout after 6s of waiting for RPC response from GPU{index} GSP! Expected function 103 (GSP_RM_ALLOC) "
    "(0x2081 0x4).",
    120: "GSP task exception: load access fault",
}
# Xids 63 and 64 say what the board does with a bad DRAM row: remap it (Ampere and later) or
# retire its page (earlier boards).
REMAP_MESSAGES = {
    63: "Row Remapper: New row (0x{address:016x}) marked for remapping, reset gpu to activate.",
    64: "Row Remapper Error: (0x{address:016x}) - All reserved rows for bank are remapped",
}
RETIRE_MESSAGES = {
    63: "Dynamic Page Retirement: New retired page, reload the driver to activate. (0x{address:016x})",
    64: "Dynamic Page Retirement: Fatal error, unable to retire page (0x{address:016x})",
}


def pci(bus_id: str) -> str:
    """``00000000:1A:00.0`` → ``0000:1a:00`` (the driver's form in Xid lines)."""
    dom, bus, devfn = bus_id.split(":")
    return f"{int(dom, 16) & 0xFFFF:04x}:{int(bus, 16):02x}:{int(devfn.split('.')[0], 16):02x}"


def pci_function(bus_id: str) -> str:
    """``00000000:1A:00.0`` → ``0000:1a:00.0`` (the form of the fell-off-the-bus line)."""
    return f"{pci(bus_id)}.{int(bus_id.rsplit('.', 1)[1], 16):x}"


def default_message(code: int, remap: bool, **values: int) -> str:
    """The message for an Xid when none is given: the board's kind decides 63 and 64."""
    table = {**MESSAGES, **(REMAP_MESSAGES if remap else RETIRE_MESSAGES)}
    return table.get(code, "").format(**{"address": 0, "link": 0, "index": 0, **values})


def xid(bus_id: str, code: int, message: str, pid: int | None = None, process: str | None = None) -> str:
    who = f"pid={pid}, name={process or '<unknown>'}" if pid is not None else "pid='<unknown>', name=<unknown>"
    return f"NVRM: Xid (PCI:{pci(bus_id)}): {code}, {who}, {message}"


def first_xid_preamble(bus_id: str, uuid: str, serial: str) -> list[str]:
    """What the driver prints once per GPU before that GPU's first Xid."""
    lines = [f"NVRM: GPU at PCI:{pci(bus_id)}: {uuid}"]
    if serial:
        lines.append(f"NVRM: GPU Board Serial Number: {serial}")
    return lines


def fell_off_the_bus(bus_id: str, serial: str) -> list[str]:
    """The lines that follow Xid 79."""
    lines = [f"NVRM: GPU {pci_function(bus_id)}: GPU has fallen off the bus."]
    if serial:
        lines.append(f"NVRM: GPU {pci_function(bus_id)}: GPU serial number is {serial}.")
    return lines


def syslog_lines(messages: Iterable[str], when: float | None = None, host: str | None = None) -> str:
    """Messages as kernel lines of a syslog file: local time, host, ``kernel:``, uptime stamp."""
    when = time.time() if when is None else when
    uptime = time.clock_gettime(time.CLOCK_BOOTTIME)
    stamp = time.strftime("%b %e %H:%M:%S", time.localtime(when))
    host = host or socket.gethostname()
    return "".join(f"{stamp} {host} kernel: [{uptime:12.6f}] {m}\n" for m in messages)


def append(path: Path, text: str) -> None:
    """Append ``text`` in one write (O_APPEND: concurrent writers never interleave a line)."""
    if not text:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
