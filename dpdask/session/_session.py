"""``dpdask.Session``: plan and release from a notebook, through the command line's door.

A session holds a dataset and a ledger. :meth:`Session.plan` selects a strategy and
reports its expected errors without reading data; :meth:`Session.release` writes a
release spec equivalent to the YAML one a ``dpdask run`` would read (built with
:func:`dpdask.pipeline.spec.parse_spec`, its input the session's data in a private
folder) and runs it with :func:`dpdask.pipeline.run.run_spec`. So every charge, key,
run id, output claim and publication rule is the command line's, by construction, and
the result is read back with :func:`dpdask.open_release`: exactly what was published.
"""

from __future__ import annotations

import datetime
import logging
import pathlib
import shutil
import tempfile
import weakref
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

from dpdask.domain import Domain, Geography
from dpdask.errors import BudgetExceededError, SpecError
from dpdask.privacy import Budget, zCDP
from dpdask.session._inputs import (
    SessionData,
    SessionGeographies,
    SessionInput,
    UnknownGeography,
    prepare_input,
)
from dpdask.session._session_plan import SessionPlan, Spending, budget_mapping, total

if TYPE_CHECKING:  # pragma: no cover
    import xarray as xr
    from distributed import Client

    from dpdask.pipeline.spec import ReleaseSpec
    from dpdask.privacy import Ledger

log = logging.getLogger("dpdask")

__all__ = ["Session", "SessionPlan", "Spending", "budget_mapping"]


