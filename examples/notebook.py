# %% [markdown]
# # A three-level release from a pandas DataFrame
#
# Person records in memory (one row per person: a tract GEOID, sex, an age group and
# Hispanic origin), released as state, county and tract tables of all two-way
# marginals under zCDP, with margins of error. `dpdask.Session` charges the ledger,
# keeps the run's key and publishes exactly as `dpdask run` does with the equivalent
# release spec.
#
# Run it as a script (`python examples/notebook.py [FOLDER [RUN_ID]]`) or cell by cell
# in an editor that reads `# %%` cells. The records are generated (test data, seeded).

# %%
from __future__ import annotations

import sys

import numpy as np
import pandas as pd

import dpdask
from dpdask.privacy import zCDP

LEVELS = {"state": 2, "county": 5, "tract": 11}  # GEOID prefix lengths


def tracts() -> list[str]:
    """The public universe: 2 states, 3 counties each, 4 tracts per county."""
    return [
        f"{s:02d}{c:03d}{t:06d}" for s in (1, 2) for c in (1, 3, 5) for t in (100, 200, 300, 400)
    ]


def people(n: int = 3000, seed: int = 0) -> pd.DataFrame:
    """Generated person records; the last tract is declared but nobody lives there."""
    rng = np.random.default_rng(seed)
    where = rng.choice(tracts()[:-1], size=n)
    return pd.DataFrame(
        {
            "geoid": where,
            "sex": pd.Categorical.from_codes(rng.integers(0, 2, n), ["female", "male"]),
            "agegroup": rng.integers(0, 4, n),  # integer codes: its size is declared below
            "hispanic": pd.Categorical.from_codes(
                (rng.random(n) < 0.2).astype(int), ["not hispanic", "hispanic"]
            ),
        }
    )


# %% [markdown]
# ## Plan, release, and see the budget
#
# `plan` reads no data: it selects the strategy and reports the expected error per
# level. `release` charges the ledger, measures, reconstructs and publishes, then
# reads the release back as an `xarray.DataTree`.


# %%
def main(folder: str = "out/notebook", run_id: str | None = None) -> dpdask.Session:
    with dpdask.Session(
        people(), geography_column="geoid", geographies=tracts(), levels=LEVELS,
        domain={"agegroup": 4}, dataset="synthetic-people", dataset_budget=zCDP(4),
        folder=folder,
    ) as session:  # fmt: skip
        plan = session.plan({"name": "marginals", "k": 2}, zCDP(1))
        print("expected error per level:", plan.expected)
        tree = session.release(plan, "people-2026", run_id=run_id, progress=False)
        print("spent:", session.spent, "\nremaining:", session.remaining)

    tract = tree["tract"].ds
    print(tract.answers.sel(geography=tracts()[0]).values[:5])
    print("90% margin of error at tract level:", float(tract.moe90.max()))
    return session


# %%
if __name__ == "__main__":  # a local cluster's worker processes import this file
    main(*sys.argv[1:])
