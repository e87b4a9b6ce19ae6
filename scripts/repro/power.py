"""How many seeds a comparison needs: the power of a paired two-sided t-test at alpha 0.05 on
per-seed differences with the pilot's standard deviation, for the effect to detect (the paper's
or the pilot's), from the noncentral t distribution (``scipy.stats.nct``); the smallest number
of seeds with power >= 0.8, capped at the registered ceiling (issue 40, item 4).

    python -m scripts.repro.power --sd 0.04 --effect 0.05              # prints the seeds
    python -m scripts.repro.power --sd 0.04 --effect 0.05 --ceiling 10

A result at the ceiling whose power is still below the target means "not testable at this
scale" (the registered verdict): ``seeds_needed`` says so in ``reached``.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from dataclasses import dataclass

from scipy import stats

ALPHA = 0.05
POWER = 0.8
CEILING = 20  # the registered ceiling on seeds when a paper names none


def paired_t_power(n: int, effect: float, sd: float, alpha: float = ALPHA) -> float:
    """The power of the two-sided paired t-test on ``n`` seeds at level ``alpha`` when the
    per-seed differences have mean ``effect`` and standard deviation ``sd``."""
    if n < 2:
        return 0.0
    if sd <= 0:
        return 1.0 if effect != 0 else alpha
    df = n - 1
    crit = stats.t.ppf(1 - alpha / 2, df)
    nc = abs(effect) / sd * math.sqrt(n)
    exact = float(stats.nct.sf(crit, df, nc) + stats.nct.cdf(-crit, df, nc))
    if math.isfinite(exact):
        return exact
    # scipy's noncentral t gives NaN far in its tail (a large nc on few df, e.g. 9.4 on 2):
    # integrate over the variance estimate V ~ chi2(df) instead, with s = sqrt(V / df):
    # P(|T| > crit) = E_V[Phi(nc - crit s) + Phi(-nc - crit s)]
    from scipy import integrate

    def rejects(v: float) -> float:
        s = math.sqrt(v / df)
        both = stats.norm.cdf(nc - crit * s) + stats.norm.cdf(-nc - crit * s)
        return float(both * stats.chi2.pdf(v, df))

    return float(integrate.quad(rejects, 0.0, math.inf)[0])


@dataclass(frozen=True)
class SeedsNeeded:
    """``seeds``: the smallest n with power >= ``target`` (or the ceiling), ``power`` at it,
    ``reached``: whether the target was reached within the ceiling."""

    seeds: int
    power: float
    reached: bool


def seeds_needed(
    sd: float, effect: float, *, ceiling: int = CEILING, power: float = POWER,
    alpha: float = ALPHA,
) -> SeedsNeeded:  # fmt: skip
    """The number of seeds a paired two-sided t-test at ``alpha`` needs for ``power`` to detect
    a mean difference ``effect`` among per-seed differences of standard deviation ``sd``,
    capped at ``ceiling`` (``reached`` False there when the power is still short)."""
    if sd < 0 or ceiling < 2:
        raise ValueError(f"need sd >= 0 and ceiling >= 2, got sd={sd}, ceiling={ceiling}")
    if effect == 0:
        raise ValueError("an effect of 0 cannot be detected at any number of seeds")
    for n in range(2, ceiling + 1):
        achieved = paired_t_power(n, effect, sd, alpha)
        if achieved >= power:
            return SeedsNeeded(n, achieved, True)
    return SeedsNeeded(ceiling, paired_t_power(ceiling, effect, sd, alpha), False)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sd",
        type=float,
        required=True,
        help="standard deviation of the pilot's per-seed paired differences",
    )
    parser.add_argument(
        "--effect",
        type=float,
        required=True,
        help="the difference to detect (the paper's or the pilot's)",
    )
    parser.add_argument("--ceiling", type=int, default=CEILING,
                        help=f"the registered most seeds (default {CEILING})")  # fmt: skip
    opts = parser.parse_args(argv)
    result = seeds_needed(opts.sd, opts.effect, ceiling=opts.ceiling)
    print(result.seeds)
    if not result.reached:
        print(f"power {result.power:.2f} < {POWER} at the ceiling of {opts.ceiling} seeds: "
              "not testable at this scale")  # fmt: skip
    return result.seeds


if __name__ == "__main__":
    main()
