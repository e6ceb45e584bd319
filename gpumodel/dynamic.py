"""Time-varying metrics: the ``dynamic`` section of a profile's GPU, compiled into patterns
the native library evaluates from the wall clock at every read (native/src/dynamic.c).

No daemon runs: a pattern is a pure function of the time, the seed and (for ``busy``)
whether the GPU has processes, so every process on the node reads the same value at the
same instant, and two nodes with the same profile and seed report the same series::

    gpu:
      dynamic:
        seed: 7
        power_w: {pattern: sine, mean: 350, amplitude: 120, period_s: 90}
        temperature_c: {pattern: walk, low: 38, high: 66, step_s: 10}
        utilization_gpu: {pattern: busy, idle: 0, busy: 97}
        memory_used_mib: {pattern: busy, idle: 0, busy: 52000}

Each GPU and metric draws its own stream from the seed (the GPU's index and the metric's
name are mixed in), so GPUs differ from each other but not from run to run.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# MOKKA_PATTERN_* in native/mokka_state.h
KIND = {"none": 0, "constant": 1, "sine": 2, "walk": 3, "busy": 4, "ramp": 5}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Constant(_Strict):
    pattern: Literal["constant"]
    value: float


class Sine(_Strict):
    pattern: Literal["sine"]
    mean: float
    amplitude: float = Field(ge=0)
    period_s: float = Field(gt=0, le=86_400)


class Walk(_Strict):
    pattern: Literal["walk"]
    low: float
    high: float
    step_s: float = Field(gt=0, le=86_400, description="one step of the walk")

    @model_validator(mode="after")
    def _ordered(self) -> Walk:
        if self.low > self.high:
            raise ValueError("need low <= high")
        return self


class Busy(_Strict):
    pattern: Literal["busy"]
    idle: float = Field(description="while the GPU has no processes")
    busy: float = Field(description="while it has some")


Pattern = Annotated[Constant | Sine | Walk | Busy, Field(discriminator="pattern")]


def bounds(p: Constant | Sine | Walk | Busy) -> tuple[float, float]:
    """The lowest and highest value a pattern can take."""
    if isinstance(p, Constant):
        return p.value, p.value
    if isinstance(p, Sine):
        return p.mean - p.amplitude, p.mean + p.amplitude
    if isinstance(p, Walk):
        return p.low, p.high
    return min(p.idle, p.busy), max(p.idle, p.busy)


@dataclass(frozen=True)
class Metric:
    """One metric a pattern may drive: its native index (MOKKA_METRIC_*), the factor from the
    profile's unit to the state's, and the range the profile accepts."""

    index: int
    scale: int
    low: float
    high: float
    unit: str


# MOKKA_METRIC_* in native/mokka_state.h; ranges as the profile model's own fields.
METRICS: dict[str, Metric] = {
    "power_w": Metric(0, 1000, 0, 100_000, "W"),
    "temperature_c": Metric(1, 1, 0, 200, "C"),
    "memory_temperature_c": Metric(2, 1, 0, 200, "C"),
    "utilization_gpu": Metric(3, 1, 0, 100, "%"),
    "utilization_memory": Metric(4, 1, 0, 100, "%"),
    "memory_used_mib": Metric(5, 1024 * 1024, 0, 10**9, "MiB"),
    "clock_sm_mhz": Metric(6, 1, 0, 100_000, "MHz"),
    "clock_memory_mhz": Metric(7, 1, 0, 100_000, "MHz"),
}


class Dynamic(_Strict):
    """Per-GPU patterns; a metric left out keeps the profile's static value."""

    seed: int = Field(0, ge=0, lt=2**63, description="same seed, same series (on every node)")
    power_w: Pattern | None = None
    temperature_c: Pattern | None = None
    memory_temperature_c: Pattern | None = None
    utilization_gpu: Pattern | None = None
    utilization_memory: Pattern | None = None
    memory_used_mib: Pattern | None = None
    clock_sm_mhz: Pattern | None = None
    clock_memory_mhz: Pattern | None = None

    @model_validator(mode="after")
    def _in_range(self) -> Dynamic:
        for name, metric in METRICS.items():
            p = getattr(self, name)
            if p is None:
                continue
            low, high = bounds(p)
            if low < metric.low or high > metric.high:
                raise ValueError(
                    f"{name}: the pattern reaches {low:g}..{high:g} {metric.unit}, "
                    f"outside {metric.low:g}..{metric.high:g}"
                )
        return self

    def patterns(self) -> dict[str, Constant | Sine | Walk | Busy]:
        return {name: p for name in METRICS if (p := getattr(self, name)) is not None}


def stream_seed(seed: int, gpu_index: int, metric: str) -> int:
    """The seed of one GPU's metric: stable across runs, machines and Python versions."""
    digest = hashlib.blake2b(f"{seed}:{gpu_index}:{metric}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def encode(p: Constant | Sine | Walk | Busy, metric: Metric, seed: int) -> dict[str, int]:
    """A pattern as the fields of mokka_pattern_t (kind, period_ms, a, b, seed, start_ms)."""
    s = metric.scale
    if isinstance(p, Constant):
        return {"kind": KIND["constant"], "period_ms": 0, "a": round(p.value * s), "b": 0, "seed": seed}
    if isinstance(p, Sine):
        period = max(1, round(p.period_s * 1000))
        a, b = round(p.mean * s), round(p.amplitude * s)
        return {"kind": KIND["sine"], "period_ms": period, "a": a, "b": b, "seed": seed}
    if isinstance(p, Walk):
        step = max(1, round(p.step_s * 1000))
        return {"kind": KIND["walk"], "period_ms": step, "a": round(p.low * s), "b": round(p.high * s), "seed": seed}
    return {"kind": KIND["busy"], "period_ms": 0, "a": round(p.idle * s), "b": round(p.busy * s), "seed": seed}


def write_pattern(target: Any, fields: dict[str, int]) -> None:
    """Fill one mokka_pattern_t (a cffi struct) from :func:`encode`'s fields."""
    target.kind = fields["kind"]
    target.period_ms = fields.get("period_ms", 0)
    target.a = fields.get("a", 0)
    target.b = fields.get("b", 0)
    target.seed = fields.get("seed", 0)
    target.start_ms = fields.get("start_ms", 0)


def fill(g: Any, dynamic: Dynamic, gpu_index: int) -> None:
    """Write a GPU record's patterns (every metric without one keeps kind 0: static)."""
    for name, p in dynamic.patterns().items():
        metric = METRICS[name]
        write_pattern(g.patterns[metric.index], encode(p, metric, stream_seed(dynamic.seed, gpu_index, name)))
