"""The persistent, tamper-evident privacy ledger: datasets, releases, runs and charges.

The ledger records every measurement a release makes: release id, run id, level,
measurement, mechanism, sensitivity, noise scale, the privacy charged and the
fingerprint of the key that draws the noise. A charge is committed and synced to
disk *before* any noise is drawn, so that a crash can never leave noise drawn but
not accounted for. Storage is a hash chain with an anchored head
(:mod:`dpdask.privacy._chain`): an edited, truncated, emptied, rolled-back or
missing ledger is refused, never recreated.

Accounting rules

* **Datasets.** A dataset may have a lifetime total; everything charged to the
  releases of that dataset, in every run, must fit within it.
* **Releases.** A release is opened once with its budget (and dataset); everything
  charged to it must fit within the budget.
* **Runs** are states bound to a key: ``open -> measuring -> published``, or
  ``abandoned``. A run records the fingerprint of its key (a keyed hash, never the
  key) and, when charged under :meth:`Ledger.bound`, a :class:`RunBinding`: the
  content hash of its input, the hash of its spec and its output. Charging a run with
  another key or binding, or a published or abandoned run at all, is refused: a new
  run id is a new charge. A resume (same run id, key and binding) finds its charges
  and charges nothing. A bound run is published only at its output, and a run is
  published once.
* A charge is identified by ``(release, run_id, level, measurement)``; charging the
  same identity again with the same parameters adds nothing, with different ones is
  refused.
* Parallel composition: the chunks of one geography level partition the people, so
  a level's measurement is charged once, not once per chunk.
* Sequential composition: charges are converted to the budget's definition before
  adding (pure epsilon to ``epsilon**2/2``-zCDP, pure to ``(epsilon, 0)``).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dpdask.privacy._budget import Budget
from dpdask.privacy._chain import (
    Chain,
    Entry,
    Head,
    LedgerError,
    LedgerMissingError,
    LedgerTamperedError,
)
from dpdask.privacy._records import (
    _LIVE,
    RUN_STATES,
    BudgetExceededError,
    Charge,
    LedgerConflictError,
    Run,
    RunBinding,
    RunStateError,
    _check_budget,
    _check_fits,
    _check_run,
    _left,
    _State,
    _total,
    check_binding,
    check_name,
    check_publication,
    check_run_id,
    dedupe,
    run_body,
)
from dpdask.privacy._store import ChainStore, create_store, is_server_url, open_store, shown

__all__ = [
    "RUN_STATES",
    "BudgetExceededError",
    "Charge",
    "Ledger",
    "LedgerConflictError",
    "LedgerError",
    "LedgerMissingError",
    "LedgerTamperedError",
    "Run",
    "RunBinding",
    "RunStateError",
    "check_binding",
    "check_name",
    "check_run_id",
]


class Ledger:
    """A persistent, tamper-evident record of privacy charges in one SQLite file, or
    shared on a PostgreSQL server (:mod:`dpdask.privacy._pg`).

    Parameters
    ----------
    path : str or Path
        The database file, or a server's ``postgresql://`` URL (shown and recorded
        without its password). It must exist (see :meth:`init`) unless ``create``.
    create : bool
        Create the ledger if there is none at ``path`` (and no head file says there
        was one). Opening always verifies the hash chain and, unless ``check_head``
        is false, the head file.
    check_head : bool
        False only to re-anchor a ledger whose head file was lost (:meth:`anchor`);
        every other read and every write still checks the head file.

    Raises
    ------
    LedgerMissingError
        If there is no ledger at ``path`` and ``create`` is false.
    LedgerTamperedError
        If the ledger is empty, corrupt, edited, truncated or rolled back.

    Examples
    --------
    >>> import tempfile, pathlib
    >>> from dpdask.privacy import zCDP
    >>> ledger = Ledger.init(pathlib.Path(tempfile.mkdtemp()) / "ledger.sqlite")
    >>> ledger.open_release("pl94", zCDP(1))
    >>> c = Charge("pl94", "run1", "county", "A", "gaussian", 1.0, 2.0, zCDP("0.125"), "k1")
    >>> ledger.charge(c)
    1
    >>> ledger.charge(c)  # a retry of the same run charges nothing
    0
    >>> ledger.remaining("pl94")
    zCDP(rho=0.875)
    >>> ledger.run("pl94", "run1").state
    'measuring'
    """

    def __init__(
        self, path: str | os.PathLike[str], *, create: bool = False, check_head: bool = True
    ):
        self.path = shown(path)  # a server URL is shown and recorded without its password
        self._location = str(path)  # and what a run's entry records as the ledger it charged:
        self._where = str(self.path) if is_server_url(path) else os.path.abspath(path)
        self._bindings: dict[tuple[str, str], RunBinding] = {}
        self._chain: ChainStore = open_store(path, create=create, check_head=check_head)

    @classmethod
    def init(cls, path: str | os.PathLike[str], operator_role: str | None = None) -> Ledger:
        """Create a new ledger at ``path`` (``dpdask ledger init``); refuses an existing one.

        ``path`` may be a PostgreSQL URL (``postgresql://ADMIN@HOST/DB``), run as the
        database's administrator; ``operator_role`` may then only read and append
        (:mod:`dpdask.privacy._pg`)."""
        create_store(path, operator_role)
        return cls(path)

    @property
    def head_file(self) -> Path | None:
        """The file beside the ledger that anchors its head (``None`` on a server)."""
        return self._chain.head_file

    @property
    def ledger_id(self) -> str:
        """The ledger's random identity, fixed when it was created."""
        return self._chain.ledger_id

    def __reduce__(self) -> tuple[type[Ledger], tuple[str]]:
        return (Ledger, (self._location,))

    def __repr__(self) -> str:
        return f"Ledger({str(self.path)!r})"

    # -- reading ---------------------------------------------------------------
    def _state(self) -> _State:
        return _State.fold(self._chain.read())

    def entries(self) -> list[Entry]:
        """Every entry of the chain, oldest first (read-only; verified on open)."""
        return self._chain.read()

    def head(self) -> Head:
        """The current head: entry count and hash of the last entry."""
        entries = self._chain.read()
        return Head(len(entries), entries[-1].hash)

    def verify(self) -> Head:
        """Check the chain and the head file; return the head (raises if tampered)."""
        return self.head()

    def contains(self, head: Head) -> bool:
        """Whether the chain has passed through ``head`` (a head recorded by a release)."""
        return Chain.contains(head, self._chain.read())

    def anchor(self, heads: Iterable[Head] = ()) -> Head:
        """Rewrite a lost head file from the chain (``dpdask ledger anchor``); the chain
        must verify and hold every head of ``heads`` (those its published releases
        recorded, any kept elsewhere), an existing head file must name one of its entries
        (a rolled-back ledger is never re-anchored). Open it with ``check_head=False``
        when its head file is missing. A server keeps its head: nothing is written, the
        heads are only checked."""
        return self._chain.reanchor(heads)

    def published_runs(self) -> list[Run]:
        """Every run recorded as published, with its output: the releases :meth:`anchor`
        must be shown. Read without the head file check, so that a ledger opened to be
        re-anchored can list them."""
        entries = self._chain.read(check_head=False)
        return [r for r in _State.fold(entries).runs.values() if r.state == "published"]

    def find(self, release: str, run_id: str, level: str, measurement: str) -> Charge | None:
        """The recorded charge with this identity, or ``None``."""
        return self._state().charges.get((release, run_id, level, measurement))

    def charges(self, release: str | None = None) -> list[Charge]:
        """All recorded charges (of one release), in the order they were written."""
        cs = self._state().charges.values()
        return [c for c in cs if release is None or c.release == release]

    def __len__(self) -> int:
        return len(self._state().charges)

    def run(self, release: str, run_id: str) -> Run | None:
        """The run ``run_id`` of ``release``, or ``None`` if the ledger has never seen it."""
        return self._state().runs.get((release, run_id))

    def runs(self, release: str | None = None) -> list[Run]:
        """Every run (of one release), in the order they were opened."""
        return [r for r in self._state().runs.values() if release is None or r.release == release]

    def budget(self, release: str) -> Budget:
        """The budget ``release`` was opened with."""
        return self._state().release(release)[0]

    def dataset(self, release: str) -> str | None:
        """The dataset ``release`` draws on."""
        return self._state().release(release)[1]

    def spent(self, release: str) -> Budget:
        """Everything charged to ``release`` so far, in its budget's definition."""
        st = self._state()
        budget, _ = st.release(release)
        return _total(budget, st.of_release(release))

    def remaining(self, release: str) -> Budget:
        """The part of ``release``'s budget not yet charged."""
        st = self._state()
        budget, _ = st.release(release)
        return _left(budget, _total(budget, st.of_release(release)))

    def dataset_total(self, dataset: str) -> Budget | None:
        """The lifetime total of ``dataset`` (``None`` if none is set)."""
        return self._state().datasets.get(dataset)

    def dataset_remaining(self, dataset: str) -> Budget | None:
        """The part of ``dataset``'s total not yet charged (``None`` if no total is set)."""
        st = self._state()
        total = st.datasets.get(dataset)
        if total is None:
            return None
        return _left(total, _total(total, st.of_dataset(dataset)))

    def report(self) -> dict[str, Any]:
        """Everything ``dpdask ledger show`` prints: head, datasets, releases and runs."""
        st = self._state()
        head = self.head()
        datasets = {}
        for d, total in st.datasets.items():
            spent = _total(total, st.of_dataset(d))
            datasets[d] = {
                "total": total.to_dict(),
                "spent": spent.to_dict(),
                "remaining": _left(total, spent).to_dict(),
            }
        releases = {}
        for r, (budget, dataset) in st.releases.items():
            spent = _total(budget, st.of_release(r))
            releases[r] = {
                "dataset": dataset,
                "budget": budget.to_dict(),
                "spent": spent.to_dict(),
                "remaining": _left(budget, spent).to_dict(),
                "runs": [
                    {
                        "run_id": run.run_id,
                        "state": run.state,
                        "key_fingerprint": run.key_fingerprint,
                        "output": run.output,
                        "binding": None if run.binding is None else run.binding.to_dict(),
                        "ledger": run.ledger,
                        "charges": sum(1 for c in st.charges.values() if c.key[:2] == (r, k)),
                    }
                    for (rel, k), run in st.runs.items()
                    if rel == r
                ],
            }
        return {
            "ledger": str(self.path),
            "head": str(head),
            "entries": head.count,
            "datasets": datasets,
            "releases": releases,
        }

    # -- registration --------------------------------------------------------------
    def set_dataset_total(self, dataset: str, total: Budget) -> None:
        """Configure the lifetime total of ``dataset`` across all its releases and runs.

        Set once; setting the same total again is a no-op, a different one raises
        :class:`LedgerConflictError` (the ledger is append-only).
        """
        check_name(dataset, "dataset")
        _check_budget(total, "dataset total")
        with self._chain.transaction() as (entries, append):
            st = _State.fold(entries)
            old = st.datasets.get(dataset)
            if old is not None:
                if old != total:
                    raise LedgerConflictError(
                        f"dataset {dataset!r} already has lifetime total {old!r}; "
                        f"the ledger cannot change it to {total!r}"
                    )
                return
            append("dataset", {"dataset": dataset, "total": total.to_dict()})

    def open_release(self, release: str, budget: Budget, dataset: str | None = None) -> None:
        """Register ``release`` with its budget (and the dataset it draws on).

        Re-opening with the same budget and dataset is a no-op (resuming); a
        different one raises :class:`LedgerConflictError`.
        """
        check_name(release, "release")
        _check_budget(budget, "release budget")
        if dataset is not None:
            check_name(dataset, "dataset")
        with self._chain.transaction() as (entries, append):
            st = _State.fold(entries)
            if release in st.releases:
                old, old_dataset = st.releases[release]
                if old != budget or old_dataset != dataset:
                    raise LedgerConflictError(
                        f"release {release!r} is already open with budget {old!r} on dataset "
                        f"{old_dataset!r}; a different budget or dataset needs a new release id"
                    )
                return
            append("release", {"release": release, "budget": budget.to_dict(), "dataset": dataset})

    def open_run(
        self, release: str, run_id: str, key_fingerprint: str, binding: RunBinding | None = None
    ) -> Run:
        """Open run ``run_id`` of ``release`` bound to a key (and to ``binding``: its
        input, spec and output), or resume it with the same key and binding.

        Raises
        ------
        RunStateError
            If the run is published or abandoned (a new run id is a new charge), or
            was opened with another key or binding.
        """
        check_run_id(run_id)
        check_name(key_fingerprint, "key fingerprint")
        with self._chain.transaction() as (entries, append):
            st = _State.fold(entries)
            st.release(release)
            run = st.runs.get((release, run_id))
            if run is None:
                append("run", run_body(release, run_id, key_fingerprint, binding, self._where))
                return Run(release, run_id, key_fingerprint, "open", None, binding, self._where)
            _check_run(run, key_fingerprint)
            if binding is not None:
                check_binding(run, binding)
            return run

    @contextmanager
    def bound(self, release: str, run_id: str, binding: RunBinding) -> Iterator[None]:
        """Within the block, charges of run ``run_id`` bind it to ``binding``.

        A run this block's charges open records ``binding``; a run already in the ledger
        is charged only if it was recorded with the same binding (else
        :class:`RunStateError`, nothing written). Publication checks the output a run is
        bound to whether or not it happens in the block.
        """
        check_run_id(run_id)
        RunBinding.check(binding)
        self._bindings[(release, run_id)] = binding
        try:
            yield
        finally:
            self._bindings.pop((release, run_id), None)

    def publish(self, release: str, run_id: str, output: str) -> None:
        """Record that run ``run_id`` was published at ``output`` (it can never charge
        again). A run is published once, and a bound run only at its bound output."""
        self._set_state(release, run_id, "published", output)

    def abandon(self, release: str, run_id: str) -> None:
        """Give up run ``run_id`` (for instance, its key is lost): it can never charge or
        publish again; what it charged stays spent."""
        self._set_state(release, run_id, "abandoned")

    def _set_state(self, release: str, run_id: str, state: str, output: str | None = None) -> None:
        with self._chain.transaction() as (entries, append):
            run = _State.fold(entries).runs.get((release, run_id))
            if run is None:
                raise RunStateError(f"run {run_id!r} of release {release!r} is not in the ledger")
            if state == "published":
                check_publication(run, str(output))
            if run.state == state:
                return
            if run.state not in _LIVE or (state == "published" and run.state != "measuring"):
                raise RunStateError(
                    f"run {run_id!r} of release {release!r} is {run.state}; it cannot become "
                    f"{state}"
                )
            body = {"release": release, "run_id": run_id, "state": state}
            if output is not None:
                body["output"] = str(output)
            append("state", body)

    # -- charging ----------------------------------------------------------------------
    def charge(self, charges: Charge | Iterable[Charge]) -> int:
        """Record charges atomically, all or none, durably, before noise is drawn.

        Each charge's run is opened (bound to the charge's key fingerprint) if the
        ledger has not seen it, and moves to ``measuring``. Charges already recorded
        with the same identity and parameters are skipped (a retry). The rest must
        fit, together, within each release's remaining budget and each dataset's
        remaining total.

        Returns
        -------
        int
            The number of new charges written (0 for a pure retry).

        Raises
        ------
        BudgetExceededError
            If the new charges do not fit; the message says how much is left.
        RunStateError
            If a run is published or abandoned, or bound to another key.
        LedgerConflictError
            If an identity was charged with other parameters, or a release is not open.
        """
        items = dedupe(charges)
        if not items:
            return 0
        with self._chain.transaction() as (entries, append):
            st = _State.fold(entries)
            todo, new_runs, to_measuring = self._plan_charges(st, items)
            for release, run_id, fp in new_runs:
                bound = self._bindings.get((release, run_id))
                append("run", run_body(release, run_id, fp, bound, self._where))
            for c in todo:
                append("charge", c.to_dict())
            for release, run_id in to_measuring:
                append("state", {"release": release, "run_id": run_id, "state": "measuring"})
        return len(todo)

    def check(self, charges: Charge | Iterable[Charge]) -> int:
        """Raise as :meth:`charge` would, without writing. Returns how many are new."""
        items = dedupe(charges)
        todo, _, _ = self._plan_charges(self._state(), items)
        return len(todo)

    # -- internals -------------------------------------------------------------------------
    def _plan_charges(
        self, st: _State, items: Sequence[Charge]
    ) -> tuple[list[Charge], list[tuple[str, str, str]], list[tuple[str, str]]]:
        """What charging ``items`` would write: new charges, new runs, runs to mark
        measuring; raises if any of it is refused."""
        todo: list[Charge] = []
        new_runs: dict[tuple[str, str], str] = {}
        to_measuring: list[tuple[str, str]] = []
        for c in items:
            check_run_id(c.run_id)
            if c.key_fingerprint is None:
                raise LedgerError(
                    f"the charge {c.key} does not say which key draws its noise "
                    "(key_fingerprint); the ledger binds every run to its key"
                )
            st.release(c.release)
            run = st.runs.get((c.release, c.run_id))
            rk = (c.release, c.run_id)
            if run is None:
                if rk in new_runs and new_runs[rk] != c.key_fingerprint:
                    raise RunStateError(f"run {c.run_id!r} is charged with two different keys")
                new_runs[rk] = c.key_fingerprint
            else:
                _check_run(run, c.key_fingerprint)
                if rk in self._bindings:
                    check_binding(run, self._bindings[rk])
            old = st.charges.get(c.key)
            if old is None:
                todo.append(c)
            elif not old.same_as(c):
                raise LedgerConflictError(
                    f"{c.key} was already charged as {old.mechanism} scale {old.noise_scale!r} "
                    f"costing {old.privacy!r}; refusing a different charge under the same "
                    "identity (use a new run id)"
                )
            if (run is None or run.state == "open") and rk not in to_measuring:
                to_measuring.append(rk)
        _check_fits(st, todo)
        return todo, [(*k, fp) for k, fp in new_runs.items()], to_measuring
