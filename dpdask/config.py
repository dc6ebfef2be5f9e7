"""Library configuration under the ``dpdask`` namespace of :mod:`dask.config`.

Defaults live in ``dpdask.yaml`` beside this module and are registered with
:func:`dask.config.update_defaults` on import; nothing is written to the user's
home directory. Override with ``dask.config.set({"dpdask.linalg.max-dense-elements": ...})``
or the ``DASK_DPDASK__LINALG__MAX_DENSE_ELEMENTS`` environment variable.
"""

from __future__ import annotations

import pathlib
from typing import Any

import dask.config
import yaml

_FILE = pathlib.Path(__file__).with_name("dpdask.yaml")

with _FILE.open() as _f:
    defaults: dict[str, Any] = yaml.safe_load(_f)

dask.config.update_defaults(defaults)


def get(key: str) -> Any:
    """Return the configured value of ``dpdask.<key>``."""
    return dask.config.get(f"dpdask.{key}")