class Session:
    """A budgeted session over a ledger and a dataset: plan, release, and see what is left.

    Parameters
    ----------
    data : pandas.DataFrame, numpy.ndarray, xarray.DataArray or path
        Person records, one row per person (a text geography column and attribute
        columns: integer codes, sizes in ``domain``, or pandas categoricals); counts of
        shape ``(finest units, *domain)`` with their ``geographies``; a DataArray whose
        first dimension is the finest units and whose other dimensions are the
        attributes; or the path of a data store.
    geographies : optional
        The public universe of units (records and counts): as
        :func:`dpdask.store.geography_universe` takes it (finest ids, ``{level:
        ids}``, a parent table, a CSV path or a :class:`~dpdask.Geography`). Every unit
        is published; none comes from the records.
    geography_column : str, optional
        The records' geography column (finest ids, text).
    levels : mapping of str to int, optional
        GEOID prefix lengths per level (records whose ids are GEOIDs).
    domain : Domain or mapping, optional
        Sizes of integer-coded attributes (never read from the values).
    attributes : sequence of str, optional
        The attribute columns, in order (default: every other column).
    dataset : str, optional
        The dataset's id in the ledger (default: a content hash of the data, as the
        command line's default).
    dataset_budget : Budget or mapping, optional
        The dataset's lifetime budget (a spec's ``privacy.dataset``).
    budget : Budget, optional
        A cap on what this session may spend (checked before each release).
    ledger : path or URL, optional
        The ledger (default: ``ledger.sqlite`` in ``folder``). A missing ledger is
        created only with ``create_ledger`` (default: only the default one).
    folder : path
        Where releases are published by default (``<folder>/<release>.zarr``).
    client : distributed.Client, optional
        A client to use (left open); by default the session starts one as ``dpdask
        run`` does (:func:`dpdask.pipeline.connect` with ``cluster``) on first release
        and closes it with the session.
    cluster : str or mapping, optional
        As a spec's ``cluster:`` (e.g. ``{"n_workers": 1}``).
    unknown_geography : {"refuse", "drop"}
        Records outside the universe: refused (default) or dropped.

    Examples
    --------
    >>> import pandas as pd
    >>> from dpdask.privacy import zCDP
    >>> people = pd.DataFrame({"geoid": ["0101", "0102", "0201"], "sex": [0, 1, 1]})
    >>> with Session(people, geographies=["0101", "0102", "0201"], geography_column="geoid",
    ...              levels={"state": 2, "county": 4}, domain={"sex": 2},
    ...              folder=".") as s:
    ...     plan = s.plan("identity", zCDP(1), strategy="identity")
    ...     plan.levels, sorted(plan.expected)
    (('state', 'county'), ['county', 'state'])
    >>> tree = s.release(plan, "people")  # doctest: +SKIP
    >>> tree["county"].ds.moe90  # doctest: +SKIP
    """

    def __init__(
        self,
        data: SessionData,
        *,
        geographies: SessionGeographies | None = None,
        geography_column: str | None = None,
        levels: Mapping[str, int] | None = None,
        domain: Domain | Mapping[str, int] | None = None,
        attributes: Sequence[str] | None = None,
        dataset: str | None = None,
        dataset_budget: Budget | Mapping[str, Any] | None = None,
        budget: Budget | None = None,
        ledger: str | pathlib.Path | None = None,
        create_ledger: bool | None = None,
        folder: str | pathlib.Path = "dpdask-releases",
        client: Client | None = None,
        cluster: str | Mapping[str, Any] | None = None,
        unknown_geography: UnknownGeography = "refuse",
    ) -> None:
        self.folder = pathlib.Path(folder).absolute()
        self.ledger: str | pathlib.Path = (
            ledger if ledger is not None else self.folder / "ledger.sqlite"
        )
        self._create = (ledger is None) if create_ledger is None else bool(create_ledger)
        self.budget = budget
        self._lifetime = None if dataset_budget is None else budget_mapping(dataset_budget)
        self._cluster = cluster
        self._client = client
        self._started = False  # whether the session started (and so closes) the client
        self._stack = ExitStack()
        self._runs: list[tuple[str, str]] = []  # (release, run id) charged by this session
        # the confidential copy: owner-only (mkdtemp makes it 0700), removed on close
        self._private = pathlib.Path(tempfile.mkdtemp(prefix="dpdask-session-"))
        self._cleanup = weakref.finalize(self, shutil.rmtree, self._private, True)
        try:
            self.input: SessionInput = prepare_input(
                data, self._private, geography_column=geography_column,
                geographies=geographies, levels=levels, domain=domain, attributes=attributes,
                dataset=dataset, unknown_geography=unknown_geography,
            )  # fmt: skip
            self._dataset_id = self._dataset()  # hashed once, while the copy exists
        except BaseException:
            self._cleanup()
            raise

    # -- the spec ---------------------------------------------------------------------------
    @property
    def geography(self) -> Geography:
        """The public universe: every release publishes its units."""
        return self.input.geography

    @property
    def domain(self) -> Domain:
        """The attributes counted."""
        return self.input.domain

    def spec_mapping(
        self,
        plan: SessionPlan,
        release: str,
        output: pathlib.Path,
        reconstruct: str | Mapping[str, Any] = "ls",
    ) -> dict[str, Any]:
        """The release spec (as a mapping, YAML's form) a release of ``plan`` runs; its
        input paths are relative to the session's private folder."""
        privacy = budget_mapping(plan.budget)
        if plan.split is not None:
            privacy["split"] = {lv: str(v) for lv, v in plan.split.items()}
        if self._lifetime is not None:
            privacy["dataset"] = self._lifetime
        ledger = self.ledger
        ledger_entry: str | dict[str, Any]
        if isinstance(ledger, str) and "://" in ledger:
            ledger_entry = ledger
        else:
            ledger_entry = {"path": str(pathlib.Path(ledger).absolute()), "create": self._create}
        return {
            "release": release,
            "data": dict(self.input.data),
            "domain": self.domain.to_dict(),
            "levels": list(plan.levels),
            "workload": plan.workload,
            "privacy": privacy,
            "strategy": plan.strategy,
            "reconstruct": reconstruct,
            "output": str(output),
            "ledger": ledger_entry,
        }

    def _spec(self, raw: Mapping[str, Any]) -> ReleaseSpec:
        from dpdask.pipeline.spec import parse_spec

        return parse_spec(raw, base=self._private)

    # -- plan -------------------------------------------------------------------------------
    def plan(
        self,
        workload: str | Mapping[str, Any],
        budget: Budget | Mapping[str, Any],
        levels: Sequence[str] | None = None,
        strategy: str | Mapping[str, Any] = "hdmm",
        split: Mapping[str, Any] | None = None,
    ) -> SessionPlan:
        """Select the strategy and report its expected errors, reading no data.

        Parameters
        ----------
        workload : str or mapping
            As a spec's ``workload`` (``"marginals"``, ``{"name": "marginals", "k": 2}``,
            or ``{"levels": {level: workload}}``).
        budget : Budget or mapping
            The release's total (``zCDP(1)``, ``{"epsilon": 1}``).
        levels : sequence of str, optional
            Released levels, coarsest first (default: every level of the universe).
        strategy : str or mapping
            As a spec's ``strategy`` (``"hdmm"``, ``{"name": "hdmm", "restarts": 5}``).
        split : mapping of level to share, optional
            Each level's share of the budget (default: even).

        Returns
        -------
        SessionPlan

        Raises
        ------
        SpecError
            As ``dpdask plan`` would, naming the field.
        """
        from dpdask.pipeline.run import plan_spec
        from dpdask.specs import parse_budget  # the one budget reader of every spec

        levels = tuple(levels or self.geography.levels)
        unknown = [lv for lv in levels if lv not in self.geography.levels]
        if unknown:
            raise SpecError(
                f"levels: {unknown} not levels of the data ({list(self.geography.levels)})"
            )
        if not isinstance(budget, Budget):
            budget = parse_budget(budget, "budget")
        draft = SessionPlan(
            workload, budget, levels, strategy, None if split is None else dict(split), None, {}
        )
        spec = self._spec(self.spec_mapping(draft, "plan", self._private / "plan.zarr"))
        chosen, report = plan_spec(spec)
        return SessionPlan(
            workload, spec.privacy, levels, strategy,
            None if spec.split is None else dict(spec.split), chosen, report,
        )  # fmt: skip

    # -- release ----------------------------------------------------------------------------
    def release(
        self,
        plan: SessionPlan,
        name: str | None = None,
        *,
        output: str | pathlib.Path | None = None,
        reconstruct: str | Mapping[str, Any] = "ls",
        run_id: str | None = None,
        overwrite: bool = False,
        progress: bool = True,
    ) -> xr.DataTree:
        """Charge the ledger, measure, reconstruct and publish ``plan``; read it back.

        The run is ``dpdask run`` of the equivalent spec (:meth:`spec_mapping`): the
        same checks before any charge, a fresh key in the run's work folder beside the
        output, the output's claim, the ledger's binding of the run to its input, spec
        and output. The same ``run_id`` resumes an interrupted run (same noise, no new
        charge); a published run id is refused. Records resume in any session holding the
        same records; in-memory counts only in the session that started the run (the
        private store written from them records when it was written, and the ledger binds
        the run to its input's bytes).

        Parameters
        ----------
        plan : SessionPlan
            From :meth:`plan`.
        name : str, optional
            The release id in the ledger (default ``session-<UTC time>``).
        output : path, optional
            Where to publish (default ``<folder>/<name>.zarr``).
        reconstruct : str or mapping
            As a spec's ``reconstruct``.
        run_id, overwrite, progress
            As ``dpdask run --run-id``, ``--overwrite`` and its progress bar.

        Returns
        -------
        xarray.DataTree
            :func:`dpdask.open_release` of the published release: one child per level
            (coarsest first) with ``estimate``, ``answers``, ``variance`` and ``moe90``.

        Raises
        ------
        BudgetExceededError
            Above the session's cap, the release's, or the dataset's remaining budget,
            before anything is charged.
        """
        from dpdask.pipeline.run import run_spec
        from dpdask.publish.reader import open_release

        if not isinstance(plan, SessionPlan):
            raise SpecError("plan: give a plan made by Session.plan")
        if name is None:
            name = "session-" + datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S")
        target = pathlib.Path(output) if output is not None else self.folder / f"{name}.zarr"
        left = self.remaining.session
        if left is not None and not plan.budget <= left:
            raise BudgetExceededError(
                f"budget: the session has {left!r} left, the plan asks for {plan.budget!r}"
            )
        spec = self._spec(self.spec_mapping(plan, name, target.absolute(), reconstruct))
        target.absolute().parent.mkdir(parents=True, exist_ok=True)
        if run_id is None:  # known before the run starts: the session counts its charges
            from dpdask.publish import new_run_id

            run_id = new_run_id()
        if (spec.release, run_id) not in self._runs:  # a resume is the same run
            self._runs.append((spec.release, run_id))
        try:
            summary = run_spec(
                spec, client=self.client, run_id=run_id, overwrite=overwrite, progress=progress
            )
        except BaseException as exc:
            if self._charged(spec.release, run_id):
                exc.add_note(
                    f"in Python: session.release(plan, {spec.release!r}, run_id={run_id!r}) "
                    "resumes it with this session's data"
                )
            raise
        log.info("session: published %s (run %s)", summary["output"], run_id)
        return open_release(summary["output"])

    # -- budgets ----------------------------------------------------------------------------
    def _charged(self, release: str, run_id: str) -> bool:
        """Whether the ledger holds ``run_id`` charged and not finished (``False`` when
        the ledger cannot say: the run's own note says so)."""
        try:
            ledger = self._ledger()
            run = ledger.run(release, run_id) if ledger is not None else None
        except Exception:
            return False
        return run is not None and run.state in ("open", "measuring")

    def _ledger(self) -> Ledger | None:
        from dpdask.privacy import Ledger, ledger_exists

        return Ledger(self.ledger) if ledger_exists(self.ledger) else None

    def _dataset(self) -> str:
        from dpdask.pipeline.run import dataset_id

        draft = SessionPlan("identity", zCDP(1), self.geography.levels, "identity", None, None, {})
        return dataset_id(self._spec(self.spec_mapping(draft, "x", self._private / "x.zarr")))

    @property
    def dataset(self) -> str:
        """The dataset's id in the ledger (given, or the content hash of the input, as
        ``dpdask run`` names a dataset without ``data.id``)."""
        return self._dataset_id

    @property
    def spent(self) -> Spending:
        """What this session's runs and the dataset's releases have charged."""
        ledger = self._ledger()
        if ledger is None:
            return Spending(None, None)
        mine = [
            c.privacy
            for rel, run in self._runs
            for c in (ledger.charges(rel) if ledger.run(rel, run) else [])
            if c.run_id == run
        ]
        dataset = self.dataset
        releases = {c.release for c in ledger.charges()}
        theirs = [ledger.spent(r) for r in sorted(releases) if ledger.dataset(r) == dataset]
        return Spending(total(mine), total(theirs))

    @property
    def remaining(self) -> Spending:
        """What is left: of the session's cap and of the dataset's lifetime budget."""
        from dpdask.specs import parse_budget  # the one budget reader of every spec

        ledger = self._ledger()
        session = None
        if self.budget is not None:
            spent = self.spent.session if ledger is not None else None
            session = self.budget if spent is None else self.budget - spent
        dataset = ledger.dataset_remaining(self.dataset) if ledger is not None else None
        if dataset is None and self._lifetime is not None and ledger is None:
            dataset = parse_budget(self._lifetime, "dataset_budget")
        return Spending(session, dataset)

    # -- the cluster ------------------------------------------------------------------------
    @property
    def client(self) -> Client:
        """The Dask client releases run on: the one given, or one the session started
        (as ``dpdask run`` starts it) and closes with the session."""
        if self._client is None:
            from dpdask.pipeline.cluster import connect

            self._client = self._stack.enter_context(connect(self._cluster))
            self._started = True
        return self._client

    def close(self) -> None:
        """Close the cluster the session started and remove its private copy of the data
        (what was published, and the ledger, stay)."""
        self._stack.close()
        if self._started:
            self._client, self._started = None, False
        self._cleanup()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"Session(domain={self.domain}, levels={list(self.geography.levels)}, "
            f"ledger={str(self.ledger)!r}, releases={len(self._runs)})"
        )
