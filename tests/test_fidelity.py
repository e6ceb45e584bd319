"""Each built-in profile against its real-hardware capture, through the real nvidia-smi."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import Staged

from testbed import fidelity

pytestmark = pytest.mark.consumers

CAPTURES = Path(__file__).parent / "captures"
PROFILES = {name: CAPTURES / f"qx-{name}.xml" for name in ["a100", "b200", "gb200", "gb300", "h100", "l40s", "t4"]}
PROFILES["h200"] = CAPTURES / "h200" / "qx-h200.xml"
TARGET = 0.95


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_fidelity(
    stage: Callable[..., Staged], smi: tuple[str, Path], name: str, record_property: Callable[[str, object], None]
) -> None:
    staged = stage(name)
    mock = staged.run([str(smi[1]), "-q", "-x"]).stdout
    report = fidelity.compare(PROFILES[name].read_text(), mock)
    record_property("share", report.share)
    print(
        f"fidelity {name} nvidia-smi {smi[0]}: {report.matched}/{report.compared} = {report.share:.1%}, "
        f"invented {len(report.invented)}"
    )
    assert report.compared > 50
    assert not report.invented, "\n".join(report.invented[:20])
    assert report.share >= TARGET, "\n".join(report.mismatched[:40])
