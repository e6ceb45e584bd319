"""Fault scenarios: a timeline of faults replayed against a live node, deterministically.

A scenario is YAML, validated like a profile (each problem named with file and field path)::

    name: thermal-runaway
    description: a GPU heats up under load until it falls off the bus
    seed: 7                         # random choices below repeat exactly with the same seed
    steps:
      - at: 0s
        gpu: 0                      # index, UUID, a list, "all" (default) or "random"
        utilization: 100
      - at: 0s
        gpu: 0
        temperature: {from: 60, to: 96, over: 2m}   # a ramp, evaluated by the library itself
      - at: 2m5s
        gpu: 0
        xid: 79
      - at: 10s
        every: 15s                  # repeat: `times` occurrences, `every` apart
        times: 4
        jitter: 2s                  # each occurrence later by a seeded 0..2 s
        gpu: random
        nvlink: {link: 3, state: down}

Each step names one fault, by the kind `mokka fault` uses (``xid``, ``lost``, ``ecc``,
``remap``, ``retire``, ``temperature``, ``power``, ``power-limit``, ``utilization``,
``clocks``, ``nvlink``, ``nvlink-errors``, ``fabric``, ``clear``), with the same fields
(:mod:`gpumodel.faultspec`). An InfiniBand step names an adapter of the node instead of GPUs
(``hca: 2``, optionally ``port: 1``) and one of ``ib-port-down: true``, ``ib-link-errors: 25``,
``ib-traffic: 1000000`` (octets each way), ``ib-clear: true``. A scalar stands for the kind's main value (``xid: 79``,
``temperature: 90``, ``fabric: in-progress``, ``lost: true``). ``to`` names the main value of a ramp and ``over``
its duration. Durations: ``90``, ``1.5s``, ``500ms``, ``2m``, ``1h``, ``2m30s``.

The timeline is expanded once, before anything is applied (random GPUs and jitter drawn
from the seed), so a scenario either runs whole or is refused with a clear error, and
``--dry-run`` prints exactly what a run would do. Faults due at the same instant are
applied in one update.
"""

from __future__ import annotations

import random
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

from . import faults, ib_ports
from . import faultspec as fs

MAX_OCCURRENCES = 100_000
# The field a scalar stands for, per kind.
MAIN_FIELD = {
    "ib-link-errors": "count",
    "ib-traffic": "octets",
    "xid": "code",
    "temperature": "celsius",
    "power": "watts",
    "power-limit": "watts",
    "utilization": "gpu",
    "clocks": "sm",
    "fabric": "state",
}
FLAGS = {"lost", "clear", "ib-port-down", "ib-clear"}  # `lost: true`, `clear: true`
_DURATION = re.compile(r"^(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m(?!s))?(?:(\d+(?:\.\d+)?)s)?(?:(\d+(?:\.\d+)?)ms)?$")


class ScenarioError(Exception):
    """A scenario file is unreadable or invalid; the message names file, field path, problem."""


def parse_duration(value: Any) -> float:
    """Seconds from ``90``, ``1.5s``, ``500ms``, ``2m``, ``1h``, ``2m30s``."""
    if isinstance(value, bool):
        raise ValueError("a duration, not a boolean")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        text = str(value).strip()
        match = _DURATION.match(text)
        if not text or not match or not any(match.groups()):
            raise ValueError(f"{value!r} is not a duration (e.g. 30s, 500ms, 2m, 1h30m, 90)")
        h, m, s, ms = (float(g) if g else 0.0 for g in match.groups())
        seconds = h * 3600 + m * 60 + s + ms / 1000
    if seconds < 0 or seconds > 30 * 86_400:
        raise ValueError(f"{value!r} is out of range (0 to 30 days)")
    return seconds


class Step(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)

    at: float = Field(0.0, description="seconds from the start")
    gpu: int | str | list[int | str] = "all"
    hca: int | list[int] | None = Field(None, description="an InfiniBand step's adapter(s): mlx5_N")
    port: int = Field(1, ge=1, le=2, description="an InfiniBand step's port")
    every: float | None = None
    times: int = Field(1, ge=1, le=MAX_OCCURRENCES)
    jitter: float = 0.0

    @field_validator("at", "every", "jitter", mode="before")
    @classmethod
    def _duration(cls, v: Any) -> Any:
        return None if v is None else parse_duration(v)

    @field_validator("every")
    @classmethod
    def _positive(cls, v: float | None) -> float | None:
        if v is not None and v <= 0:
            raise ValueError("must be above 0")
        return v


class ScenarioFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = ""
    description: str = ""
    seed: int = Field(0, ge=0)
    steps: list[dict[str, Any]] = Field(min_length=1)


_FAULT = TypeAdapter[Any](fs.Fault)


def fault_from(kind: str, value: Any) -> Any:
    """A faultspec model from a step's ``kind: value`` (raises ValidationError / ValueError)."""
    if kind in FLAGS and value is True:
        data: dict[str, Any] = {}
    elif isinstance(value, dict):
        data = dict(value)
        if "to" in data and kind in MAIN_FIELD:
            data[MAIN_FIELD[kind]] = data.pop("to")
        if "over" in data:
            data["over_s"] = parse_duration(data.pop("over"))
    elif kind in MAIN_FIELD and not isinstance(value, (list, dict)):
        data = {MAIN_FIELD[kind]: value}
    else:
        raise ValueError(f"give {kind} a mapping of its fields" + (" (or true)" if kind in FLAGS else ""))
    return _FAULT.validate_python({"kind": kind, **data})


@dataclass(frozen=True)
class Event:
    """One fault of the expanded timeline."""

    at: float  # seconds from the start, before --speed
    gpus: tuple[faults.Gpu, ...]
    fault: Any
    step: int  # index in `steps`, for messages
    hcas: tuple[int, ...] = ()  # an InfiniBand fault's adapters (no GPUs then), on `port`
    port: int = 1


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    seed: int
    steps: tuple[tuple[Step, str, Any], ...]  # step, fault kind, fault model
    source: str

    def timeline(self, gpus: Sequence[faults.Gpu], seed: int | None = None) -> list[Event]:
        """The events in time order, random choices drawn from the seed (raises ScenarioError)."""
        rng = random.Random(self.seed if seed is None else seed)
        events: list[Event] = []
        for i, (step, _kind, fault) in enumerate(self.steps):
            for n in range(step.times):
                at = step.at + n * (step.every or 0.0) + (rng.uniform(0, step.jitter) if step.jitter else 0.0)
                if step.hca is not None:
                    hcas = step.hca if isinstance(step.hca, list) else [step.hca]
                    events.append(Event(round(at, 6), (), fault, i, tuple(hcas), step.port))
                    continue
                if step.gpu == "random":
                    if not gpus:
                        raise ScenarioError(f"{self.source}: steps.{i}.gpu: the node has no GPUs")
                    chosen = [rng.choice(list(gpus))]
                else:
                    try:
                        chosen = faults.select(gpus, step.gpu, where=f"{self.source}: steps.{i}.gpu")
                    except faults.FaultError as exc:
                        raise ScenarioError(str(exc)) from None
                events.append(Event(round(at, 6), tuple(chosen), fault, i))
        events.sort(key=lambda e: (e.at, e.step))
        return events


def _where(source: str, loc: Sequence[Any]) -> str:
    return f"{source}: {'.'.join(str(p) for p in loc) or '(top level)'}"


def load_text(text: str, source: str) -> Scenario:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ScenarioError(f"{source}:{where}: not valid YAML: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(data, dict):
        raise ScenarioError(f"{source}: a scenario must be a YAML mapping, got {type(data).__name__}")
    try:
        top = ScenarioFile.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise ScenarioError(f"{_where(source, err['loc'])}: {err['msg']}") from None
    steps = []
    for i, raw in enumerate(top.steps):
        if not isinstance(raw, dict):
            raise ScenarioError(f"{source}: steps.{i}: a step must be a mapping")
        try:
            step = Step.model_validate(raw)
        except ValidationError as exc:
            err = exc.errors()[0]
            raise ScenarioError(f"{_where(source, ['steps', i, *err['loc']])}: {err['msg']}") from None
        kinds = [k for k in raw if k not in Step.model_fields]
        if len(kinds) != 1 or kinds[0] not in fs.KINDS:
            unknown = [k for k in kinds if k not in fs.KINDS]
            what = f"unknown key {unknown[0]!r}" if unknown else f"{len(kinds)} faults"
            raise ScenarioError(f"{source}: steps.{i}: {what}; a step names one fault of: {', '.join(fs.KINDS)}")
        kind = kinds[0]
        if kind in fs.IB_KINDS and (step.hca is None or "gpu" in raw):
            raise ScenarioError(f"{source}: steps.{i}: {kind} names its adapter with hca: N (not gpu)")
        if kind not in fs.IB_KINDS and step.hca is not None:
            raise ScenarioError(f"{source}: steps.{i}: {kind} names GPUs, not hca")
        try:
            fault = fault_from(kind, raw[kind])
        except ValidationError as exc:
            err = exc.errors()[0]
            loc = [p for p in err["loc"] if p != kind]
            raise ScenarioError(f"{_where(source, ['steps', i, kind, *loc])}: {err['msg']}") from None
        except ValueError as exc:
            raise ScenarioError(f"{source}: steps.{i}.{kind}: {exc}") from None
        steps.append((step, kind, fault))
    return Scenario(top.name, top.description, top.seed, tuple(steps), source)


def builtin_names() -> list[str]:
    folder = resources.files("gpumodel") / "scenarios"
    return sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".yaml"))


