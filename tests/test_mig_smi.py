"""MIG through the real nvidia-smi (Debian's 535, 550 and 555) against the mock library, compared
with public captures of MIG-enabled boards (research for issue 13: an H100 80GB HBM3 session,
NVIDIA's MIG user guide, A100 sessions on R510/R515)."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import Staged

from fetch import nvidia_smi
from gpumodel import mig_state, state

pytestmark = pytest.mark.consumers

Smi = tuple[str, Path]


@pytest.fixture(scope="module", params=["550", "535", "555"])
def smi(request: pytest.FixtureRequest) -> Smi:
    """Debian's nvidia-smi 550 and 535, and 555 from experimental (MIG output changed in R555)."""
    version = request.param
    try:
        return version, nvidia_smi.fetch(version)
    except Exception as exc:
        pytest.fail(f"cannot get Debian's nvidia-smi {version}: {exc}")


# nvidia-smi mig -lgip / -lgipp on a fresh H100 80GB HBM3 with MIG on (captured session).
H100_LGIP = """\
+-----------------------------------------------------------------------------+
| GPU instance profiles:                                                      |
| GPU   Name             ID    Instances   Memory     P2P    SM    DEC   ENC  |
|                              Free/Total   GiB              CE    JPEG  OFA  |
|=============================================================================|
|   0  MIG 1g.10gb       19     7/7        9.75       No     16     1     0   |
|                                                             1     1     0   |
+-----------------------------------------------------------------------------+
|   0  MIG 1g.10gb+me    20     1/1        9.75       No     16     1     0   |
|                                                             1     1     1   |
+-----------------------------------------------------------------------------+
|   0  MIG 1g.20gb       15     4/4        19.62      No     26     1     0   |
|                                                             1     1     0   |
+-----------------------------------------------------------------------------+
|   0  MIG 2g.20gb       14     3/3        19.62      No     32     2     0   |
|                                                             2     2     0   |
+-----------------------------------------------------------------------------+
|   0  MIG 3g.40gb        9     2/2        39.50      No     60     3     0   |
|                                                             3     3     0   |
+-----------------------------------------------------------------------------+
|   0  MIG 4g.40gb        5     1/1        39.50      No     64     4     0   |
|                                                             4     4     0   |
+-----------------------------------------------------------------------------+
|   0  MIG 7g.80gb        0     1/1        79.25      No     132    7     0   |
|                                                             8     7     1   |
+-----------------------------------------------------------------------------+
"""
H100_LGIPP = """\
GPU  0 Profile ID 19 Placements: {0,1,2,3,4,5,6}:1
GPU  0 Profile ID 20 Placements: {0,1,2,3,4,5,6}:1
GPU  0 Profile ID 15 Placements: {0,2,4,6}:2
GPU  0 Profile ID 14 Placements: {0,2,4}:2
GPU  0 Profile ID  9 Placements: {0,4}:4
GPU  0 Profile ID  5 Placement : {0}:4
GPU  0 Profile ID  0 Placement : {0}:8
"""
# The same session: -cgi 19 x7 -C, then -lgi, -lci, -dci, -dgi.
H100_CGI = "".join(
    f"Successfully created GPU instance ID {gi:2d} on GPU  0 using profile MIG 1g.10gb (ID 19)\n"
    f"Successfully created compute instance ID  0 on GPU  0 GPU instance ID {gi:2d} using profile MIG 1g.10gb (ID  0)\n"
    for gi in (13, 11, 12, 7, 8, 9, 10)
)
H100_LGI = (
    """\
+-------------------------------------------------------+
| GPU instances:                                        |
| GPU   Name             Profile  Instance   Placement  |
|                          ID       ID       Start:Size |
|=======================================================|
"""
    + "+-------------------------------------------------------+\n".join(
        f"|   0  MIG 1g.10gb         19       {gi:2d}          {gi - 7}:1     |\n" for gi in range(7, 14)
    )
    + "+-------------------------------------------------------+\n"
)
H100_LCI = (
    """\
+--------------------------------------------------------------------+
| Compute instances:                                                 |
| GPU     GPU       Name             Profile   Instance   Placement  |
|       Instance                       ID        ID       Start:Size |
|         ID                                                         |
|====================================================================|
"""
    + "+--------------------------------------------------------------------+\n".join(
        f"|   0     {gi:2d}       MIG 1g.10gb          0         0          0:1     |\n" for gi in range(7, 14)
    )
    + "+--------------------------------------------------------------------+\n"
)
H100_DCI = "".join(
    f"Successfully destroyed compute instance ID  0 from GPU  0 GPU instance ID {gi:2d}\n" for gi in range(7, 14)
)
H100_DGI = "".join(f"Successfully destroyed GPU instance ID {gi:2d} from GPU  0\n" for gi in range(7, 14))


