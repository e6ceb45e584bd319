"""CDI spec model, generator and validation: renders ``gpumodel.edits``, never decides."""

from .spec import (
    DEFAULT_DIR,
    DEFAULT_KIND,
    HCA_KIND,
    CdiError,
    SpecError,
    device_edits,
    file_name,
    minimum_version,
    render,
    render_adapters,
    resolve,
    validate,
    write,
)

__all__ = [
    "DEFAULT_DIR",
    "DEFAULT_KIND",
    "HCA_KIND",
    "CdiError",
    "SpecError",
    "device_edits",
    "file_name",
    "minimum_version",
    "render",
    "render_adapters",
    "resolve",
    "validate",
    "write",
]
