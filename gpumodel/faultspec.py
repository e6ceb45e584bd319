"""The fault vocabulary: what can be injected into a mock GPU (and its node's InfiniBand
ports), validated once.

One model per kind, shared by the command line (``mokka fault ...``), the Python API
(:mod:`gpumodel.faults`), scenarios (:mod:`gpumodel.scenario`) and the cluster's fault
ConfigMap (:mod:`k8snode.faultwatch`), so all four accept exactly the same faults.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# nvmlMemoryLocation_t
LOCATIONS = {
    "l1": 0,
    "l2": 1,
    "dram": 2,
    "device_memory": 2,
    "register_file": 3,
    "texture": 4,
    "texture_shm": 5,
    "cbu": 6,
    "sram": 7,
}
MAX_COUNT = 1_000_000_000
MAX_OCTETS = 1 << 50  # a PiB: beyond what a port moves in a test's lifetime


class _Fault(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    def describe(self) -> str:
        """One line for logs and `fault list`."""
        data = self.model_dump(exclude_none=True)
        kind = str(data.pop("kind"))
        start, over = data.pop("start", None), data.pop("over_s", None)
        args = [f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in data.items() if v not in (0, False)]
        if over is not None:
            args.append(f"over {over:g}s" if start is None else f"from {start:g} over {over:g}s")
        return " ".join([kind, *args])


Count = Annotated[int, Field(ge=0, le=MAX_COUNT)]


class Xid(_Fault):
    """An Xid: an NVML Xid event with the code as data, and the driver's kernel log line."""

    kind: Literal["xid"] = "xid"
    code: int = Field(ge=1, le=999, description="the Xid (999: unknown)")
    message: str | None = Field(None, max_length=300, description="default: the driver's text for the code")
    pid: int | None = Field(None, ge=0, le=2**22, description="the process the driver attributes it to")
    process: str | None = Field(None, max_length=64, description="that process's name")

    @field_validator("message", "process")
    @classmethod
    def _one_line(cls, text: str | None) -> str | None:
        if text is not None and ("\n" in text or "\r" in text):
            raise ValueError("must be a single line")
        return text


class Lost(_Fault):
    """The GPU fell off the bus: Xid 79, then every call on it answers GPU_IS_LOST."""

    kind: Literal["lost"] = "lost"


class Ecc(_Fault):
    """ECC errors at a memory location; new errors count in both counters unless one is named."""

    kind: Literal["ecc"] = "ecc"
    corrected: Count = 0
    uncorrected: Count = 0
    counter: Literal["both", "volatile", "aggregate"] = "both"
    location: Literal["l1", "l2", "dram", "device_memory", "register_file", "texture", "texture_shm", "cbu", "sram"] = (
        "dram"
    )

    @model_validator(mode="after")
    def _some(self) -> Ecc:
        if not self.corrected and not self.uncorrected:
            raise ValueError("give --corrected N and/or --uncorrected N (at least one above 0)")
        return self


class Remap(_Fault):
    """Remapped rows (Ampere and later): rows added, and the pending / failure flags."""

    kind: Literal["remap"] = "remap"
    correctable: Count = 0
    uncorrectable: Count = 0
    pending: bool | None = Field(None, description="default: yes when rows were added")
    failure: bool = False

    @model_validator(mode="after")
    def _some(self) -> Remap:
        if not (self.correctable or self.uncorrectable or self.pending or self.failure):
            raise ValueError("give rows to remap (--correctable/--uncorrectable N), --pending or --failure")
        return self


class Retire(_Fault):
    """Retired pages (boards before Ampere): pages added and the pending flag."""

    kind: Literal["retire"] = "retire"
    sbe: Count = Field(0, description="pages retired for multiple single-bit errors")
    dbe: Count = Field(0, description="pages retired for a double-bit error")
    pending: bool | None = Field(None, description="default: yes when pages were added")

    @model_validator(mode="after")
    def _some(self) -> Retire:
        if not (self.sbe or self.dbe or self.pending):
            raise ValueError("give pages to retire (--sbe/--dbe N) or --pending")
        return self


class _Ramp(_Fault):
    """A value that may ramp: from `start` (default: the profile's value) over `over_s` seconds."""

    over_s: float | None = Field(None, gt=0, le=7 * 86_400, description="ramp duration; none: at once")


class Temperature(_Ramp):
    kind: Literal["temperature"] = "temperature"
    celsius: int = Field(ge=0, le=200)
    start: int | None = Field(None, ge=0, le=200, alias="from", description="ramp start")
    memory: int | None = Field(None, ge=0, le=200, description="memory temperature")


