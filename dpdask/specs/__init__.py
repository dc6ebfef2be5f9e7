"""What every kind of spec shares: one strict YAML reader, one id rule, one budget parser.

Count (:mod:`dpdask.pipeline.spec`), local-model (:mod:`dpdask.ldp.local_spec`) and sum
(:mod:`dpdask.sums.sum_spec`) specs are read through this package, so that they refuse the
same things with the same one-line :class:`~dpdask.errors.SpecError` naming the field:

* :func:`read_spec` reads a spec file as *strict* YAML: at most :data:`MAX_SPEC_BYTES`,
  no duplicate key at any depth (the error names the key and its line), no anchors,
  aliases or merge keys (refused at the first one, before anything is expanded);
* :func:`check_id` is the one rule for release and dataset ids (a letter, then
  letters, digits, ``_``, ``.`` and ``-``: no path separator, no control or
  direction-override character);
* :func:`parse_budget` reads one budget of exactly one form (``zcdp`` / ``rho``,
  ``epsilon``, ``epsilon`` with ``delta``) inside the range where noise is meaningful;
* :func:`as_mapping` and :func:`check_keys` are the checks every part of a spec is read
  with;
* :func:`release_spec_schema` is the JSON Schema of every kind of spec shipped in the
  package (``release-spec.schema.json``), :func:`check_schema` checks a spec with it.
"""

from dpdask.specs._budget import BUDGET_FORMS, BUDGET_KEYS, parse_budget
from dpdask.specs._fields import ID_RULE, as_mapping, check_id, check_keys
from dpdask.specs._schema import SCHEMA_FILE, check_schema, release_spec_schema, schema_problems
from dpdask.specs._yaml import MAX_SPEC_BYTES, read_spec, spec_model

__all__ = [
    "BUDGET_FORMS",
    "BUDGET_KEYS",
    "ID_RULE",
    "MAX_SPEC_BYTES",
    "SCHEMA_FILE",
    "as_mapping",
    "check_id",
    "check_keys",
    "check_schema",
    "parse_budget",
    "read_spec",
    "release_spec_schema",
    "schema_problems",
    "spec_model",
]
