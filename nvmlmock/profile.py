"""Print the name of Mokka's built-in profile that FGO's merged profile (``/etc/nvml-mock/config.yaml``:
nvml-mock's format, as Mokka's chart or FGO's own builtin profiles publish it) describes: the one
whose board has the same ``device_defaults.name``. Exit 1 naming the board when none does."""

from __future__ import annotations

import sys

import yaml

from gpumodel import profile as profiles
from k8snode.nodeinfo import fgo_profile


def main(path: str) -> int:
    with open(path) as fh:
        wanted = (yaml.safe_load(fh) or {}).get("device_defaults", {}).get("name")
    for name in profiles.builtin_names():
        if fgo_profile(profiles.load(name))["device_defaults"]["name"] == wanted:
            print(name)
            return 0
    print(f"nvml-mock: no Mokka profile has board {wanted!r} ({path})", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
