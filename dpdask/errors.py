"""The errors and warnings dpdask raises, under one base users can catch.

Every error dpdask raises on purpose is a :class:`DPDaskError`. Each specific error
also derives from the built-in exception that described it before (most from
:class:`ValueError`), so ``except ValueError`` keeps working.

=====================  =======================================================
error                  raised when
=====================  =======================================================
``SpecError``          a release spec (or its sums / local-model part) is invalid
``DataError``          input counts are malformed: NaN, negative, wrong shape or
                       dtype, unknown categories, above a public bound;
                       ``DataTypeError`` when they are not an array of numbers;
                       ``GeographyUniverseError`` when person records declare no
                       public geography universe or fall outside it
``PlanError``          a plan, strategy or privacy parameter cannot be used;
                       ``BudgetTypeError`` when a budget is not a budget
``NoiseKeyError``      a secret key, key file or stream key is missing or wrong
``LedgerError``        the privacy ledger refuses (nothing was written); its
                       subclasses say why: missing, tampered, conflicting run,
                       budget exceeded, its storage failing (a full disk)
``OutputError``        an output path is unsafe, exists, or another run is
                       publishing to it (``OutputLockedError``)
``InterpreterError``   this Python cannot publish a release (``python -O``)
``ClusterError``       the named scheduler did not answer
``ConvergenceError``   an optimiser or estimator cannot produce a result
``ArgumentError``      a function got an argument it cannot use (a value out
                       of range, an unknown option); ``ArgumentTypeError``
                       when it is of the wrong type, ``ShapeError`` when
                       arrays or implicit matrices do not fit together,
                       ``DomainError`` for an attribute, category, level or
                       geography the domain does not have
=====================  =======================================================

Warnings derive from :class:`DPDaskWarning`; :class:`ConvergenceWarning` is
raised when an estimator stops at its iteration limit before its tolerance.
"""

from __future__ import annotations

__all__ = [
    "ArgumentError",
    "ArgumentTypeError",
    "BudgetExceededError",
    "BudgetTypeError",
    "ClusterUnreachableError",
    "ConvergenceError",
    "ConvergenceWarning",
    "DPDaskError",
    "DPDaskWarning",
    "DataError",
    "DataTypeError",
    "DomainError",
    "GeographyUniverseError",
    "InterpreterError",
    "LedgerConflictError",
    "LedgerError",
    "LedgerMissingError",
    "LedgerPermissionError",
    "LedgerServerError",
    "LedgerStorageError",
    "LedgerTamperedError",
    "NoiseKeyError",
    "OutputError",
    "OutputLockedError",
    "PlanError",
    "RunStateError",
    "ShapeError",
    "SpecError",
    "StoreExistsError",
    "UnsafeOutputError",
]


class DPDaskError(Exception):
    """Base of every error dpdask raises on purpose."""


class SpecError(DPDaskError, ValueError):
    """A release spec is invalid; the message names the field."""


class DataError(DPDaskError, ValueError):
    """Input counts are malformed; raised before anything is charged or written."""


class DataTypeError(DataError, TypeError):
    """Input counts are not a numeric array (raised as ``TypeError`` before)."""


class GeographyUniverseError(DataError):
    """Person records declare no public geography universe, or some fall outside it
    (the message gives counts, never the records' ids)."""


class PlanError(DPDaskError, ValueError):
    """A plan, strategy or privacy parameter cannot be used as given."""


class BudgetTypeError(PlanError, TypeError):
    """A privacy parameter is not a budget (raised as ``TypeError`` before)."""


class NoiseKeyError(DPDaskError, ValueError):
    """A secret key, key file or stream key is missing, malformed or not the one bound."""


class LedgerError(DPDaskError, ValueError):
    """Base of the ledger's errors: the ledger refuses, and nothing was written."""


class LedgerMissingError(LedgerError, FileNotFoundError):
    """There is no ledger at the path, and creating one was not asked for."""


class LedgerTamperedError(LedgerError):
    """The ledger is empty, corrupt, edited, truncated or rolled back."""


class LedgerStorageError(LedgerError, OSError):
    """The ledger's file system failed a read or write (a full disk, a read-only file,
    an I/O error): the ledger itself is intact, and the failed write was rolled back."""


class BudgetExceededError(LedgerError):
    """A charge would exceed a release's budget or a dataset's total."""


class LedgerConflictError(LedgerError):
    """A charge or registration contradicts what the ledger already holds."""


class RunStateError(LedgerConflictError):
    """A run id that is published, abandoned, or bound to another key."""


class LedgerServerError(LedgerError, ConnectionError):
    """The ledger's database server cannot be reached or refuses the login."""


class LedgerPermissionError(LedgerError, PermissionError):
    """The ledger's database role may not do this (an operator creating a dataset,
    abandoning a run or editing entries)."""


class OutputError(DPDaskError, ValueError):
    """An output path cannot be written safely."""


class StoreExistsError(OutputError, FileExistsError):
    """The output path exists and replacing it was not asked for."""


class UnsafeOutputError(OutputError):
    """The output path would overwrite or sit inside something that is not a release."""


class OutputLockedError(OutputError):
    """Another run holds the output's lock: it is publishing there now."""


class InterpreterError(DPDaskError, RuntimeError):
    """This Python cannot publish a release (``python -O``); refused before any charge."""


class ClusterUnreachableError(DPDaskError, ConnectionError, ValueError):
    """The scheduler named by a spec, ``--scheduler`` or the environment did not answer."""


class ConvergenceError(DPDaskError, RuntimeError):
    """An optimiser or estimator cannot produce a usable result."""


class ArgumentError(DPDaskError, ValueError):
    """A function got an argument it cannot use: a value out of range, an unknown option."""


class ArgumentTypeError(ArgumentError, TypeError):
    """A function got an argument of a type it cannot use."""


class ShapeError(ArgumentError):
    """Arrays or implicit matrices whose shapes do not fit together."""


class DomainError(ArgumentError):
    """An attribute, category, level or geography the domain does not have."""


class DPDaskWarning(UserWarning):
    """Base class of the warnings dpdask emits (errors in dpdask's own tests)."""


class ConvergenceWarning(DPDaskWarning):
    """An estimator or optimiser stopped at its iteration limit before its tolerance."""
