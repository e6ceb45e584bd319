"""CDI spec model, generator and validation: renders ``nri_mokka.edits``, never decides."""

from .schema import fetch_schema
from .spec import (
    DEFAULT_DIR,
    DEFAULT_KIND,
    CdiError,
    SpecError,
    device_edits,
    file_name,
    minimum_version,
    render,
    resolve,
    validate,
    write,
)

__all__ = [
    "DEFAULT_DIR",
    "DEFAULT_KIND",
    "CdiError",
    "SpecError",
    "device_edits",
    "fetch_schema",
    "file_name",
    "minimum_version",
    "render",
    "resolve",
    "validate",
    "write",
]
