"""The profile model: what a mock node's GPUs are, validated once.

A profile is YAML. ``gpu`` holds the board every GPU shares; ``gpus`` holds per-GPU
overrides (any subset of ``gpu``'s fields, keyed by index); ``topology`` places the GPUs
on the PCI bus and on NUMA nodes. Built-in profiles live beside this module in
``profiles/`` and were authored from real ``nvidia-smi -q -x`` captures.

One file, though long: it is the one schema of a profile (pydantic models and their validators);
splitting it would split the fields a reader looks up together.
"""

from __future__ import annotations

import copy
import uuid
from enum import IntEnum
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from . import mig as migmodel
from .dynamic import Dynamic, bounds

MAX_GPUS = 64
MAX_HCAS = 32
MAX_GRAPHICS_CLOCKS = 512  # MOKKA_MAX_GFX_CLOCKS in native/mokka_state.h (a test checks they agree)
DEFAULT_DRIVER = "550.163.01"
DEFAULT_CUDA = "12.4"
MIB = 1024 * 1024
MAX_PID = 2**31 - 1  # pid_t is a signed 32-bit integer


class ProfileError(Exception):
    """A profile could not be read or validated; the message names file, field and problem."""


class Brand(IntEnum):
    """nvmlBrandType_t values."""

    Unknown = 0
    Quadro = 1
    Tesla = 2
    NVS = 3
    GRID = 4
    GeForce = 5
    Titan = 6
    NVIDIA = 14


# nvmlBrandType_t by the name nvidia-smi prints ("Product Brand"; GRID prints as "Grid").
BRANDS = {
    "Unknown": 0,
    "Quadro": 1,
    "Tesla": 2,
    "NVS": 3,
    "GRID": 4,
    "GeForce": 5,
    "Titan": 6,
    "NVIDIA Virtual Applications": 7,
    "NVIDIA Virtual PC": 8,
    "NVIDIA Virtual Compute Server": 9,
    "NVIDIA RTX Virtual Workstation": 10,
    "NVIDIA Cloud Gaming": 11,
    "Quadro RTX": 12,
    "NVIDIA RTX": 13,
    "NVIDIA": 14,
    "GeForce RTX": 15,
    "Titan RTX": 16,
}
BrandName = Literal[
    "Unknown",
    "Quadro",
    "Tesla",
    "NVS",
    "GRID",
    "GeForce",
    "Titan",
    "NVIDIA Virtual Applications",
    "NVIDIA Virtual PC",
    "NVIDIA Virtual Compute Server",
    "NVIDIA RTX Virtual Workstation",
    "NVIDIA Cloud Gaming",
    "Quadro RTX",
    "NVIDIA RTX",
    "NVIDIA",
    "GeForce RTX",
    "Titan RTX",
]


class Architecture(IntEnum):
    """nvmlDeviceArchitecture_t values."""

    Kepler = 2
    Maxwell = 3
    Pascal = 4
    Volta = 5
    Turing = 6
    Ampere = 7
    Ada = 8
    Hopper = 9
    Blackwell = 10


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


Mhz = Annotated[int, Field(ge=0, le=100_000)]
Watts = Annotated[float, Field(ge=0, le=100_000)]
Celsius = Annotated[int, Field(ge=-50, le=200)]
Percent = Annotated[int, Field(ge=0, le=100)]


# PCIe atomic operations in the order nvidia-smi lists them (bit 0 first).
ATOMIC_CAPS = ("FETCHADD_32", "FETCHADD_64", "SWAP_32", "SWAP_64", "CAS_32", "CAS_64", "CAS_128")
AtomicCap = Literal["FETCHADD_32", "FETCHADD_64", "SWAP_32", "SWAP_64", "CAS_32", "CAS_64", "CAS_128"]


class Pci(Strict):
    device_id: int = Field(description="PCI device id, e.g. 0x2330")
    subsystem_device_id: int
    vendor_id: int = 0x10DE
    subsystem_vendor_id: int = 0x10DE
    class_code: int = Field(0x030200, description="0x030200 (3D controller) or 0x030000 (VGA)")
    revision: int = 0xA1
    max_link_gen: int = Field(ge=1, le=7)
    max_link_width: int = Field(16, ge=1, le=32)
    current_link_gen: int | None = None
    current_link_width: int | None = None
    device_max_link_gen: int | None = Field(None, description="what the GPU supports when the host limits the link")
    atomic_caps_inbound: list[AtomicCap] = Field(default_factory=list, description="PCIe atomics; empty = N/A")
    atomic_caps_outbound: list[AtomicCap] = Field(default_factory=list, description="PCIe atomics; empty = N/A")

    @field_validator("device_id", "subsystem_device_id", "vendor_id", "subsystem_vendor_id")
    @classmethod
    def _u16(cls, v: int) -> int:
        if not 0 <= v <= 0xFFFF:
            raise ValueError("must be a 16-bit id (0x0000-0xFFFF)")
        return v


