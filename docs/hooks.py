"""MkDocs hooks (``mkdocs.yml``): the reference pages (:mod:`reference`) generated into the site on
every build, never written into the source tree."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import reference


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    for uri, name in reference.PAGES.items():
        files.append(File.generated(config, uri, content=reference.page(name)))
    return files