class Power(_Ramp):
    kind: Literal["power"] = "power"
    watts: float = Field(ge=0, le=100_000)
    start: float | None = Field(None, ge=0, le=100_000, alias="from", description="ramp start")


class PowerLimit(_Fault):
    kind: Literal["power-limit"] = "power-limit"
    watts: float = Field(ge=0, le=100_000)


class Utilization(_Ramp):
    kind: Literal["utilization"] = "utilization"
    gpu: int = Field(ge=0, le=100)
    memory: int | None = Field(None, ge=0, le=100)
    start: int | None = Field(None, ge=0, le=100, alias="from", description="ramp start (GPU %)")


class Clocks(_Fault):
    kind: Literal["clocks"] = "clocks"
    sm: int = Field(ge=0, le=100_000)
    memory: int | None = Field(None, ge=0, le=100_000)


class NvLink(_Fault):
    """A link goes down (with the driver's Xid 74) or comes back up."""

    kind: Literal["nvlink"] = "nvlink"
    link: int = Field(ge=0, le=17)
    state: Literal["up", "down"]


class NvLinkErrors(_Fault):
    """Error counters of a link (what `nvidia-smi nvlink -e` reads) grow by these counts."""

    kind: Literal["nvlink-errors"] = "nvlink-errors"
    link: int = Field(ge=0, le=17)
    crc: Count = 0
    replay: Count = 0
    recovery: Count = 0

    @model_validator(mode="after")
    def _some(self) -> NvLinkErrors:
        if not (self.crc or self.replay or self.recovery):
            raise ValueError("give --crc, --replay and/or --recovery N (at least one above 0)")
        return self


class Fabric(_Fault):
    """The GPU's NVLink fabric as the fabric manager reports it: ``degraded`` (its health mask says
    bandwidth degraded, as after an NVSwitch failure; the probe stays Completed, so GFD keeps the
    clique), ``in-progress`` (the probe reads In Progress, as while the rack's fabric manager trains
    the fabric again; GFD gives no clique label) or ``healthy`` (the profile's again)."""

    kind: Literal["fabric"] = "fabric"
    state: Literal["degraded", "in-progress", "healthy"]


class IbPortDown(_Fault):
    """An InfiniBand adapter's port goes down: Down, Disabled, no LID, LinkDownedCounter + 1
    (a step names the adapter with ``hca`` and the port with ``port``, not ``gpu``)."""

    kind: Literal["ib-port-down"] = "ib-port-down"


class IbLinkErrors(_Fault):
    """Errors on a live InfiniBand link: ``count`` symbol errors and the receive errors they
    cause, one link error recovery."""

    kind: Literal["ib-link-errors"] = "ib-link-errors"
    count: int = Field(ge=1, le=MAX_COUNT)


class IbTraffic(_Fault):
    """Traffic through a live InfiniBand port: ``octets`` sent and as many received, counted as a
    port counts them (data in 4-octet words, packets of the 4096-octet MTU, all unicast)."""

    kind: Literal["ib-traffic"] = "ib-traffic"
    octets: int = Field(ge=1, le=MAX_OCTETS)


class IbClear(_Fault):
    """An InfiniBand port as staged: up, its LID back, every counter 0."""

    kind: Literal["ib-clear"] = "ib-clear"


IB_KINDS = ("ib-port-down", "ib-link-errors", "ib-traffic", "ib-clear")


class Clear(_Fault):
    """Undo faults: everything a GPU reset undoes; with ``all`` also the persistent record."""

    kind: Literal["clear"] = "clear"
    all: bool = Field(False, description="also aggregate ECC counts, remapped rows, retired pages")


Fault = Annotated[
    Xid
    | Lost
    | Ecc
    | Remap
    | Retire
    | Temperature
    | Power
    | PowerLimit
    | Utilization
    | Clocks
    | NvLink
    | NvLinkErrors
    | Fabric
    | IbPortDown
    | IbLinkErrors
    | IbTraffic
    | IbClear
    | Clear,
    Field(discriminator="kind"),
]
KINDS = (
    "xid",
    "lost",
    "ecc",
    "remap",
    "retire",
    "temperature",
    "power",
    "power-limit",
    "utilization",
    "clocks",
    "nvlink",
    "nvlink-errors",
    "fabric",
    "ib-port-down",
    "ib-link-errors",
    "ib-traffic",
    "ib-clear",
    "clear",
)