class Inforom(Strict):
    image: str = ""
    oem: str = ""
    ecc: str = ""
    power: str = ""


class Memory(Strict):
    total_mib: int = Field(gt=0, description="fb_memory_usage total")
    reserved_mib: float = Field(0, ge=0, description="may be fractional: nvidia-smi rounds it up")
    used_mib: int = Field(0, ge=0)
    bar1_total_mib: int = Field(gt=0)
    bar1_used_mib: int = Field(1, ge=0)
    bus_width: int | None = Field(None, description="bits; None = not supported")

    @model_validator(mode="after")
    def _fits(self) -> Memory:
        if self.used_mib + self.reserved_mib > self.total_mib:
            raise ValueError(
                f"used_mib ({self.used_mib}) + reserved_mib ({self.reserved_mib:g}) exceed total_mib ({self.total_mib})"
            )
        if self.bar1_used_mib > self.bar1_total_mib:
            raise ValueError(f"bar1_used_mib ({self.bar1_used_mib}) exceeds bar1_total_mib ({self.bar1_total_mib})")
        return self


class PowerLimits(Strict):
    draw_w: Watts
    limit_w: Watts
    default_limit_w: Watts
    min_limit_w: Watts
    max_limit_w: Watts

    @model_validator(mode="after")
    def _ordered(self) -> PowerLimits:
        if not self.min_limit_w <= self.default_limit_w <= self.max_limit_w:
            raise ValueError("need min_limit_w <= default_limit_w <= max_limit_w")
        if not self.min_limit_w <= self.limit_w <= self.max_limit_w:
            raise ValueError("limit_w must lie within [min_limit_w, max_limit_w]")
        return self


class Power(PowerLimits):
    management: bool = True
    memory_draw_w: Watts | None = Field(None, description="HBM power reading; None = not metered")
    module: PowerLimits | None = Field(None, description="superchip module scope (GB200, GB300)")


class Temperature(Strict):
    gpu: Celsius
    memory: Celsius | None = None
    shutdown: Celsius | None = None
    slowdown: Celsius | None = None
    gpu_max: Celsius | None = None
    memory_max: Celsius | None = None
    target: Celsius | None = Field(None, description="GPU target temperature (acoustic threshold)")
    target_min: Celsius | None = Field(None, description="lowest settable target temperature")
    target_max: Celsius | None = Field(None, description="highest settable target temperature")


class ClockSet(Strict):
    graphics: Mhz | None = None
    sm: Mhz | None = None
    memory: Mhz | None = None
    video: Mhz | None = None


class SupportedClocks(Strict):
    memory: Mhz
    graphics: list[Mhz] = Field(default_factory=list, description="highest first")
    graphics_range: tuple[Mhz, Mhz, Mhz] | None = Field(
        None, description="[highest, lowest, step]: shorthand for an evenly spaced list"
    )

    def graphics_list(self) -> list[int]:
        if self.graphics_range is None:
            return list(self.graphics)
        hi, lo, step = self.graphics_range
        if step <= 0 or lo > hi:
            raise ValueError("graphics_range needs highest >= lowest and a positive step")
        return list(self.graphics) + list(range(hi, lo - 1, -step))


class Clocks(Strict):
    current: ClockSet
    max: ClockSet
    applications: ClockSet | None = None
    default_applications: ClockSet | None = None
    max_boost: ClockSet | None = None
    applications_deprecated: bool = Field(
        False, description="current drivers refuse application clock queries as deprecated (Ada, Turing)"
    )
    supported: list[SupportedClocks] = Field(default_factory=list, max_length=8)

    @field_validator("supported")
    @classmethod
    def _lists_fit(cls, v: list[SupportedClocks]) -> list[SupportedClocks]:
        for entry in v:
            if len(entry.graphics_list()) > MAX_GRAPHICS_CLOCKS:
                raise ValueError(
                    f"memory clock {entry.memory} MHz lists more than {MAX_GRAPHICS_CLOCKS} graphics clocks"
                )
        return v


