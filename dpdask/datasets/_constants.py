"""Numbers behind the synthetic person model: counts read once from public data, and assumptions.

Nothing here is read at run time; the counts were copied once from the files named
below (``tests/system/test_datasets.py`` recomputes them from ``../shared/data`` when it is
present). Everything that is *not* read from a file is marked ASSUMED and is a
rounded, documented modelling choice.

Race and ethnicity: Rhode Island 2010 blocks
    File ``ri_2010_blocks/ri_2010_block.csv`` (25,181 blocks) from the ALARM
    Project's ``alarm-redist/census-2020`` data, licensed CC BY-SA 4.0
    (https://creativecommons.org/licenses/by-sa/4.0/); attribution: "ALARM Project,
    census-2020, https://github.com/alarm-redist/census-2020", derived from the
    2010 Census (public domain). The columns ``pop_hisp`` (Hispanic, any race),
    ``pop_white``, ``pop_black``, ``pop_aian``, ``pop_asian``, ``pop_nhpi``,
    ``pop_other`` (non-Hispanic, one race) and ``pop_two`` (non-Hispanic, two or
    more races) sum exactly to ``pop``; the ``vap_*`` columns are the same groups
    aged 18 and over. :data:`RI_2010_POP` and :data:`RI_2010_VAP` are the state
    sums of these columns. They give the Hispanic share, the race shares and each
    group's share under 18.

Race detail within a group: Providence County, 2018 End-to-End Census Test
    The RI file does not split Hispanics by race nor the non-Hispanic "two or more
    races" group into its 57 combinations. Those splits come from the P.L. 94-171
    file of the 2018 End-to-End Census Test, Providence County (summary level 050,
    LOGRECNO 2), segment 1 (``pl94_2018e2e_providence/ri000012018_2020Style.pl``),
    tables P1 (race, 63 combinations) and P2 (Hispanic or Latino, and not, by race),
    Census data in the public domain, distributed with the PL94171 R package (MIT).
    :data:`PROVIDENCE_2018_NOT_HISPANIC_RACE` is P2's non-Hispanic block and
    :data:`PROVIDENCE_2018_HISPANIC_RACE` is P1 minus it, both over the 63
    combinations in Census order (:func:`dpdask.census.race_combinations`).
    The test's published counts carry disclosure-avoidance noise, so small cells
    are unreliable; the model adds :data:`RACE_PSEUDO_COUNT` to every cell so that
    every combination has positive probability.
"""

from __future__ import annotations

# -- Rhode Island 2010 blocks (CC BY-SA 4.0, ALARM Project) ---------------------------
# Group name -> state sum of the column ``pop_<group>`` (resp. ``vap_<group>``).
RI_2010_POP: dict[str, int] = {
    "hisp": 130_655,
    "white": 803_685,
    "black": 51_560,
    "aian": 4_020,
    "asian": 29_988,
    "nhpi": 305,
    "other": 8_875,
    "two": 23_479,
}
"""Rhode Island 2010 population by Hispanic origin / non-Hispanic race group (sum 1,052,567)."""

RI_2010_VAP: dict[str, int] = {
    "hisp": 84_715,
    "white": 660_823,
    "black": 37_225,
    "aian": 2_933,
    "asian": 23_257,
    "nhpi": 240,
    "other": 6_401,
    "two": 13_017,
}
"""Rhode Island 2010 voting-age (18+) population by the same groups (sum 828,611)."""

RI_2010_TOTAL = 1_052_567
"""Rhode Island 2010 total population (the documented state total)."""

# -- Providence County, 2018 End-to-End Census Test, P.L. 94-171 P1/P2 (public domain) --
PROVIDENCE_2018_HISPANIC_RACE: tuple[int, ...] = (
    # one race: white, black, aian, asian, nhpi, other
    33033, 6953, 2475, 628, 551, 67427,
    # two races (15)
    884, 615, 150, 41, 15421, 88, 10, 0, 2524, 133, 70, 324, 0, 318, 534,
    # three races (20)
    141, 0, 0, 673, 0, 156, 23, 0, 132, 0, 33, 0, 0, 84, 34, 0, 6, 52, 0, 8,
    # four races (15)
    0, 23, 290, 55, 0, 146, 143, 19, 111, 115, 0, 0, 55, 7, 0,
    # five races (6), six races (1)
    0, 138, 45, 30, 0, 53, 98,
)  # fmt: skip
"""Hispanic persons of Providence County (2018 test) by the 63 race combinations (sum 134,849)."""

