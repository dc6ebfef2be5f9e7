"""What an audit found (:class:`AuditResult`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dpdask.privacy import Budget

__all__ = ["AuditResult"]


@dataclass
class AuditResult:
    """What an audit found (:meth:`to_dict` for the JSON form).

    Attributes
    ----------
    claim : Budget
        The claimed budget of the release.
    mechanism : str
        Its noise.
    delta : float
        The delta of the comparison.
    claimed_epsilon : float
        The epsilon the claim gives at ``delta``.
    lower_bound, control_lower_bound : float
        Lower confidence bounds on the epsilon at ``delta`` of the release and of the
        positive control (the same release with half the noise).
    confidence : float
        Joint confidence of each lower bound.
    trials : int
        Trials per dataset (``D`` and ``D'``), for the release and for the control each.
    max_excess : float
        The release's largest ``lower bound - claimed epsilon`` over the deltas tried
        (positive: the release is caught spending more than it claims).
    claimed_rho, rho_lower_bound, control_rho_lower_bound : float or None
        For zCDP claims.
    details : dict
        Everything else (statistic, events, geography, timings, epsilon by delta).
    """

    claim: Budget
    mechanism: str
    delta: float
    claimed_epsilon: float
    lower_bound: float
    control_lower_bound: float
    confidence: float
    trials: int
    max_excess: float
    claimed_rho: float | None = None
    rho_lower_bound: float | None = None
    control_rho_lower_bound: float | None = None
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def flagged(self) -> bool:
        """Whether the release is caught exceeding its claim."""
        rho = (
            self.claimed_rho is not None
            and self.rho_lower_bound is not None
            and self.rho_lower_bound > self.claimed_rho
        )
        return self.max_excess > 0 or rho

    @property
    def control_flagged(self) -> bool:
        """Whether the positive control is caught (the audit has the power it needs)."""
        return self.control_lower_bound > self.claimed_epsilon

    def report(self) -> str:
        """A short text report (what ``dpdask audit`` prints without ``--json``)."""
        d = self.details
        verdict = "EXCEEDS its claim" if self.flagged else "within its claim"
        power = "flagged" if self.control_flagged else "NOT flagged (too few trials)"
        lines = [
            f"audit of {d.get('release', 'the release')}: claim {self.claim!r} "
            f"({self.mechanism} noise), {self.trials} trials per dataset, "
            f"levels {d.get('levels')}",
            f"at delta={self.delta:g}: claimed epsilon {self.claimed_epsilon:.4g}",
            f"  release: {self.confidence:.0%} lower bound {self.lower_bound:.4g} -> {verdict}",
            f"  control (half the noise): lower bound {self.control_lower_bound:.4g} -> {power}",
        ]
        if self.claimed_rho is not None:
            lines.append(
                f"rho: claimed {self.claimed_rho:.4g}, lower bounds {self.rho_lower_bound:.4g} "
                f"(release), {self.control_rho_lower_bound:.4g} (control)"
            )
        if "seconds" in d:
            lines.append(f"{d['releases']} releases in {d['seconds']['total']:.1f} s")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe dict."""
        out: dict[str, Any] = {
            "claim": self.claim.to_dict(),
            "mechanism": self.mechanism,
            "delta": self.delta,
            "claimed_epsilon": self.claimed_epsilon,
            "lower_bound": self.lower_bound,
            "control_lower_bound": self.control_lower_bound,
            "confidence": self.confidence,
            "trials": self.trials,
            "flagged": self.flagged,
            "control_flagged": self.control_flagged,
            "max_excess": self.max_excess,
        }
        if self.claimed_rho is not None:
            out["claimed_rho"] = self.claimed_rho
            out["rho_lower_bound"] = self.rho_lower_bound
            out["control_rho_lower_bound"] = self.control_rho_lower_bound
        out.update(self.details)
        return out