class Utilization(Strict):
    gpu: Percent = 0
    memory: Percent = 0
    encoder: Percent = 0
    decoder: Percent = 0
    jpeg: Percent = 0
    ofa: Percent = 0


class Modes(Strict):
    persistence: bool = True
    compute: Literal["Default", "Exclusive_Thread", "Prohibited", "Exclusive_Process"] = "Default"
    ecc: bool | None = True
    mig: bool | None = Field(False, description="None: the board is not MIG capable")
    display_attached: bool = False
    display_active: bool = False
    accounting: bool = False
    accounting_buffer: int = 4000
    virtualization: Literal["None", "Pass-Through", "vGPU", "Host vGPU", "Host vSGA"] = "None"
    multi_gpu_board: bool = False
    c2c: bool | None = Field(None, description="chip-to-chip link mode; None = no C2C link")
    performance_state: int = Field(0, ge=0, le=15)
    sparse: bool | None = Field(None, description="sparse operation mode; None = not supported")


class EccCounters(Strict):
    dram_correctable: int = Field(0, ge=0)
    dram_uncorrectable: int = Field(0, ge=0)
    sram_correctable: int = Field(0, ge=0)
    sram_uncorrectable: int = Field(0, ge=0)


class EccErrors(Strict):
    """ECC error counts since the driver loaded (volatile) and over the board's life (aggregate)."""

    volatile: EccCounters = EccCounters()
    aggregate: EccCounters = EccCounters()


class RowRemapping(Strict):
    max_banks: int
    correctable: int = 0
    uncorrectable: int = 0
    pending: bool = False
    failure: bool = False


class NvLink(Strict):
    links: int = Field(0, ge=0, le=18)
    version: int = Field(4, ge=1, le=6)
    speed_gbps: float = Field(0, description="per link, as `nvidia-smi nvlink -s` shows it (GB/s)")
    active: bool = True


class Fabric(Strict):
    state: Literal["Not Supported", "Not Started", "In Progress", "Completed"] = "Not Supported"
    status: Literal["Success", "N/A"] = "Success"
    clique_id: int = 0
    cluster_uuid: str = "00000000-0000-0000-0000-000000000000"
    degraded_bandwidth: bool | None = Field(None, description="fabric health: bandwidth degraded; None = not reported")
    manager_ready_at: int = Field(
        0,
        ge=0,
        le=2**32 - 1,
        description="wall clock (s) the fabric manager is ready at: a Completed probe reads "
        "In Progress until then; 0 = ready (see gpumodel.fleet.with_fabric_delay)",
    )


class Process(Strict):
    pid: int = Field(ge=1, le=MAX_PID)
    name: str
    used_memory_mib: int = Field(ge=0)
    type: Literal["C", "G"] = "C"


