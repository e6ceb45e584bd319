"""Build hook: compile the native shims with `make -C native` and ship them in the wheel."""

import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
ARTIFACTS = [
    "build/libnvidia-ml.so",
    "build/libcuda.so",
    "build/libdcgm.so",
    "build/libmokka-state.so",
    "build/libmokka-sysfs.so",
    "build/nvidia-imex",
    "build/nvidia-imex-ctl",
    "build/mokka-proc-hook",
    "mokka_state.h",
]


class BuildWithNative(build_py):
    def run(self) -> None:
        subprocess.run(["make", "-C", str(ROOT / "native"), f"PYTHON={sys.executable}"], check=True)
        super().run()
        if not self.editable_mode:
            target = Path(self.build_lib) / "gpumodel" / "_native"
            target.mkdir(parents=True, exist_ok=True)
            for artifact in ARTIFACTS:
                shutil.copy2(ROOT / "native" / artifact, target / Path(artifact).name)


setup(cmdclass={"build_py": BuildWithNative})
