"""The measure step: noisy answers to a plan's strategy on one geography chunk.

This is the only place dpdask reads sensitive data. For one chunk of
geographies ``x`` (shape ``(g, *domain.shape)``) it computes ``A x`` per
geography with the plan's implicit strategy ``A``, records the privacy charge in
the ledger, and adds noise of the plan's scale drawn from the keyed stream of the
measurement's identity.

Order of operations (each step raises before the next one runs):

1. the plan, key and identity are checked; a test-only key is refused unless
   ``test_mode=True``;
2. the noise calibration is checked against the plan's privacy
   (:func:`dpdask.privacy.check_calibration`);
3. the ledger is asked, read-only, whether the charge fits: an over-budget
   measurement is refused here, *before the data is read*;
4. the data is checked: dtype, shape against the domain, attribute names,
   NaN/inf, negative counts, integers where the mechanism needs them;
5. the charge is committed to the ledger and synced to disk;
6. ``A x`` is computed and the noise drawn and added.

A crash between 5 and 6 leaves the charge recorded; the retry with the same run
id finds it (no new charge) and draws the same noise, because the noise is a
function of the key and of ``(run id, identity)`` only: it is the stream
``KeyedRNG(key, {"run": run_id, "measurement": identity})``. A new run id is a new
charge and draws fresh noise (reusing noise on changed data would leak the change).

Keys stay on the client. ``key`` may be the release's :class:`~dpdask.noise.SecretKey`
or, on a worker, the :class:`~dpdask.noise.StreamKey` of exactly this measurement's
stream (:func:`stream_key`, made on the client): the noise is the same, and the
worker never holds the secret. Every charge carries the fingerprint of the key
(:meth:`~dpdask.noise.SecretKey.fingerprint`); a receipt charged for another key,
or (outside test mode) for no key, is refused before any data is read.

Parallel composition. A charge's identity is ``(release, run_id, level,
measurement)``, without the chunk: all chunks of a level are charged once. The
release dataflow calls :func:`charge_level` once per level and measurement
(before reading any data), then :func:`measure` for each chunk; ``measure``
finds the charge already recorded and adds nothing. On workers without access to
the ledger file, pass the :class:`~dpdask.privacy.Charge` that
:func:`charge_level` returned as ``ledger``; ``measure`` then checks that it
matches the plan and identity.

How the plan's noise is realised (integer noise, exactly or on a lattice of step
``2**-k``, and why floating-point evaluation cannot break the guarantee) is in the
notes of :mod:`dpdask.measure._lattice`.

Modules: :mod:`~dpdask.measure._checks` (the plan, the data, integer strategies),
:mod:`~dpdask.measure._lattice` (the noise realisation), :mod:`~dpdask.measure._charges`
(identities, stream keys, charges) and :mod:`~dpdask.measure._step` (the entry points).
"""

from dpdask.measure._charges import (
    MeasurementIdLike,
    charge_level,
    level_charge,
    stream_identity,
    stream_key,
)
from dpdask.measure._checks import MeasurePlan, has_integer_entries
from dpdask.measure._lattice import DEFAULT_MAX_TOTAL, Lattice, lattice, noise_mechanism
from dpdask.measure._step import measure, measurement_noise

__all__ = [
    "DEFAULT_MAX_TOTAL",
    "Lattice",
    "MeasurePlan",
    "MeasurementIdLike",
    "charge_level",
    "has_integer_entries",
    "lattice",
    "level_charge",
    "measure",
    "measurement_noise",
    "noise_mechanism",
    "stream_identity",
    "stream_key",
]