class GpuSpec(Strict):
    """Everything one GPU reports. Per-GPU overrides are partial dictionaries of this."""

    name: str = Field(min_length=1, max_length=95)
    brand: BrandName = "NVIDIA"
    architecture: Literal["Kepler", "Maxwell", "Pascal", "Volta", "Turing", "Ampere", "Ada", "Hopper", "Blackwell"]
    compute_capability: str = Field(pattern=r"^\d+\.\d+$")
    cuda_cores: int | None = None
    vbios_version: str
    board_part_number: str
    gpu_part_number: str
    serial: str | None = Field(None, description="default: derived from the profile and index")
    uuid: str | None = Field(None, description="default: derived from the profile and index")
    module_id: int | None = None
    pci: Pci
    inforom: Inforom = Inforom()
    memory: Memory
    power: Power
    temperature: Temperature
    clocks: Clocks
    utilization: Utilization = Utilization()
    modes: Modes = Modes()
    row_remapping: RowRemapping | None = None
    retired_pages: bool = False
    ecc_errors: EccErrors = EccErrors()
    sram_ecc_breakdown: bool | None = Field(
        None, description="SRAM ECC split into parity/SEC-DED with sources; None: Ampere and later"
    )
    fans: int = 0
    fan_speed: Percent = 0
    nvlink: NvLink = NvLink()
    fabric: Fabric = Fabric()
    clocks_event_reasons: int = Field(1, description="bitmask; 1 = GPU idle")
    supported_event_reasons: int = 0x1FF
    pcie_replay_counter: int = 0
    processes: list[Process] = Field(default_factory=list, max_length=16)
    lost: bool = False
    mig: migmodel.MigSpec | None = Field(None, description="MIG mode and the initial layout (gpumodel/mig.py)")

    @model_validator(mode="before")
    @classmethod
    def _mig_mode_sets_modes(cls, data: Any) -> Any:
        """``mig.mode`` is the current MIG mode: it sets ``modes.mig`` (unless the board has none)."""
        if isinstance(data, dict) and isinstance(data.get("mig"), dict) and data["mig"].get("mode") is not None:
            modes = dict(data.get("modes") or {})
            if modes.get("mig", False) is not None:
                modes["mig"] = data["mig"]["mode"]
                data = {**data, "modes": modes}
        return data

    @model_validator(mode="after")
    def _mig_layout_valid(self) -> GpuSpec:
        if self.mig is None:
            return self
        if self.modes.mig is None:
            raise ValueError(f"mig: {self.name} does not support MIG (modes.mig is null)")
        board = migmodel.board_for(self.pci.device_id, self.mig.board)
        if board is None:
            if self.mig.board is not None:
                known = ", ".join(b.key for b in migmodel.BOARDS)
                raise ValueError(f"mig.board: no MIG table {self.mig.board!r} (known: {known})")
            if self.modes.mig or self.mig.pending or self.mig.instances:
                raise ValueError(
                    f"mig: no MIG profile table for {self.name} (PCI device 0x{self.pci.device_id:04X}); "
                    "name one with mig.board"
                )
            return self
        if self.mig.instances and not self.modes.mig:
            raise ValueError("mig.instances: GPU instances need MIG mode on (mig.mode: on)")
        try:
            migmodel.plan(board, self.mig.instances)
        except migmodel.LayoutError as exc:
            raise ValueError(str(exc)) from None
        return self

    dynamic: Dynamic = Field(default_factory=Dynamic, description="time-varying metrics (gpumodel/dynamic.py)")

    @model_validator(mode="after")
    def _dynamic_fits(self) -> GpuSpec:
        d = self.dynamic
        if (
            d.memory_used_mib is not None
            and bounds(d.memory_used_mib)[1] > self.memory.total_mib - self.memory.reserved_mib
        ):
            raise ValueError("dynamic.memory_used_mib: reaches beyond memory.total_mib - memory.reserved_mib")
        if d.memory_temperature_c is not None and self.temperature.memory is None:
            raise ValueError("dynamic.memory_temperature_c: the board has no memory temperature (temperature.memory)")
        if d.clock_sm_mhz is not None and self.clocks.current.sm is None:
            raise ValueError("dynamic.clock_sm_mhz: the board reports no current SM clock")
        if d.clock_memory_mhz is not None and self.clocks.current.memory is None:
            raise ValueError("dynamic.clock_memory_mhz: the board reports no current memory clock")
        return self


class Topology(Strict):
    bus_ids: list[str] = Field(default_factory=list, description="one per GPU; more are synthesized")
    numa_nodes: int = Field(1, ge=1, le=64)
    cpus: int = Field(0, ge=0, le=1024, description="CPUs on the node; 0 = this machine's count")
    module_ids: list[int] = Field(default_factory=list)
    nvswitches: list[str] = Field(
        default_factory=list, description="bus ids of the NVSwitches the GPUs' NVLinks reach (HGX baseboards)"
    )
    nvswitch_device_id: int = Field(0x22A3, description="their PCI device id (0x22A3 H100 NVSwitch, 0x1AF1 A100's)")

    @field_validator("bus_ids", "nvswitches")
    @classmethod
    def _bus_ids(cls, v: list[str]) -> list[str]:
        for item in v:
            parse_bus_id(item)
        if len(set(b.upper() for b in v)) != len(v):
            raise ValueError("bus ids must be unique")
        return [normalize_bus_id(b) for b in v]


# Per-lane data rate in Gb/s of each InfiniBand speed (IBTA; ib_verbs' rate names).
LANE_GBPS = {"SDR": 2.5, "DDR": 5, "QDR": 10, "FDR10": 10, "FDR": 14, "EDR": 25, "HDR": 50, "NDR": 100, "XDR": 200}
WIDTHS = {"1X": 1, "2X": 2, "4X": 4, "8X": 8, "12X": 12}
MELLANOX_VENDOR = 0x15B3
INFINIBAND_CLASS = 0x020700  # PCI class: network controller, InfiniBand
ETHERNET_CLASS = 0x020000