def run(staged: Staged, smi: Smi, *args: str, code: int = 0) -> str:
    res = staged.run([str(smi[1]), *args], check=False)
    assert res.returncode == code, f"{args}: exit {res.returncode}\n{res.stdout}{res.stderr}"
    return res.stdout


def test_h100_session_as_captured(stage_mig: Callable[..., Staged], smi: Smi) -> None:
    """The captured H100 session, command by command, output for output."""
    staged = stage_mig("h100", 1)
    bus = staged.profile.devices()[0].bus_id
    assert run(staged, smi, "-i", "0", "-mig", "1") == f"Enabled MIG Mode for GPU {bus}\nAll done.\n"
    assert run(staged, smi, "mig", "-i", "0", "-lgip") == H100_LGIP
    assert run(staged, smi, "mig", "-i", "0", "-lgipp") == H100_LGIPP
    assert run(staged, smi, "mig", "-i", "0", "-cgi", ",".join(["19"] * 7), "-C") == H100_CGI
    assert run(staged, smi, "mig", "-i", "0", "-lgi") == H100_LGI
    assert run(staged, smi, "mig", "-i", "0", "-lci") == H100_LCI
    assert run(staged, smi, "mig", "-i", "0", "-dci") == H100_DCI
    assert run(staged, smi, "mig", "-i", "0", "-dgi") == H100_DGI
    assert run(staged, smi, "-i", "0", "-mig", "0") == f"Disabled MIG Mode for GPU {bus}\nAll done.\n"


def test_list_shows_mig_devices_under_their_gpu(stage_mig: Callable[..., Staged], smi: Smi) -> None:
    staged = stage_mig(
        "h100", 2, mode=True, instances=[{"profile": "3g.40gb"}, {"profile": "2g.20gb"}, {"profile": "1g.10gb"}]
    )
    gpus = mig_state.read(staged.root.library)
    expected = []
    for d, g in zip(staged.profile.devices(), gpus, strict=True):
        expected.append(f"GPU {d.index}: {d.spec.name} (UUID: {d.uuid})")
        expected += [f"  MIG {m.profile:<12}Device {m.index:2d}: (UUID: {m.uuid})" for m in g.devices]
    assert run(staged, smi, "-L").splitlines() == expected
    assert expected[1] == f"  MIG 3g.40gb     Device  0: (UUID: {gpus[0].devices[0].uuid})"  # the captures' spacing