def load(name_or_path: str | Path) -> Scenario:
    """A shipped scenario by name, or a scenario file."""
    name = str(name_or_path)
    if name in builtin_names():
        res = resources.files("gpumodel") / "scenarios" / f"{name}.yaml"
        return load_text(res.read_text(), f"built-in scenario {name}")
    path = Path(name)
    if not path.exists():
        raise ScenarioError(f"{name}: no such scenario file, and not a shipped scenario ({', '.join(builtin_names())})")
    if not path.is_file():
        raise ScenarioError(f"{name}: not a regular file")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError(f"{name}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    return load_text(text, str(path))


def describe(event: Event) -> str:
    if event.hcas:
        which = ",".join(f"mlx5_{h}" for h in event.hcas)
        return f"[{event.at:9.3f}s] {which} port {event.port}: {event.fault.describe()}"
    which = ",".join(str(g.index) for g in event.gpus)
    return f"[{event.at:9.3f}s] GPU {which}: {event.fault.describe()}"


def _scaled(fault: Any, speed: float) -> Any:
    """A ramp runs `speed` times faster too."""
    over = getattr(fault, "over_s", None)
    return fault.model_copy(update={"over_s": over / speed}) if over and speed != 1 else fault


def _port_of(target: faults.Target, hca: int, port: int, where: str) -> Path:
    """The staged node whose adapter an InfiniBand step acts on (raises ScenarioError)."""
    if target.root is None:
        raise ScenarioError(f"{where}: InfiniBand steps act on a staged node's adapters (--root or --node)")
    try:
        ib_ports.port_dir(target.root, hca, port)
    except ib_ports.PortFaultError as exc:
        raise ScenarioError(f"{where}: {exc}") from None
    return target.root


def check(target: faults.Target, events: Sequence[Event], source: str) -> None:
    """Try every distinct (step, GPUs) of the timeline on a scratch copy of the state, so a
    fault that does not fit the node is refused before the real run changes anything."""
    with tempfile.TemporaryDirectory(prefix="mokka-scenario-") as tmp:
        scratch = faults.Target(Path(tmp) / "state", None)
        shutil.copyfile(target.state, scratch.state)
        tried: set[tuple[int, tuple[int, ...]]] = set()
        for e in events:
            if e.hcas:
                for hca in e.hcas:
                    _port_of(target, hca, e.port, f"{source}: steps.{e.step}")
                continue
            key = (e.step, tuple(g.slot for g in e.gpus))
            if key in tried:
                continue
            tried.add(key)
            try:
                faults.apply(scratch, [(e.gpus, e.fault)])
            except faults.FaultError as exc:
                raise ScenarioError(f"{source}: steps.{e.step}: {exc}") from None


def run(
    target: faults.Target,
    scenario: Scenario,
    speed: float = 1.0,
    seed: int | None = None,
    report: Callable[[str], None] = print,
    sleep: Callable[[float], None] = time.sleep,
) -> list[faults.Result]:
    """Replay the timeline against ``target``; faults due together are applied in one update.

    Raises ScenarioError, before anything is applied, when the timeline does not fit the node."""
    events = scenario.timeline(faults.gpus(target), seed)
    check(target, events, scenario.source)
    results: list[faults.Result] = []
    start = time.monotonic()
    i = 0
    while i < len(events):
        batch = [e for e in events[i:] if e.at == events[i].at]
        due = start + events[i].at / speed
        wait = due - time.monotonic()
        if wait > 0:
            sleep(wait)
        gpu_faults = [(e.gpus, _scaled(e.fault, speed)) for e in batch if not e.hcas]
        applied = faults.apply(target, gpu_faults) if gpu_faults else []
        for e in batch:
            for hca in e.hcas:
                root = _port_of(target, hca, e.port, f"{scenario.source}: steps.{e.step}")
                ib_ports.apply(root, hca, e.port, e.fault)
            report(describe(e))
        results += applied
        i += len(batch)
    return results
