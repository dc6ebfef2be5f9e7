"""An end-to-end privacy audit: a lower bound on epsilon from published releases.

The audit runs the real release path (:func:`dpdask.release` and
:meth:`~dpdask.graph.Release.to_zarr`: a fresh key from the operating system,
charged to a ledger, measured, reconstructed, made consistent, answered and published,
``test_mode=False``) on two neighbouring datasets ``D`` and ``D'`` that differ in one
person, many times, and turns the published outputs into a lower bound on the epsilon
the release actually gives. The bound is compared with the epsilon the release claims.
A *positive control* (the same release with half the noise, still claiming the
original budget) must be flagged, which shows that the audit has the power to catch a
release that spends more than it says.

What is run per trial
---------------------
The strategy is selected once (:func:`dpdask.pipeline.run.plan_spec`; selection does not
read the data, and privacy does not depend on it). A *trial* is one published release
of a small geography: the first unit of every released level above the finest, and
the first ``blocks`` units of the finest level below them (for the P.L. 94-171 file of
Providence County: the state, the county, the first tract, its first block group and
that block group's first two blocks), with the data's own counts (``D``) or those
counts plus one person in one cell of the first block (``D'``). To make thousands of
trials affordable, a *batch* of trials is one release of a store that holds ``2 x
batch`` disjoint copies of that small geography (copies ``0, 2, 4, ...`` hold ``D``,
copies ``1, 3, 5, ...`` hold ``D'``), each copy a separate tree with its own root. A
person is in one copy only, every unit is measured with its own keyed noise and
reconstruction and consistency never cross trees, so each copy's published output is
distributed exactly as the release of that copy on its own, and the copies are
independent trials (parallel composition). The copies of a batch share the batch's key
but draw disjoint noise streams of it. Every batch is a new release: a fresh key from the OS, a new
run charged to a ledger in a temporary folder, the whole graph run on the local
threaded scheduler and published to a temporary store, from which the estimates are
read back. Nothing is charged to any other ledger and nothing is kept.

The statistic and the bound
---------------------------
The person is put in the cell ``j`` where the strategy's column norm (L2 for Gaussian
noise, L1 for Laplace) is largest, that is where the sensitivity is attained. From the
published, consistent estimates ``xhat_l`` of the units containing the person's block
(one per released level ``l``) the audit computes

.. math::

   s = \\sum_l \\frac{1}{\\sigma_l^2} (G_l\\, \\hat x_l)_j ,\\qquad G_l = A_l^\\top A_l ,

with ``A_l`` the level's measured strategy and ``sigma_l^2`` its claimed noise variance
per measurement. For least squares over one strategy (the release model) this is the
likelihood-ratio statistic of the published output: the consistent estimates are the
best linear unbiased estimates of the tree, so ``s`` is Gaussian with variance equal
to its shift ``sum_l G_jj / sigma_l^2`` (``2 rho`` in units of the sensitivity), and
the test loses nothing against the measurements themselves. The audit standardises
``s`` with the *claimed* noise (so the control is tested as if it had the claimed noise:
the auditor is not told) and tests ``2m`` events fixed before any trial: ``z > t_k``
(likely under ``D'``) and ``z < mu - t_k`` (likely under ``D``), with ``t_k`` the upper
``p_k`` quantiles of the standard normal, ``p_k`` log-spaced from 1/2 to ``1/trials``.
For each event, Clopper-Pearson bounds at level ``(1 - confidence) / (4 m)`` (Bonferroni
over both probabilities of all ``2 m`` events) give a lower bound on the probability under
the dataset that favours it (``b``) and an upper bound under the other (``a``); with
probability at least ``confidence`` all of them hold at once, and then every
(epsilon, delta) the release satisfies has

.. math:: \\epsilon \\ge \\log\\frac{b - \\delta}{a} ,

for every delta at once. For a zCDP claim, Renyi divergences are bounded by data
processing too, ``rho >= D_alpha(Bern(b) || Bern(a)) / alpha`` for every ``alpha > 1``,
which gives a lower bound on rho (reported beside epsilon).

The delta
---------
A pure-DP claim is audited at ``delta = 0`` and an (epsilon, delta) claim at its delta.
A rho-zCDP claim implies ``(epsilon_rho(delta), delta)``-DP for every delta
(:func:`dpdask.privacy.zcdp_epsilon`); unless a delta is given, the audit reports at
the delta of :data:`DELTAS` where the positive control exceeds the claim most
(the real release's bound is reported at the same delta, and its largest excess over
the whole grid as ``max_excess``; the bounds hold for all deltas at once, so choosing
one after the trials costs no confidence). At small deltas (``1e-6``) the claimed
epsilon is dominated by the Gaussian's tail, which thousands of trials cannot reach:
a half-noise control is flagged there only with some ``10^5`` trials per dataset.
"""

from dpdask.testing.audit._bounds import (
    TailCounts,
    clopper_pearson,
    clopper_pearson_lower,
    clopper_pearson_upper,
    epsilon_lower_bound,
    rho_lower_bound,
    tail_counts,
    thresholds,
)
from dpdask.testing.audit._result import AuditResult
from dpdask.testing.audit._run import DELTAS, audit_release, audit_spec
from dpdask.testing.audit._trials import control_budget

__all__ = [
    "DELTAS",
    "AuditResult",
    "TailCounts",
    "audit_release",
    "audit_spec",
    "clopper_pearson",
    "clopper_pearson_lower",
    "clopper_pearson_upper",
    "control_budget",
    "epsilon_lower_bound",
    "rho_lower_bound",
    "tail_counts",
    "thresholds",
]