def test_compute_instances_inside_a_gpu_instance(stage_mig: Callable[..., Staged], smi: Smi) -> None:
    """-lcip / -cci / -lci / -dci on a 3g GI, as the A100 80GB R515 session did it."""
    staged = stage_mig("h100", 1, mode=True, instances=[{"profile": "3g.40gb", "compute": []}])
    lcip = run(staged, smi, "mig", "-i", "0", "-gi", "2", "-lcip")
    rows = re.findall(r"\|\s+0\s+2\s+MIG (\S+)\s+(\d\*?)\s+(\d)/(\d)\s+(\d+)", lcip)
    assert rows == [
        ("1c.3g.40gb", "0", "3", "3", "20"),
        ("2c.3g.40gb", "1", "1", "1", "40"),
        ("3g.40gb", "2*", "1", "1", "60"),
    ]
    assert (
        run(staged, smi, "mig", "-i", "0", "-gi", "2", "-lci", code=6).strip()
        == "No compute instances found: Not Found"
    )
    made = run(staged, smi, "mig", "-i", "0", "-gi", "2", "-cci", "1c.3g.40gb,1c.3g.40gb")
    line = (
        "Successfully created compute instance ID  {} on GPU  0 GPU instance ID  2 using profile MIG 1c.3g.40gb (ID  0)"
    )
    assert made.splitlines() == [line.format(c) for c in (0, 1)]
    lci = run(staged, smi, "mig", "-i", "0", "-gi", "2", "-lci")
    assert re.findall(r"MIG 1c\.3g\.40gb\s+0\s+(\d)\s+(\d:1)", lci) == [("0", "0:1"), ("1", "1:1")]
    listed = run(staged, smi, "-L").splitlines()
    assert [ln.split("Device")[0] for ln in listed[1:]] == ["  MIG 1c.3g.40gb  "] * 2
    plain = run(staged, smi)
    # CIs sharing a GI: one memory cell for both rows, each with its own SMs
    assert re.search(r"\|\s+0\s+2\s+0\s+0\s+\|\s+0MiB / 40448MiB\s+\| 20 ", plain), plain
    assert re.search(r"\|\s+0\s+2\s+1\s+1\s+\|\s+\| 20 ", plain), plain
    gone = run(staged, smi, "mig", "-i", "0", "-gi", "2", "-ci", "0,1", "-dci")
    assert gone == "".join(
        f"Successfully destroyed compute instance ID  {c} from GPU  0 GPU instance ID  2\n" for c in (0, 1)
    )


def test_plain_view_with_mig(stage_mig: Callable[..., Staged], smi: Smi) -> None:
    staged = stage_mig(
        "h100",
        2,
        overrides={1: {"mig": {"mode": False, "instances": []}}},
        mode=True,
        instances=[{"profile": "3g.40gb"}, {"profile": "1g.10gb"}],
    )
    out = run(staged, smi)
    assert out.count("Enabled |") == 1 and out.count("Disabled |") == 1  # the MIG M. cells
    assert re.search(r"\|\s+N/A\s+Default \|", out), "GPU-Util is N/A on a MIG-enabled GPU"
    assert "MIG devices:" in out
    assert re.search(r"\|\s+0\s+2\s+0\s+0\s+\|\s+0MiB / 40448MiB\s+\| 60\s+0 \|\s+3\s+0\s+3\s+0\s+3 \|", out), out
    assert re.search(r"\|\s+0\s+7\s+0\s+1\s+\|\s+0MiB /  9984MiB\s+\| 16\s+0 \|", out), out
    assert "65535MiB" in out  # BAR1 of a 3g: half the 128 GiB aperture, less one MiB (as R515 shows)


def test_query_shows_the_mig_section(stage_mig: Callable[..., Staged], smi: Smi) -> None:
    staged = stage_mig("h100", 1, mode=True, instances=[{"profile": "3g.40gb"}, {"profile": "2g.20gb"}])
    root = ET.fromstring(run(staged, smi, "-q", "-x"))
    gpu = root.find("gpu")
    assert gpu is not None
    assert (gpu.findtext("mig_mode/current_mig"), gpu.findtext("mig_mode/pending_mig")) == ("Enabled", "Enabled")
    devices = gpu.findall("mig_devices/mig_device")
    assert [
        (d.findtext("index"), d.findtext("gpu_instance_id"), d.findtext("compute_instance_id")) for d in devices
    ] == [
        ("0", "2", "0"),
        ("1", "3", "0"),
    ]
    shared = devices[0].find("device_attributes/shared")
    assert shared is not None
    assert {e.tag: e.text for e in shared} == {  # as R575 printed a 3g.40gb on an H100
        "multiprocessor_count": "60",
        "copy_engine_count": "3",
        "encoder_count": "0",
        "decoder_count": "3",
        "ofa_count": "0",
        "jpg_count": "3",
    }
    assert devices[0].findtext("fb_memory_usage/total") == "40448 MiB"
    text = run(staged, smi, "-q")
    assert re.search(r"MIG Device\s+Index\s+: 1\s+GPU Instance ID\s+: 3\s+Compute Instance ID\s+: 0", text), text


