"""A Python session: plan and release from in-memory data, under the command line's rules.

=============================  ========================================================
name                           what
=============================  ========================================================
:class:`Session`               a dataset and a ledger: ``plan``, ``release``, ``spent``,
                               ``remaining``, on a Dask client it starts or is given
:class:`SessionPlan`           a plan selected without the data, with expected errors
:class:`Spending`              budget spent or left, the session's and the dataset's
=============================  ========================================================

Every release of a session is ``dpdask run`` of an equivalent release spec
(:func:`dpdask.pipeline.run.run_spec`), so it is charged, keyed and published exactly
as the command line would charge, key and publish it.
"""

from dpdask.session._session import Session, SessionPlan, Spending

__all__ = ["Session", "SessionPlan", "Spending"]
