"""Finishing a release: consistency across levels, answers, the published record.

Part of :class:`dpdask.release._release.Release` (a mixin): the checkpointed
estimates are made consistent (``consistent-<level>``), fitted non-negative where
asked, answered (``answer-<level>``) and written with the release's attributes into
``final.zarr`` in the work folder, ready to be moved into place.
"""

from __future__ import annotations

import datetime
import json
import pathlib
import shutil
from collections.abc import Sequence
from typing import Any

import dask.array as da
import numpy as np
import zarr
from dask.base import tokenize

from dpdask import __version__
from dpdask.release._blocks import (
    FIT_AFTER_CONSISTENCY,
    NONNEGATIVE,
)
from dpdask.release._checkpoint import read_chunks
from dpdask.release._levels import (
    bottom_up,
    nonneg_down,
    nonneg_fit_up,
    partial_rows,
    top_down,
)
from dpdask.release._output import level_outputs
from dpdask.release._output_sparse import sparse_level_outputs
from dpdask.release._progress import compute_items
from dpdask.release._state import ReleaseState
from dpdask.release._topdown import sparse_entries
from dpdask.store import aggregate_rows, level_key


class Finish(ReleaseState):
    """The finishing steps of a :class:`~dpdask.release._release.Release`."""

    def _finish(
        self, work: pathlib.Path, raw: Sequence[pathlib.Path], client: Any, progress: bool
    ) -> pathlib.Path:
        out = work / "final.zarr"
        if out.exists():
            shutil.rmtree(out)
        root = zarr.open_group(str(out), mode="w", zarr_format=3)
        geo = self.store.geography
        ids = [np.asarray(geo.ids[geo.level_index(L.name)], dtype=str) for L in self._levels]
        levels = [(L.name, L.plan, L.unit_variance) for L in self._levels]
        if self.reconstruct == "topdown":
            entries = [
                [sparse_entries(folder, k) for k in range(len(L.chunks))]
                for folder, L in zip(raw, self._levels, strict=True)
            ]
            sources, targets = sparse_level_outputs(
                root, levels, raw, [L.chunks for L in self._levels], entries, ids,
                self.lc.parents, self.domain,
            )  # fmt: skip
        else:
            sources, targets = self._dense_outputs(root, work, raw, levels, ids)
        stored = da.store(sources, targets, lock=False, compute=False)
        compute_items([stored], client, progress, "publish")
        self._write_attributes(root, work, out)
        return out

    def _dense_outputs(
        self,
        root: zarr.Group,
        work: pathlib.Path,
        raw: Sequence[pathlib.Path],
        levels: list[tuple[str, Any, float]],
        ids: list[np.ndarray],
    ) -> tuple[list[da.Array], list[zarr.Array]]:
        """Consistent (and, for NNLS and ADMM, non-negative) estimates of every level from
        their checkpoints, and their outputs (:func:`~dpdask.release._output.level_outputs`)."""
        cells = tuple(self.domain.shape)
        estimates = [
            read_chunks(
                folder,
                L.chunks,
                cells,
                f"estimate-{level_key(L.name)}-{tokenize(str(work), L.name)}",
            )
            for folder, L in zip(raw, self._levels, strict=True)
        ]
        variances = [
            np.full(self.store.geography.n_units(L.name), L.unit_variance) for L in self._levels
        ]
        if len(self._levels) > 1:
            last = len(self._levels) - 1
            partial = read_chunks(
                work / "raw" / f"{self.levels[last]}-sums", self.lc.parent_ranges(last), cells,
                f"partial-{tokenize(str(work), 'sums')}",
            )  # fmt: skip
            word = level_key(self.levels[last - 1])
            sums = aggregate_rows(
                partial, partial_rows(self.lc, last), self.lc.chunks[last - 1],
                f"consistent-up-{word}",
            )  # fmt: skip
            z, vz, cz, cv = bottom_up(estimates, variances, self.lc, "consistent-up", sums)
            final, fvar = top_down(z, vz, cz, cv, self.lc, "consistent")
        else:
            final, fvar = estimates, variances
        if self.reconstruct in FIT_AFTER_CONSISTENCY:
            L = self._levels[-1]
            M, weights = (
                (L.plan.strategy, 1.0 / L.plan.row_variance)
                if self.reconstruct == "nnls"
                else (L.plan.workload, None)
            )
            final = nonneg_fit_up(final, self.lc, M, weights, str(work / "reports"))
        elif self.reconstruct in NONNEGATIVE:
            final = nonneg_down(final, self.lc, "nonnegative")
        return level_outputs(
            root, levels, final, fvar, ids, self.lc.parents, domain=self.domain,
            sparse_estimates=self.reconstruct in NONNEGATIVE,
        )  # fmt: skip

    def _write_attributes(self, root: zarr.Group, work: pathlib.Path, out: pathlib.Path) -> None:
        """The release's record in the root's attributes, then the consolidated metadata."""
        self._reports = sorted(
            (json.loads(p.read_text()) for p in (work / "reports").glob("*.json")),
            key=lambda r: (r["level"], r["chunk"]),
        )
        import warnings

        info = self._attributes()
        # plain keys for readers that do not know dpdask (xarray, CF tools); the full
        # record stays under "dpdask"
        root.attrs.update(
            {
                "dpdask": info,
                "title": f"dpdask release {self.release_id}",
                "release": self.release_id,
                "run_id": self.run_id,
                "dataset": self.dataset,
                "workload": info["workload"],
                "strategy": info["strategy"],
                "budget": info["budget"],
                "reconstruct": self.reconstruct,
                "levels": list(self.levels),
                "units": "persons",
                "margin_of_error": "moe90 = 1.645 * sqrt(variance), a 90% margin as ACS's",
            }
        )
        with warnings.catch_warnings():  # "not part of the Zarr v3 specification" (yet)
            warnings.simplefilter("ignore", zarr.errors.ZarrUserWarning)
            zarr.consolidate_metadata(str(out))

    def _attributes(self) -> dict[str, Any]:
        from dpdask.publish import strategy_record, workload_record

        info = self.summary()
        info.update(
            {
                "format": "dpdask-release",
                "format_version": 1,
                "dpdask_version": __version__,
                "created": datetime.datetime.now(datetime.UTC).isoformat(),
                # what the store says it was built from (a converted input's private
                # copy is gone by the time anyone reads this)
                "source": self.store.attrs.get("source") or str(self.store.path),
                "dataset": self.dataset,
                "workload": workload_record([L.plan for L in self._levels], self.levels),
                "strategy": strategy_record([L.plan for L in self._levels], self.levels),
                "test_mode": self.test_mode,
                "noise": self.noise,
                "charges": [c.published() for c in self.charges()],
            }
        )
        if self.ledger is not None and self.noise:
            info["ledger"] = {
                "path": str(self.ledger.path),
                "id": self.ledger.ledger_id,
                "head": str(self._head),
                "dataset": self.dataset,
                "spent": self.ledger.spent(self.release_id).to_dict(),
                "remaining": self.ledger.remaining(self.release_id).to_dict(),
            }
        return info