PROVIDENCE_2018_NOT_HISPANIC_RACE: tuple[int, ...] = (
    377345, 42636, 1794, 23517, 449, 9599,
    3967, 3781, 2463, 143, 3611, 728, 154, 0, 5766, 14, 0, 114, 65, 38, 0,
    508, 128, 199, 732, 0, 62, 50, 143, 30, 0, 27, 0, 140, 0, 13, 6, 4, 0, 0, 36,
    0, 86, 120, 0, 159, 0, 0, 29, 0, 0, 12, 0, 96, 0, 0,
    7, 75, 188, 121, 30, 19, 0,
)  # fmt: skip
"""Non-Hispanic persons of Providence County (2018 test) by the 63 combinations (sum 479,204)."""

RACE_PSEUDO_COUNT = 0.5
"""ASSUMED: added to every Providence cell before normalising, so no combination is impossible."""

# -- Relationship to householder (ASSUMED) ----------------------------------------------
RELATION_SHARES: tuple[float, ...] = (
    0.378,  # 0 householder
    0.183,  # 1 husband or wife
    0.273,  # 2 biological son or daughter
    0.007,  # 3 adopted son or daughter
    0.013,  # 4 stepson or stepdaughter
    0.010,  # 5 brother or sister
    0.008,  # 6 father or mother
    0.020,  # 7 grandchild
    0.004,  # 8 parent-in-law
    0.004,  # 9 son-in-law or daughter-in-law
    0.014,  # 10 other relative
    0.006,  # 11 roomer or boarder
    0.015,  # 12 housemate or roommate
    0.025,  # 13 unmarried partner
    0.001,  # 14 foster child
    0.013,  # 15 other nonrelative
    0.026,  # 16 in group quarters
)
"""ASSUMED share of each relationship category (coding of :mod:`dpdask.census`).

Rounded to resemble the 2010 Census household-relationship shares of the US
population (householders 37.8 %, spouses 18.3 %, children of the householder about
29 %, group quarters 2.6 %); not read from a file. The shares sum to 1.
"""

# -- Age pyramid (ASSUMED shape) --------------------------------------------------------
# Cohort size at age a is proportional to
#   survival(a) * exp(-GROWTH * a) * (1 + BOOM_HEIGHT * bump(a; BOOM_AGE, BOOM_WIDTH)
#                                       - DEPRESSION_DEPTH * bump(a; DEPRESSION_AGE, ...))
# with Gompertz-Makeham survival exp(-(A a + B/G (exp(G a) - 1))). These give a
# 2010-like US pyramid: 13 % aged 65+, 1.9 % aged 85+, a baby-boom bulge at 45-64,
# and about 1e-9 at age 114. The under-18 share is then set per race group from
# the RI voting-age counts above.
MAKEHAM_A = 5e-4
GOMPERTZ_B = 3e-5
GOMPERTZ_G = 0.095
GROWTH = 0.008
BOOM_AGE, BOOM_WIDTH, BOOM_HEIGHT = 52.0, 7.0, 0.25
DEPRESSION_AGE, DEPRESSION_WIDTH, DEPRESSION_DEPTH = 75.0, 5.0, 0.12
ADULT_AGE = 18

# -- Sex ratio (ASSUMED) ------------------------------------------------------------------
# Share of males at a given age, linearly interpolated between these points: 105 boys
# per 100 girls at birth, parity near 40, then the widening female majority of old
# age (rounded from 2010 US sex ratios by age).
MALE_SHARE_BY_AGE: tuple[tuple[float, float], ...] = (
    (0, 0.512),
    (20, 0.508),
    (40, 0.500),
    (55, 0.488),
    (67, 0.474),
    (77, 0.444),
    (82, 0.410),
    (87, 0.360),
    (92, 0.290),
    (97, 0.230),
    (102, 0.170),
    (114, 0.100),
)

# -- Geography sizes (ASSUMED) ------------------------------------------------------------
# Lognormal county populations like the 3,143 US counties: median 25,000 and
# log-sd 1.66 (mean about 100,000); capped at POPULATION_CAP times the median
# (10 million at the default, about Los Angeles County).
POPULATION_MEDIAN = 25_000.0
POPULATION_SIGMA = 1.66
POPULATION_CAP = 400.0

# -- Variation between geographies (ASSUMED) ----------------------------------------------
# Each geography's mix of the eight RI groups is Dirichlet with mean the RI shares and
# this concentration: the Hispanic share then has a standard deviation of about 0.1
# across geographies, as across US counties.
CONCENTRATION = 10.0
