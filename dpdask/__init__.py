"""dpdask: differentially private release of linear counting queries on Dask.

The package follows the data path: :mod:`dpdask.domain` and :mod:`dpdask.linalg`
describe data and queries, :mod:`dpdask.workloads` builds real workloads,
:mod:`dpdask.strategy` selects what to measure, :mod:`dpdask.privacy` and
:mod:`dpdask.noise` measure, :mod:`dpdask.reconstruct` estimates, and
:mod:`dpdask.dataflow` runs a release over zarr data on a Dask cluster;
:func:`open_release` (:mod:`dpdask.publish.reader`) reads a published one with xarray.
"""

from importlib.metadata import PackageNotFoundError, version

from dpdask import config  # noqa: F401  (registers configuration defaults)
from dpdask.domain import Domain, Geography
from dpdask.errors import DPDaskError, DPDaskWarning
from dpdask.strategy import Plan, select

try:
    __version__ = version("dpdask")
except PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = "0.0.0+unknown"

__all__ = [
    "DPDaskError",
    "DPDaskWarning",
    "Domain",
    "Geography",
    "Plan",
    "__version__",
    "open_release",
    "select",
]


def __getattr__(name: str):
    # open_release needs xarray: imported on first use, not with the package
    if name == "open_release":
        from dpdask.publish.reader import open_release

        return open_release
    raise AttributeError(f"module 'dpdask' has no attribute {name!r}")
