"""MIG test helpers: profiles with a MIG section, staged into a root of the test's own (MIG
changes write the state, so no two tests share one)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import Staged

from gpumodel import driver_root, profile

PROFILES = Path(profile.__file__).parent / "profiles"


def mig_profile_data(
    base: str = "h100", gpus: int = 2, overrides: dict[int, Any] | None = None, **mig: Any
) -> dict[str, Any]:
    """A built-in profile's data with ``gpu.mig`` set to ``mig`` (nothing: MIG off) and per-GPU
    ``overrides`` (e.g. ``{1: {"mig": {"mode": False, "instances": []}}}``)."""
    data: dict[str, Any] = yaml.safe_load((PROFILES / f"{base}.yaml").read_text())
    data["name"] = f"{base}-mig"
    data["gpu_count"] = gpus
    data["topology"] = {k: v[:gpus] if isinstance(v, list) else v for k, v in data.get("topology", {}).items()}
    data["gpus"] = {i: o for i, o in (data.get("gpus") or {}).items() if i < gpus}
    if mig:
        data["gpu"]["mig"] = mig
    for index, override in (overrides or {}).items():
        data["gpus"][index] = {**data["gpus"].get(index, {}), **override}
    return data


def write_profile(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture
def stage_mig(tmp_path: Path) -> Callable[..., Staged]:
    """Stage a profile (built from :func:`mig_profile_data`'s arguments) into a fresh root."""
    made = 0

    def _stage(base: str = "h100", gpus: int = 2, overrides: dict[int, Any] | None = None, **mig: Any) -> Staged:
        nonlocal made
        made += 1
        source = write_profile(tmp_path / f"profile-{made}.yaml", mig_profile_data(base, gpus, overrides, **mig))
        prof = profile.load(source)
        return Staged(driver_root.stage(prof, tmp_path / f"root-{made}"), prof)

    return _stage
