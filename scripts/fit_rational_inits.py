"""Fit the group-rational inits ("identity", "swish", "gelu") to the exact activations, under each safe-PAU
variant, and write them to ``warpkan/data/rational_inits.json``.

Each fit minimises the squared error of ``P(x) / Q(x)`` (the formula the kernels compute, variant "A" or
"B") against the exact function on a dense grid of [-3, 3] (KAT's fitting range), first by the linearised
problem ``P - f Q = 0`` and then by non-linear least squares (scipy) on the true variant. "identity" is
exact: ``P = x, Q = 1`` (zero denominator coefficients still learn: |b| is differentiated as sign(b) with
sign(0) = +1).

    python scripts/fit_rational_inits.py            # rewrite the JSON
    python scripts/fit_rational_inits.py --check    # refit and compare with the stored file
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np
from scipy.optimize import least_squares
from scipy.special import erf

ORDERS = [(5, 4), (4, 4), (3, 3)]
VARIANTS = ("A", "B")
LOW, HIGH = -3.0, 3.0
OUT = os.path.join(os.path.dirname(__file__), "..", "warpkan", "data", "rational_inits.json")

TARGETS = {
    "swish": lambda x: x / (1.0 + np.exp(-x)),
    "gelu": lambda x: 0.5 * x * (1.0 + erf(x / np.sqrt(2.0))),
}


def rational(x, a, b, variant):
    p = np.polyval(a[::-1], x)
    powers = np.stack([x ** (j + 1) for j in range(len(b))])
    if variant == "A":
        q = 1.0 + (np.abs(b)[:, None] * np.abs(powers)).sum(0)
    else:
        q = 1.0 + np.abs((b[:, None] * powers).sum(0))
    return p / q


def fit(target, m, n, variant, samples=2001):
    x = np.linspace(LOW, HIGH, samples)
    f = target(x)
    # linearised start: P(x) - f(x) (sum_j b_j x^j) = f(x)
    cols = [x**i for i in range(m + 1)] + [-f * x ** (j + 1) for j in range(n)]
    sol, *_ = np.linalg.lstsq(np.stack(cols, 1), f, rcond=None)
    best = None
    for start in (sol, np.concatenate([sol[: m + 1], np.abs(sol[m + 1 :])]), np.concatenate([sol[: m + 1], 0.01 * np.ones(n)])):
        res = least_squares(
            lambda c: rational(x, c[: m + 1], c[m + 1 :], variant) - f, start, method="lm", xtol=1e-15, ftol=1e-15, gtol=1e-15, max_nfev=4000
        )
        err = np.abs(res.fun).max()
        if best is None or err < best[1]:
            best = (res.x, err)
    c, err = best
    return c[: m + 1], c[m + 1 :], float(err)


def fit_all():
    table = {"range": [LOW, HIGH], "inits": {}}
    for m, n in ORDERS:
        for variant in VARIANTS:
            key = f"{variant}_{m}_{n}"
            entry = {"identity": {"numerator": [0.0, 1.0] + [0.0] * (m - 1), "denominator": [0.0] * n, "max_abs_error": 0.0}}
            for name, target in TARGETS.items():
                a, b, err = fit(target, m, n, variant)
                entry[name] = {"numerator": a.tolist(), "denominator": b.tolist(), "max_abs_error": err}
                print(f"{key:10s} {name:6s} max |error| on [{LOW}, {HIGH}] = {err:.2e}")
            table["inits"][key] = entry
    return table


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="refit and compare with the stored file")
    args = parser.parse_args()
    table = fit_all()
    if args.check:
        with open(OUT) as fh:
            stored = json.load(fh)
        for key, entry in table["inits"].items():
            for name, fitted in entry.items():
                assert stored["inits"][key][name]["max_abs_error"] <= fitted["max_abs_error"] * 1.5 + 1e-9, (key, name)
        print("stored inits are as good as a refit")
        return
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as fh:
        json.dump(table, fh, indent=1)
    print("wrote", os.path.normpath(OUT))


if __name__ == "__main__":
    main()
