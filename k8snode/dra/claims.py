"""Prepare and unprepare ResourceClaims: allocation results -> CDI device IDs, checkpointed on disk.

kubelet names a claim (namespace, name, UID); the scheduler's allocation in the claim's status
says which devices of which driver and pool it got. For each of this driver's devices in this
node's pool the answer is the device's CDI ID: for a GPU ``nvidia.com/gpu=<UUID>`` of the
project's CDI spec (``mokka cdi generate``), the same spec, hence the same edits, as every other
path into a container; for an InfiniBand adapter ``mokka.io/hca=<name>`` of the adapters' spec.
Every prepared claim is recorded in a checkpoint file *before* kubelet hears about it, so a
repeated Prepare (kubelet retries, a plugin restart) gives the same answer without asking the API
server again, and Unprepare of a claim that is not (or no longer) prepared succeeds.

Two claims never share a device here unless one of them has admin access: the scheduler already
guarantees that, and a prepare that would break it is refused. A preparation whose claim no longer
holds the device (deleted, or deallocated, while kubelet has not yet asked to unprepare it: it does
once the old pod's containers are gone) does not count: the scheduler has handed the device on.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpumodel import atomic

__all__ = ["Checkpoint", "Claim", "ClaimError", "Claims", "PreparedDevice"]

log = logging.getLogger("mokka.dra")

CHECKPOINT_VERSION = 1
Json = dict[str, Any]
# (namespace, name) -> the ResourceClaim as the API server returns it, or None when it is gone.
ClaimReader = Callable[[str, str], Json | None]


class ClaimError(Exception):
    """A claim cannot be prepared; the message (returned to kubelet) says why."""


@dataclass(frozen=True)
class Claim:
    namespace: str
    name: str
    uid: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class PreparedDevice:
    requests: tuple[str, ...]
    pool: str
    device: str
    cdi_ids: tuple[str, ...]
    admin_access: bool = False

    def to_json(self) -> Json:
        return {
            "requests": list(self.requests),
            "pool": self.pool,
            "device": self.device,
            "cdiDeviceIDs": list(self.cdi_ids),
            "adminAccess": self.admin_access,
        }

    @classmethod
    def from_json(cls, data: Json) -> PreparedDevice:
        return cls(
            requests=tuple(data["requests"]),
            pool=data["pool"],
            device=data["device"],
            cdi_ids=tuple(data["cdiDeviceIDs"]),
            admin_access=bool(data.get("adminAccess", False)),
        )


@dataclass
class PreparedClaim:
    claim: Claim
    devices: tuple[PreparedDevice, ...]

    def to_json(self) -> Json:
        return {
            "namespace": self.claim.namespace,
            "name": self.claim.name,
            "devices": [d.to_json() for d in self.devices],
        }


@dataclass
class Checkpoint:
    """Prepared claims on disk (JSON, replaced atomically on every change)."""

    path: Path
    driver: str
    claims: dict[str, PreparedClaim] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path, driver: str) -> Checkpoint:
        """Read ``path``; a missing file is an empty checkpoint, an unreadable one an error."""
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return cls(path, driver)
        except (OSError, ValueError) as exc:
            raise ClaimError(f"cannot read checkpoint {path}: {exc}") from None
        if data.get("version") != CHECKPOINT_VERSION or data.get("driver") != driver:
            raise ClaimError(
                f"checkpoint {path} is version {data.get('version')} of driver {data.get('driver')!r}; "
                f"this plugin writes version {CHECKPOINT_VERSION} of {driver!r}"
            )
        claims = {
            uid: PreparedClaim(
                Claim(entry["namespace"], entry["name"], uid),
                tuple(PreparedDevice.from_json(d) for d in entry["devices"]),
            )
            for uid, entry in data.get("claims", {}).items()
        }
        return cls(path, driver, claims)

    def save(self) -> None:
        data = {
            "version": CHECKPOINT_VERSION,
            "driver": self.driver,
            "claims": {uid: c.to_json() for uid, c in sorted(self.claims.items())},
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic.write(self.path, (json.dumps(data, indent=2) + "\n").encode(), 0o600)


class Claims:
    """The driver's claim bookkeeping: what kubelet's NodePrepare/NodeUnprepare calls do."""

    def __init__(
        self,
        *,
        driver: str,
        pool: str,
        cdi_ids: Mapping[str, str],
        checkpoint: Checkpoint,
        read_claim: ClaimReader,
        cdi_spec: Path | None = None,
    ) -> None:
        self.driver = driver
        self.pool = pool
        self.cdi_ids = dict(cdi_ids)  # device name -> its CDI device ID
        self.checkpoint = checkpoint
        self.read_claim = read_claim
        self.cdi_spec = cdi_spec
        self._lock = threading.Lock()

    # ---- prepare --------------------------------------------------------------------------

    def prepare(self, claim: Claim) -> tuple[PreparedDevice, ...]:
        """The devices of ``claim`` and their CDI IDs; checkpointed before returning."""
        with self._lock:
            done = self.checkpoint.claims.get(claim.uid)
            if done is not None:
                log.info("prepare %s (uid %s): already prepared: %s", claim, claim.uid, _describe(done.devices))
                return done.devices
        try:
            obj = self.read_claim(claim.namespace, claim.name)
        except ClaimError:
            raise
        except Exception as exc:  # the API client's errors: the claim could not be read
            raise ClaimError(f"cannot read ResourceClaim {claim}: {exc}") from None
        devices = self._devices(claim, obj)
        self._check_cdi(devices)
        stale = self._stale(claim, devices)
        with self._lock:
            done = self.checkpoint.claims.get(claim.uid)
            if done is not None:  # prepared concurrently by a retry
                return done.devices
            self._check_exclusive(claim, devices, stale)
            self.checkpoint.claims[claim.uid] = PreparedClaim(claim, devices)
            try:
                self.checkpoint.save()
            except OSError as exc:
                del self.checkpoint.claims[claim.uid]
                raise ClaimError(f"cannot write checkpoint {self.checkpoint.path}: {exc}") from None
        log.info("prepare %s (uid %s): %s", claim, claim.uid, _describe(devices))
        return devices

    def _devices(self, claim: Claim, obj: Json | None) -> tuple[PreparedDevice, ...]:
        if obj is None:
            raise ClaimError(f"ResourceClaim {claim} not found")
        uid = (obj.get("metadata") or {}).get("uid")
        if uid != claim.uid:
            raise ClaimError(f"ResourceClaim {claim} has UID {uid}, kubelet asked for {claim.uid}")
        allocation = (obj.get("status") or {}).get("allocation")
        if not allocation:
            raise ClaimError(f"ResourceClaim {claim} is not allocated")
        results = ((allocation.get("devices") or {}).get("results")) or []
        mine = [r for r in results if r.get("driver") == self.driver]
        if not mine:
            raise ClaimError(f"ResourceClaim {claim} has no device of driver {self.driver}")
        merged: dict[str, PreparedDevice] = {}
        for result in mine:
            pool, name, request = result.get("pool"), result.get("device"), result.get("request", "")
            if pool != self.pool:
                raise ClaimError(f"ResourceClaim {claim}: device {name} is in pool {pool}, this node's is {self.pool}")
            cdi_id = self.cdi_ids.get(str(name))
            if cdi_id is None:
                known = ", ".join(sorted(self.cdi_ids)) or "none"
                raise ClaimError(f"ResourceClaim {claim}: no device {name} on this node (it has {known})")
            prior = merged.get(str(name))
            requests = (*(prior.requests if prior else ()), request)
            merged[str(name)] = PreparedDevice(
                requests=requests,
                pool=self.pool,
                device=str(name),
                cdi_ids=(cdi_id,),
                admin_access=bool(result.get("adminAccess")) and (prior is None or prior.admin_access),
            )
        return tuple(merged.values())

    def _conflicts(self, claim: Claim, devices: Iterable[PreparedDevice]) -> list[tuple[str, PreparedClaim]]:
        """The other prepared claims holding one of ``devices`` (neither side with admin access)."""
        wanted = {d.device for d in devices if not d.admin_access}
        with self._lock:
            return [
                (uid, other)
                for uid, other in self.checkpoint.claims.items()
                if uid != claim.uid and any(o.device in wanted and not o.admin_access for o in other.devices)
            ]

    def _stale(self, claim: Claim, devices: Iterable[PreparedDevice]) -> set[str]:
        """The UIDs of conflicting preparations whose claims no longer hold their devices in the API
        (gone, another claim of that name, or deallocated): kubelet will unprepare them."""
        stale: set[str] = set()
        for uid, other in self._conflicts(claim, devices):
            try:
                obj = self.read_claim(other.claim.namespace, other.claim.name)
            except Exception:  # unknown: keep refusing, kubelet retries
                continue
            holds = obj is not None and (obj.get("metadata") or {}).get("uid") == uid
            results = ((((obj or {}).get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results")
            mine = {
                r.get("device") for r in results or [] if r.get("driver") == self.driver and r.get("pool") == self.pool
            }
            if not holds or not mine & {d.device for d in other.devices}:
                log.info(
                    "prepare %s: %s was prepared for %s (uid %s), which no longer holds it; kubelet has not "
                    "unprepared it yet",
                    claim, ", ".join(d.device for d in other.devices), other.claim, uid,
                )  # fmt: skip
                stale.add(uid)
        return stale

    def _check_exclusive(self, claim: Claim, devices: Iterable[PreparedDevice], stale: set[str]) -> None:
        for dev in devices:
            if dev.admin_access:
                continue
            for uid, other in self.checkpoint.claims.items():
                if uid == claim.uid or uid in stale:
                    continue
                if any(o.device == dev.device and not o.admin_access for o in other.devices):
                    raise ClaimError(f"{dev.device} is already prepared for ResourceClaim {other.claim} (uid {uid})")

    def _check_cdi(self, devices: Iterable[PreparedDevice]) -> None:
        """Each CDI ID must name a device of the spec file, or the runtime would fail the container."""
        if self.cdi_spec is None:
            return
        try:
            spec = json.loads(self.cdi_spec.read_text())
            names = {f"{spec['kind']}={d['name']}" for d in spec.get("devices") or []}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ClaimError(f"cannot read CDI spec {self.cdi_spec}: {exc}; run `mokka cdi generate`") from None
        for dev in devices:
            for cdi_id in dev.cdi_ids:
                if cdi_id not in names:
                    raise ClaimError(f"CDI spec {self.cdi_spec} has no device {cdi_id}; run `mokka cdi generate`")

    # ---- unprepare ------------------------------------------------------------------------

    def unprepare(self, claim: Claim) -> None:
        """Forget ``claim``; one that is not prepared here needs nothing done."""
        with self._lock:
            done = self.checkpoint.claims.pop(claim.uid, None)
            if done is None:
                log.info("unprepare %s (uid %s): not prepared here, nothing to do", claim, claim.uid)
                return
            try:
                self.checkpoint.save()
            except OSError as exc:
                self.checkpoint.claims[claim.uid] = done
                raise ClaimError(f"cannot write checkpoint {self.checkpoint.path}: {exc}") from None
        log.info("unprepare %s (uid %s): released %s", claim, claim.uid, ", ".join(d.device for d in done.devices))

    def prepared(self) -> dict[str, tuple[PreparedDevice, ...]]:
        with self._lock:
            return {uid: c.devices for uid, c in self.checkpoint.claims.items()}


def _describe(devices: Iterable[PreparedDevice]) -> str:
    return "; ".join(
        f"{d.device} for request {','.join(d.requests) or '-'}{' (admin access)' if d.admin_access else ''} -> "
        f"{' '.join(d.cdi_ids)}"
        for d in devices
    )


def checkpoint_path(plugin_dir: Path) -> Path:
    return plugin_dir / "checkpoint.json"
