"""The mock libdcgm's ABI against DCGM's own headers (../shared/thirdparty/dcgm/include, the
ones dcgm-exporter is built against): every size, offset, version word and constant the
library declares in native/dcgm/abi.h, every field id of its metadata table, and every DCGM
symbol the exporter references. The product's build never reads those headers."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from fetch import dcgm_exporter
from gpumodel.native import DCGM_LIBRARY, library_path

NATIVE = Path(__file__).resolve().parent.parent / "native"
HEADERS = dcgm_exporter.SHARED / "include"
needs_headers = pytest.mark.skipif(not (HEADERS / "dcgm_structs.h").is_file(), reason=f"no DCGM headers in {HEADERS}")


def compile_and_run(tmp_path: Path, name: str, *flags: str) -> str:
    exe = tmp_path / name
    subprocess.run(
        ["cc", "-std=gnu11", "-Wall", "-Werror", *flags, "-o", str(exe), str(NATIVE / "test" / "dcgm_abi_canary.c")],
        check=True,
    )
    return subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout


@needs_headers
def test_layouts_and_constants_are_dcgms(tmp_path: Path) -> None:
    theirs = compile_and_run(tmp_path, "theirs", "-DDCGM_HEADERS", f"-I{HEADERS}").splitlines()
    ours = compile_and_run(tmp_path, "ours", f"-I{NATIVE}").splitlines()
    assert len(ours) > 100
    assert [a for a, b in zip(theirs, ours, strict=True) if a != b] == []


@needs_headers
def test_every_field_id_is_dcgms(tmp_path: Path) -> None:
    check = tmp_path / "fields.c"
    check.write_text(
        "#include <dcgm_fields.h>\n"
        "#define FIELD(name, id, type, size, tag, scope, level) _Static_assert(name == id && level == level, #name);\n"
        '#include "dcgm/field_table.h"\n'
    )
    subprocess.run(
        ["cc", "-std=gnu11", "-c", f"-I{HEADERS}", f"-I{NATIVE}", "-o", str(tmp_path / "f.o"), str(check)], check=True
    )


@pytest.mark.skipif(dcgm_exporter.default_counters() is None, reason="no dcgm-exporter to read symbols from")
def test_every_symbol_the_exporter_references_is_exported(tmp_path: Path) -> None:
    exe = dcgm_exporter.binary(tmp_path)
    wanted = subprocess.run(["nm", "-D", "--undefined-only", str(exe)], check=True, capture_output=True, text=True)
    needed = {
        line.split()[-1]
        for line in wanted.stdout.splitlines()
        if "dcgm" in line.lower() or line.split()[-1] == "errorString"
    }
    have = subprocess.run(
        ["nm", "-D", "--defined-only", str(library_path(DCGM_LIBRARY))], check=True, capture_output=True, text=True
    )
    exported = {line.split()[-1] for line in have.stdout.splitlines()}
    assert len(needed) > 40
    assert sorted(needed - exported) == []
