#!/usr/bin/env python3
"""Fits the rational functions of the fast kernels (src/kernels/cpu/vec_math.h).

--function erf (fast_erf):             erf(x) ~ x P(x^2) / Q(x^2)
--function gelu-grad (fast_gelu_grad): GELU'(x) - 1/2 = Phi(x) - 1/2 + x phi(x) ~ x P(x^2) / Q(x^2)

Both are odd, on [0, C] (beyond it the kernel clamps x to C), P with --p
coefficients (the first held at the function's slope at 0: 2/sqrt(pi), or
2/sqrt(2 pi), so that small x keep their relative accuracy), Q with --q (the
first 1). The maximum error is minimised by the differential-correction
method: each round solves the linear program

    minimise t  subject to  |x P(u) - f(x) Q(u)| <= t Q_prev(u)

over a dense grid (Chebyshev-clustered towards C), with Q_prev the previous
round's denominator, for 15 rounds (it settles in fewer). Prints the error in float64 and
in float32 arithmetic with fused multiply-adds (each step rounded once), then
the coefficients as float literals for vec_math.h.

Needs numpy and scipy (not needed by the build or the tests; run it only to
change an approximation). Usage:
    fit_erf.py                                                  (erf: 7, 5, 3.92)
    fit_erf.py --function gelu-grad --p 8 --q 6 --clamp 5.8    (GELU')
"""
import argparse
import math

import numpy as np
from scipy.optimize import linprog
from scipy.special import erf

FUNCTIONS = {
    # name: (f, f's slope at 0)
    "erf": (erf, 2.0 / math.sqrt(math.pi)),
    "gelu-grad": (lambda x: 0.5 * erf(x / math.sqrt(2.0)) + x * np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi),
                  2.0 / math.sqrt(2.0 * math.pi)),
}


def fit(target, slope, n_p, n_q, clamp, rounds=15):
    x = np.unique(np.concatenate([np.linspace(0, clamp, 8000), clamp * np.sin(np.linspace(0, np.pi / 2, 4000))]))
    u, f = x * x, target(x)
    q_prev = np.ones_like(x)
    for _ in range(rounds):
        # Unknowns p_1 .. p_{n_p - 1}, q_1 .. q_{n_q - 1}, t.
        a = np.hstack([x[:, None] * u[:, None] ** np.arange(1, n_p), -f[:, None] * u[:, None] ** np.arange(1, n_q)])
        b = f - x * slope
        n = a.shape[1]
        a_ub = np.vstack([np.hstack([a, -q_prev[:, None]]), np.hstack([-a, -q_prev[:, None]])])
        cost = np.zeros(n + 1)
        cost[-1] = 1
        r = linprog(cost, A_ub=a_ub, b_ub=np.concatenate([b, -b]), bounds=[(None, None)] * n + [(0, None)],
                    method="highs")
        if r.x is None:
            raise SystemExit(f"the linear program failed: {r.message}")
        p = np.concatenate([[slope], r.x[: n_p - 1]])
        q = np.concatenate([[1.0], r.x[n_p - 1 : n]])
        q_prev = np.polyval(q[::-1], u)
    err = np.max(np.abs(x * np.polyval(p[::-1], u) / q_prev - f))
    return p, q, err


def eval_float32(x, p, q, clamp):
    """x P(u) / Q(u) as the kernel computes it: float32, each multiply-add rounded once."""
    f64 = np.float64
    c = np.minimum(np.maximum(x.astype(np.float32), np.float32(-clamp)), np.float32(clamp))
    u = np.float32(f64(c) * f64(c))
    pp = np.float32(np.float32(p[-1]) * np.ones_like(c))
    for coef in p[-2::-1]:
        pp = np.float32(f64(pp) * f64(u) + f64(np.float32(coef)))
    qq = np.float32(np.float32(q[-1]) * np.ones_like(c))
    for coef in q[-2::-1]:
        qq = np.float32(f64(qq) * f64(u) + f64(np.float32(coef)))
    return np.float32(np.float32(c * pp) / qq)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--function", choices=sorted(FUNCTIONS), default="erf")
    ap.add_argument("--p", type=int, default=7, help="coefficients of P (in x^2)")
    ap.add_argument("--q", type=int, default=5, help="coefficients of Q (in x^2)")
    ap.add_argument("--clamp", type=float, default=3.92, help="|x| beyond which f(clamp) is returned")
    args = ap.parse_args()
    target, slope = FUNCTIONS[args.function]
    p, q, err = fit(target, slope, args.p, args.q, args.clamp)
    xs = np.linspace(-8, 8, 2_000_001).astype(np.float32)
    err32 = np.abs(eval_float32(xs, p, q, args.clamp).astype(np.float64) - target(xs.astype(np.float64)))
    print(f"max error: {err:.3g} in float64, {err32.max():.3g} in float32 with FMA (at x = {xs[err32.argmax()]:.4f})")
    print("P:", ", ".join(f"{c:.9e}f" for c in p))
    print("Q:", ", ".join(f"{c:.9e}f" for c in q))


if __name__ == "__main__":
    main()
