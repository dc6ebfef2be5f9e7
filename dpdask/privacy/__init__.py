"""Privacy budgets, conversions and the persistent budget ledger.

Budgets (:class:`PureDP`, :class:`ApproxDP`, :class:`zCDP`) are exact values
(:class:`fractions.Fraction` parameters) that compose with ``+`` and split
exactly; calibration methods turn them into noise scales. :func:`split_levels`
splits a release budget over geography levels and :func:`noise_scale` calibrates
each level's noise: the one budget-to-noise path of plans and releases.
Conversions follow Bun and Steinke (2016), Canonne, Kamath and Steinke (2020) and
Balle and Wang (2018). :class:`Ledger` is the persistent, append-only record of
charges. Budgets are for add/remove-one-person neighbours;
:mod:`dpdask.privacy.neighbours` states the relation and converts to change-one.
"""

from dpdask.privacy._budget import ApproxDP, Budget, PureDP, as_fraction, parallel, zCDP
from dpdask.privacy._calibration import Calibration, calibrate, mechanism_for, noise_scale
from dpdask.privacy._chain import Head
from dpdask.privacy._convert import (
    gaussian_delta,
    gaussian_max_privacy_cost,
    zcdp_delta,
    zcdp_epsilon,
)
from dpdask.privacy._fits import (
    check_dataset_fits,
    check_lifetime_covers,
    check_release_opening,
)
from dpdask.privacy._ledger import (
    RUN_STATES,
    BudgetExceededError,
    Charge,
    Ledger,
    LedgerConflictError,
    LedgerError,
    LedgerMissingError,
    LedgerTamperedError,
    Run,
    RunBinding,
    RunStateError,
    check_binding,
    check_name,
    check_run_id,
)
from dpdask.privacy._levels import split_levels
from dpdask.privacy._mechanisms import MECHANISM_NORM, check_calibration, mechanism_guarantee
from dpdask.privacy._sources import bind_source, check_source, hold_dataset, source_dataset
from dpdask.privacy._store import is_server_url, ledger_exists, ledger_files, migrate_ledger
from dpdask.privacy._store import shown as ledger_shown
from dpdask.privacy.neighbours import ADD_REMOVE, CHANGE_ONE, Neighbours, as_neighbours

__all__ = [
    "ADD_REMOVE",
    "CHANGE_ONE",
    "MECHANISM_NORM",
    "RUN_STATES",
    "ApproxDP",
    "Budget",
    "BudgetExceededError",
    "Calibration",
    "Charge",
    "Head",
    "Ledger",
    "LedgerConflictError",
    "LedgerError",
    "LedgerMissingError",
    "LedgerTamperedError",
    "Neighbours",
    "PureDP",
    "Run",
    "RunBinding",
    "RunStateError",
    "as_fraction",
    "as_neighbours",
    "bind_source",
    "calibrate",
    "check_binding",
    "check_calibration",
    "check_dataset_fits",
    "check_lifetime_covers",
    "check_name",
    "check_release_opening",
    "check_run_id",
    "check_source",
    "gaussian_delta",
    "gaussian_max_privacy_cost",
    "hold_dataset",
    "is_server_url",
    "ledger_exists",
    "ledger_files",
    "ledger_shown",
    "mechanism_for",
    "mechanism_guarantee",
    "migrate_ledger",
    "noise_scale",
    "parallel",
    "source_dataset",
    "split_levels",
    "zCDP",
    "zcdp_delta",
    "zcdp_epsilon",
]