def test_refusals_and_their_messages(stage_mig: Callable[..., Staged], smi: Smi) -> None:
    staged = stage_mig("h100", 1, mode=True, instances=[{"profile": "3g.40gb"}])
    assert run(staged, smi, "mig", "-i", "0", "-cgi", "0", code=23) == (
        "Unable to create a GPU instance on GPU  0 using profile 0: Insufficient Resources\n"
        "Failed to create GPU instances: Insufficient Resources\n"
    )
    assert run(staged, smi, "mig", "-i", "0", "-dgi", "-gi", "2", code=19) == (
        "Unable to destroy GPU instance ID  2 from GPU  0: In use by another client\n"
        "Failed to destroy GPU instances: In use by another client\n"
    )
    bus = staged.profile.devices()[0].bus_id
    assert run(staged, smi, "-i", "0", "-mig", "0", code=19).startswith(
        f"Unable to disable MIG Mode for GPU {bus}: In use by another client"
    )
    run(staged, smi, "mig", "-i", "0", "-dci")
    run(staged, smi, "mig", "-i", "0", "-dgi")
    assert run(staged, smi, "mig", "-i", "0", "-lgi", code=6).strip() == "No GPU instances found: Not Found"


def test_pending_enable_on_a_busy_gpu(stage_mig: Callable[..., Staged], smi: Smi) -> None:
    staged = stage_mig("h100", 1)

    def busy(node: object, gpus: object) -> None:
        g = gpus[0]  # type: ignore[index]
        g.n_procs = 1
        g.procs[0].pid, g.procs[0].used_memory = 4242, 1 << 30

    state.update(staged.root.library, busy)
    bus = staged.profile.devices()[0].bus_id
    out = run(staged, smi, "-i", "0", "-mig", "1")
    assert out.startswith(f"Warning: MIG mode is in pending enable state for GPU {bus}:In use by another client\n")
    assert out.endswith("All done.\n")
    assert run(staged, smi, "--query-gpu=mig.mode.current,mig.mode.pending", "--format=csv,noheader") == (
        "Disabled, Enabled\n"
    )


@pytest.mark.parametrize("name", ["l40s", "t4"])
def test_boards_without_mig(stage: Callable[..., Staged], smi: Smi, name: str) -> None:
    staged = stage(name, 1)
    bus = staged.profile.devices()[0].bus_id
    assert run(staged, smi, "-i", "0", "-mig", "1") == (
        f"Unable to enable MIG Mode for GPU {bus}: Not Supported\nTreating as warning and moving on.\nAll done.\n"
    )
    # 550 and 555 name the board unsupported, 535 not enabled (the 535 binary's own wording)
    expected = "No MIG-enabled devices found." if smi[0] == "535" else "No MIG-supported devices found."
    assert run(staged, smi, "mig", "-lgip", code=6).strip() == expected


def test_a100_profiles_as_the_user_guide_lists_them(stage_mig: Callable[..., Staged], smi: Smi) -> None:
    staged = stage_mig("a100", 1, mode=True)
    rows = re.findall(
        r"MIG (\S+)\s+(\d+)\s+(\d)/(\d)\s+([\d.]+)\s+No\s+(\d+)\s+(\d+)\s+(\d+)", run(staged, smi, "mig", "-lgip")
    )
    assert rows == [
        ("1g.5gb", "19", "7", "7", "4.75", "14", "0", "0"),
        ("1g.5gb+me", "20", "1", "1", "4.75", "14", "1", "0"),
        ("1g.10gb", "15", "4", "4", "9.62", "14", "1", "0"),
        ("2g.10gb", "14", "3", "3", "9.62", "28", "1", "0"),
        ("3g.20gb", "9", "2", "2", "19.50", "42", "2", "0"),
        ("4g.20gb", "5", "1", "1", "19.50", "56", "2", "0"),
        ("7g.40gb", "0", "1", "1", "39.25", "98", "5", "0"),
    ]