class InfiniBand(Strict):
    """The node's InfiniBand adapters (NVIDIA ConnectX, kernel driver mlx5)."""

    model: str = Field(min_length=1, description="marketing name, e.g. ConnectX-7")
    hca_type: str = Field(pattern=r"^MT\d+$", description="the kernel's hca_type, e.g. MT4129 (ConnectX-7)")
    device_id: int = Field(description="PCI device id, e.g. 0x1021 (ConnectX-7); vendor 0x15b3")
    subsystem_device_id: int = Field(0, description="PCI subsystem device id (subsystem vendor 0x15b3)")
    revision: int = 0
    board_id: str = Field(min_length=1, description="PSID, e.g. MT_0000000838")
    fw_version: str = Field(pattern=r"^\d+\.\d+\.\d+$", description="e.g. 28.39.1002")
    hw_rev: str = "0"
    count: int = Field(ge=1, le=MAX_HCAS, description="adapters on the node")
    ports: int = Field(1, ge=1, le=2, description="ports per adapter (each ConnectX port is its own mlx5 device)")
    speed: Literal["SDR", "DDR", "QDR", "FDR10", "FDR", "EDR", "HDR", "NDR", "XDR"] = "NDR"
    width: Literal["1X", "2X", "4X", "8X", "12X"] = "4X"
    link_layer: Literal["InfiniBand", "Ethernet"] = "InfiniBand"
    pcie_gen: int = Field(5, ge=1, le=6)
    pcie_width: int = Field(16, ge=1, le=32)
    gpus: list[int | None] = Field(
        default_factory=list, description="the GPU each adapter is paired with (same PCIe switch); default HCA i: GPU i"
    )
    bus_ids: list[str] = Field(default_factory=list, description="PCI addresses; default: beside the paired GPU")
    guids: list[str] = Field(default_factory=list, description="node GUIDs; default: derived from the node's identity")

    @field_validator("bus_ids")
    @classmethod
    def _bus_ids(cls, v: list[str]) -> list[str]:
        for item in v:
            parse_bus_id(item)
        if len({normalize_bus_id(b) for b in v}) != len(v):
            raise ValueError("bus ids must be unique")
        return [normalize_bus_id(b) for b in v]

    @field_validator("guids")
    @classmethod
    def _guids(cls, v: list[str]) -> list[str]:
        out = [format_guid(parse_guid(g)) for g in v]
        seen: set[str] = set()
        for g in out:
            if g in seen:
                raise ValueError(f"GUID {g} appears twice (every adapter has its own)")
            seen.add(g)
        return out

    @model_validator(mode="after")
    def _lists_fit(self) -> InfiniBand:
        for field in ("gpus", "bus_ids", "guids"):
            if len(getattr(self, field)) > self.count:
                raise ValueError(f"{field}: {len(getattr(self, field))} entries for count {self.count}")
        return self

    @property
    def rate_gbps(self) -> float:
        return LANE_GBPS[self.speed] * WIDTHS[self.width]

    @property
    def rate_text(self) -> str:
        """The port's ``rate`` as sysfs words it: ``400 Gb/sec (4X NDR)``."""
        rate = self.rate_gbps
        return f"{rate:g} Gb/sec ({self.width} {self.speed})"

    @property
    def pci_class(self) -> int:
        return INFINIBAND_CLASS if self.link_layer == "InfiniBand" else ETHERNET_CLASS


def parse_guid(text: str) -> int:
    """``a088:c203:0012:3456`` or ``0xa088c20300123456`` → the 64-bit value."""
    digits = text.lower().removeprefix("0x").replace(":", "")
    if len(digits) != 16 or any(c not in "0123456789abcdef" for c in digits):
        raise ValueError(f"bad GUID {text!r}: expected 16 hex digits, e.g. a088:c203:0012:3456")
    value = int(digits, 16)
    if value == 0:
        raise ValueError(f"bad GUID {text!r}: zero is not a GUID")
    return value


def format_guid(value: int) -> str:
    """sysfs's spelling: four groups of four hex digits (``a088:c203:0012:3456``)."""
    digits = f"{value:016x}"
    return ":".join(digits[i : i + 4] for i in range(0, 16, 4))


