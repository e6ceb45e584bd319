"""containerd configuration for Mokka: NRI on, CDI on, and an ``nvidia`` runtime handler.

``plan()`` -> ``Plan.diff()`` -> ``apply()``; ``plan_remove()``/``remove()`` undo it. Edits go
through tomlkit (comments, order and layout of the user's file are kept); every file is
written atomically and recorded first in the host-change journal ``<config>.mokka-journal``
(``hostsetup.journal``), which keeps each original as a hard link: ``remove`` restores the
original bytes, mode and owner of a file still as Mokka left it, and undoes only Mokka's keys
in a file edited since. An install killed at any point is finished by installing again or
undone by ``remove``.

Modules, one job each: ``tomldoc`` (reading TOML), ``editor`` (setting keys in a file's style),
``imports`` (containerd's import chain and merge rules), ``version`` (which containerd),
``settings`` (what Mokka sets), ``install`` and ``remove`` (planning), ``plan`` (the plan and its
diff), ``apply`` (through the journal), ``systemd`` (restarting containerd).
"""

from __future__ import annotations

from .apply import apply, install, recover, remove
from .errors import ConfigError
from .install import DROPIN, plan
from .plan import JOURNAL_SUFFIX, Change, Plan, journal_path
from .remove import SAVED_SUFFIX, plan_remove
from .settings import DEFAULT_CDI_DIRS
from .systemd import restart, restart_hint, under_systemd
from .version import containerd_major

__all__ = [
    "DEFAULT_CDI_DIRS",
    "DROPIN",
    "JOURNAL_SUFFIX",
    "SAVED_SUFFIX",
    "Change",
    "ConfigError",
    "Plan",
    "apply",
    "containerd_major",
    "install",
    "journal_path",
    "plan",
    "plan_remove",
    "recover",
    "remove",
    "restart",
    "restart_hint",
    "under_systemd",
]