class Driver(Strict):
    version: str = Field(DEFAULT_DRIVER, pattern=r"^\d+\.\d+(\.\d+)?$")
    cuda: str = Field(DEFAULT_CUDA, pattern=r"^\d+\.\d+$")

    @property
    def cuda_int(self) -> int:
        major, minor = self.cuda.split(".")
        return int(major) * 1000 + int(minor) * 10


class Profile(Strict):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$")
    description: str = ""
    source: str = Field("", description="where the values come from")
    gpu_count: int = Field(8, ge=1, le=MAX_GPUS)
    driver: Driver = Driver()
    topology: Topology = Topology()
    gpu: GpuSpec
    gpus: dict[int, dict[str, Any]] = Field(default_factory=dict, description="per-GPU overrides by index")
    infiniband: InfiniBand | None = Field(None, description="the node's InfiniBand adapters; None: none")

    @model_validator(mode="after")
    def _overrides_valid(self) -> Profile:
        for index, override in self.gpus.items():
            if not 0 <= index < self.gpu_count:
                raise ValueError(
                    f"gpus.{index}: no such GPU (gpu_count {self.gpu_count}: indices 0..{self.gpu_count - 1})"
                )
            try:
                GpuSpec.model_validate(deep_merge(self.gpu.model_dump(), override))
            except ValidationError as exc:
                raise ValueError(f"gpus.{index}: {_first_error(exc)}") from None
        return self

    @model_validator(mode="after")
    def _adapters_fit(self) -> Profile:
        ib = self.infiniband
        if ib is None:
            return self
        for n, gpu in enumerate(ib.gpus):
            if gpu is not None and not 0 <= gpu < MAX_GPUS:
                raise ValueError(f"infiniband.gpus.{n}: GPU {gpu} is not a GPU index (0..{MAX_GPUS - 1})")
        gpu_buses = {parse_bus_id(b)[:2] for b in self.topology.bus_ids + self.topology.nvswitches}
        for n, bus_id in enumerate(ib.bus_ids):
            if parse_bus_id(bus_id)[:2] in gpu_buses:
                raise ValueError(f"infiniband.bus_ids.{n}: bus of {bus_id} is a GPU's or an NVSwitch's")
        return self

    def with_count(self, count: int | None) -> Profile:
        """This profile with ``count`` GPUs; overrides of GPUs beyond the new count are dropped."""
        if count is None:
            return self
        data = self.model_dump()
        data["gpu_count"] = count
        data["gpus"] = {index: override for index, override in self.gpus.items() if index < count}
        return Profile.model_validate(data)

    def devices(self) -> list[Device]:
        """The concrete GPUs: the shared board, each override applied, identity filled in."""
        base = self.gpu.model_dump()
        out = []
        for index in range(self.gpu_count):
            spec = GpuSpec.model_validate(deep_merge(base, self.gpus.get(index, {})))
            out.append(
                Device(
                    index=index,
                    spec=spec,
                    bus_id=self._bus_id(index),
                    numa_node=self._numa(index),
                    module_id=self._module_id(index, spec),
                    uuid=self._uuid(index, spec),
                    serial=self._serial(index, spec),
                )
            )
        return out

    def _bus_id(self, index: int) -> str:
        if index < len(self.topology.bus_ids):
            return self.topology.bus_ids[index]
        taken = {parse_bus_id(b)[1] for b in self.topology.bus_ids}
        free = [b for b in range(0x18, 0x100) if b not in taken]
        return f"00000000:{free[index - len(self.topology.bus_ids)]:02X}:00.0"

    def _numa(self, index: int) -> int:
        per_node = max(1, -(-self.gpu_count // self.topology.numa_nodes))
        return min(index // per_node, self.topology.numa_nodes - 1)

    def _module_id(self, index: int, spec: GpuSpec) -> int:
        if spec.module_id is not None and index in self.gpus and "module_id" in self.gpus[index]:
            return spec.module_id
        listed = self.topology.module_ids
        if index < len(listed):
            return listed[index]
        if spec.module_id is not None and self.gpu_count == 1:
            return spec.module_id
        free = [m for m in range(1, MAX_GPUS + len(listed) + 1) if m not in listed]
        return free[index - len(listed)]  # the smallest ids no listed GPU has: never a duplicate

    def _uuid(self, index: int, spec: GpuSpec) -> str:
        if spec.uuid and index in self.gpus and "uuid" in self.gpus[index]:
            return spec.uuid
        return "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_URL, f"mokka:{self.name}:{index}"))

    def _serial(self, index: int, spec: GpuSpec) -> str:
        if spec.serial and index in self.gpus and "serial" in self.gpus[index]:
            return spec.serial
        return f"{1650000000000 + index + 1}"


class Device(BaseModel):
    """One concrete GPU of a profile."""

    model_config = ConfigDict(frozen=True)
    index: int
    spec: GpuSpec
    bus_id: str
    numa_node: int
    module_id: int
    uuid: str
    serial: str


def parse_bus_id(text: str) -> tuple[int, int, int, int]:
    """``DDDDDDDD:BB:DD.F`` or ``DDDD:BB:DD.F`` → (domain, bus, device, function)."""
    try:
        dom, bus, devfn = text.split(":")
        dev, fn = devfn.split(".")
        values = int(dom, 16), int(bus, 16), int(dev, 16), int(fn, 16)
    except ValueError:
        raise ValueError(f"bad PCI bus id {text!r}: expected DDDDDDDD:BB:DD.F") from None
    if values[1] > 0xFF or values[2] > 0x1F or values[3] > 7:
        raise ValueError(f"bad PCI bus id {text!r}: bus, device or function out of range")
    return values


def normalize_bus_id(text: str) -> str:
    dom, bus, dev, fn = parse_bus_id(text)
    return f"{dom:08X}:{bus:02X}:{dev:02X}.{fn:X}"


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _located(err: Any) -> tuple[str, str]:
    """(field path, message) of a pydantic error. A model-level check names the field it found
    wrong at the start of its message ("mig.instances.1: ..."): that joins the path."""
    where = ".".join(str(p) for p in err["loc"])
    msg = str(err["msg"]).removeprefix("Value error, ")
    while True:
        head, sep, rest = msg.partition(": ")
        if not (sep and head and all(part.isidentifier() or part.isdigit() for part in head.split("."))):
            return where, msg
        where, msg = (f"{where}.{head}" if where else head), rest.removeprefix("Value error, ")


def _first_error(exc: ValidationError) -> str:
    where, msg = _located(exc.errors()[0])
    return f"{where}: {msg}" if where else msg


def format_errors(exc: ValidationError, source: str) -> str:
    """One line per problem: ``SOURCE: FIELD.PATH: what is wrong``."""
    lines = []
    for err in exc.errors():
        where, msg = _located(err)
        lines.append(f"{source}: invalid profile: {where}: {msg}" if where else f"{source}: invalid profile: {msg}")
    return "\n".join(lines)


def builtin_names() -> list[str]:
    folder = resources.files("gpumodel") / "profiles"
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))


def load_text(text: str, source: str) -> Profile:
    try:
        data = yaml.safe_load(text)
    except yaml.reader.ReaderError as exc:  # control characters: a binary file
        char = exc.character if isinstance(exc.character, int) else ord(exc.character)
        raise ProfileError(f"{source}: not a text file (character #x{char:02x} at offset {exc.position})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}:" if mark else ""
        problem = " ".join(str(getattr(exc, "problem", None) or exc).split())
        raise ProfileError(f"{source}:{where} not valid YAML: {problem}") from None
    if data is None:
        raise ProfileError(f"{source}: empty (a profile is a YAML mapping: name, gpu, ...)")
    if not isinstance(data, dict):
        raise ProfileError(f"{source}: a profile must be a YAML mapping, got {type(data).__name__}")
    try:
        return Profile.model_validate(data)
    except ValidationError as exc:
        raise ProfileError(format_errors(exc, source)) from None


def load(name_or_path: str | Path) -> Profile:
    """A built-in profile by name, or a user profile from a YAML file."""
    text_name = str(name_or_path)
    if text_name in builtin_names():
        res = resources.files("gpumodel") / "profiles" / f"{text_name}.yaml"
        return load_text(res.read_text(), f"built-in profile {text_name}")
    path = Path(text_name)
    if not path.exists():
        raise ProfileError(
            f"{text_name}: no such profile file, and not a built-in profile ({', '.join(builtin_names())})"
        )
    if not path.is_file():
        raise ProfileError(f"{path}: not a regular file")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ProfileError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProfileError(
            f"{path}: not a UTF-8 text file (byte 0x{raw[exc.start]:02x} at offset {exc.start})"
        ) from None
    return load_text(text, str(path))
