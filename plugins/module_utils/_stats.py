# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Statistics of the benchmark and the canary judge, in plain Python (no numpy or scipy on a host or
the controller).

Private to this collection: no compatibility promise.

- ``percentile`` / ``mean`` / ``median`` / ``pstdev``: as numpy's defaults (linear interpolation,
  population standard deviation), which is what SGLang's bench_serving reports.
- ``mann_whitney``: the two-sided Wilcoxon-Mann-Whitney rank-sum test and the Hodges-Lehmann shift
  with its confidence interval, as R's ``wilcox.test(x, y, conf.int=TRUE)`` computes them: exact
  (the null distribution of U counted, no ties, both samples under 50) or asymptotic (normal
  approximation with tie and continuity corrections; the interval by root-finding on the corrected
  z with R's own zeroin, as Kayenta's MannWhitney does).
"""
from __future__ import annotations

import math

try:
    from statistics import NormalDist
except ImportError:  # Python < 3.8 on a managed host: only the asymptotic interval needs it
    NormalDist = None

_EPSILON = 2.220446049250313e-16  # DBL_EPSILON, as R's C code uses it
EXACT_LIMIT = 50  # R: exact when both samples are smaller than this and there are no ties


def mean(values):
    values = list(values)
    return math.fsum(values) / len(values) if values else None


def percentile(values, pct):
    """numpy.percentile's default (linear interpolation between closest ranks); None for no values."""
    ordered = sorted(values)
    if not ordered:
        return None
    if len(ordered) == 1:
        return float(ordered[0])
    rank = (len(ordered) - 1) * (float(pct) / 100.0)
    low = int(math.floor(rank))
    high = min(low + 1, len(ordered) - 1)
    return float(ordered[low] + (ordered[high] - ordered[low]) * (rank - low))


def median(values):
    return percentile(values, 50)


def pstdev(values):
    """Population standard deviation (numpy.std's default, ddof=0); None for no values."""
    values = list(values)
    if not values:
        return None
    centre = mean(values)
    return math.sqrt(math.fsum((v - centre) ** 2 for v in values) / len(values))


# ------------------------------------------------------------------------------------------ ranks

def average_ranks(values):
    """1-based ranks, ties sharing the average of their positions, and the sizes of the tie groups."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    ties = []
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        rank = (start + end) / 2.0 + 1.0
        for position in range(start, end + 1):
            ranks[order[position]] = rank
        if end > start:
            ties.append(end - start + 1)
        start = end + 1
    return ranks, ties


def u_statistics(x, y):
    """(U1, U2, tie sizes): U1 counts the pairs where x beats y (ties count one half)."""
    ranks, ties = average_ranks(list(x) + list(y))
    n1, n2 = len(x), len(y)
    u1 = math.fsum(ranks[:n1]) - n1 * (n1 + 1) / 2.0
    return u1, n1 * n2 - u1, ties


# -------------------------------------------------------------------------- exact distribution

_COUNTS = {}


def u_counts(m, n):
    """How many of the C(m+n, m) orderings give U = 0 .. m*n (no ties): the coefficients of the
    Gaussian binomial [m+n choose m] in q, built as the product of (1 - q^(n+i)) / (1 - q^i)."""
    key = (min(m, n), max(m, n))
    if key in _COUNTS:
        return _COUNTS[key]
    m, n = key
    top = m * n
    counts = [1] + [0] * top
    for i in range(1, m + 1):
        step = n + i
        for k in range(top, step - 1, -1):  # times (1 - q^(n+i))
            counts[k] -= counts[k - step]
        for k in range(i, top + 1):  # divided by (1 - q^i)
            counts[k] += counts[k - i]
    _COUNTS[key] = counts
    return counts


def exact_cdf(u, m, n):
    """P(U <= u) under the null hypothesis, no ties."""
    if u < 0:
        return 0.0
    counts = u_counts(m, n)
    return sum(counts[:min(int(math.floor(u)), m * n) + 1]) / _comb(m + n, m)


def _comb(total, chosen):
    result = 1
    for i in range(1, chosen + 1):
        result = result * (total - chosen + i) // i
    return result


def exact_quantile(p, m, n):
    """R's qwilcox: the least q with P(U <= q) >= p."""
    counts = u_counts(m, n)
    total = _comb(m + n, m)
    wanted = p - 10 * _EPSILON  # R's fuzz against rounding
    running = 0
    for q, count in enumerate(counts):
        running += count
        if running / total >= wanted:
            return q
    return m * n


def critical_u(m, n, alpha=0.05):
    """The largest U with a two-sided exact p <= alpha (None when no U is that rare)."""
    best = None
    for u in range(m * n + 1):
        if 2.0 * exact_cdf(u, m, n) <= alpha:
            best = u
        else:
            break
    return best


def smallest_p(m, n):
    """The smallest two-sided p-value samples of these sizes can reach (exact, no ties)."""
    if m < 1 or n < 1:
        return 1.0
    return min(1.0, 2.0 / _comb(m + n, m))


# ----------------------------------------------------------------------------- root finding


def zeroin(func, lower, upper, f_lower, f_upper, tol=1e-4, maxit=1000):
    """Brent's root finder as R's R_zeroin2 (uniroot): same steps, so the same answer as R."""
    a, b = lower, upper
    fa, fb = f_lower, f_upper
    c, fc = a, fa
    if fa == 0.0:
        return a
    if fb == 0.0:
        return b
    for dummy in range(maxit + 1):
        prev_step = b - a
        if abs(fc) < abs(fb):
            a, b, c = b, c, b
            fa, fb, fc = fb, fc, fb
        tol_act = 2 * _EPSILON * abs(b) + tol / 2
        new_step = (c - b) / 2
        if abs(new_step) <= tol_act or fb == 0.0:
            return b
        if abs(prev_step) >= tol_act and abs(fa) > abs(fb):
            cb = c - b
            if a == c:
                t1 = fb / fa
                p = cb * t1
                q = 1.0 - t1
            else:
                q = fa / fc
                t1 = fb / fc
                t2 = fb / fa
                p = t2 * (cb * q * (q - t1) - (b - a) * (t1 - 1.0))
                q = (q - 1.0) * (t1 - 1.0) * (t2 - 1.0)
            if p > 0:
                q = -q
            else:
                p = -p
            if p < (0.75 * cb * q - abs(tol_act * q) / 2) and p < abs(prev_step * q / 2):
                new_step = p / q
        if abs(new_step) < tol_act:
            new_step = tol_act if new_step > 0 else -tol_act
        a, fa = b, fb
        b += new_step
        fb = func(b)
        if (fb > 0 and fc > 0) or (fb < 0 and fc < 0):
            c, fc = a, fa
    return b


# ---------------------------------------------------------------------------- the test itself

class MannWhitney(object):
    """The outcome of ``mann_whitney(x, y)``: x is the canary, y the baseline; shift = x - y."""

    def __init__(self, **fields):
        self.n1 = fields["n1"]
        self.n2 = fields["n2"]
        self.u1 = fields["u1"]
        self.u2 = fields["u2"]
        self.p_value = fields["p_value"]
        self.method = fields["method"]  # exact | asymptotic
        self.z = fields.get("z")
        self.ties = fields.get("ties", False)
        self.shift = fields.get("shift")
        self.ci = fields.get("ci")  # (low, high) or None
        self.confidence = fields.get("confidence")

    def as_dict(self):
        return {"n1": self.n1, "n2": self.n2, "u1": self.u1, "u2": self.u2, "p_value": self.p_value,
                "method": self.method, "z": self.z, "ties": self.ties, "shift": self.shift,
                "ci": list(self.ci) if self.ci else None, "confidence": self.confidence}


class StatsError(ValueError):
    pass


def _normal_quantile(p):
    if NormalDist is None:
        raise StatsError("the asymptotic interval needs Python 3.8+ (statistics.NormalDist)")
    return NormalDist().inv_cdf(p)


def tie_variance(n1, n2, ties):
    """Var(U) under the null hypothesis with the tie correction."""
    total = n1 + n2
    correction = math.fsum(t ** 3 - t for t in ties) / (total * (total - 1)) if total > 1 else 0.0
    return n1 * n2 / 12.0 * ((total + 1) - correction)


def asymptotic_p(u1, n1, n2, ties, continuity=True):
    """(z, two-sided p) by the normal approximation."""
    centre = n1 * n2 / 2.0
    variance = tie_variance(n1, n2, ties)
    if variance <= 0:
        return 0.0, 1.0
    delta = u1 - centre
    correction = (0.5 if delta > 0 else -0.5 if delta < 0 else 0.0) if continuity else 0.0
    z = (delta - correction) / math.sqrt(variance)
    return z, min(1.0, math.erfc(abs(z) / math.sqrt(2.0)))


def mann_whitney(x, y, method="auto", continuity=True, confidence=0.95, conf_int=True):
    """Two-sided rank-sum test of x against y, Hodges-Lehmann shift of x - y and its interval.

    method: ``auto`` (exact when there are no ties and both samples have fewer than 50 values, as
    R), ``exact`` or ``asymptotic``. Raises StatsError when a sample is empty.
    """
    x = [float(v) for v in x]
    y = [float(v) for v in y]
    n1, n2 = len(x), len(y)
    if not n1 or not n2:
        raise StatsError("both samples need values (got %d and %d)" % (n1, n2))
    u1, u2, ties = u_statistics(x, y)
    if method == "auto":
        method = "exact" if not ties and n1 < EXACT_LIMIT and n2 < EXACT_LIMIT else "asymptotic"
    if method == "exact" and ties:
        raise StatsError("the exact test needs samples without ties")
    z = None
    if method == "exact":
        p_value = min(1.0, 2.0 * exact_cdf(min(u1, u2), n1, n2))
    else:
        z, p_value = asymptotic_p(u1, n1, n2, ties, continuity)
    result = MannWhitney(n1=n1, n2=n2, u1=u1, u2=u2, p_value=p_value, method=method, z=z, ties=bool(ties),
                         confidence=confidence if conf_int else None)
    if conf_int:
        if method == "exact":
            result.shift, result.ci = _exact_interval(x, y, confidence)
        else:
            result.shift, result.ci = _asymptotic_interval(x, y, confidence, continuity)
    return result


def _exact_interval(x, y, confidence):
    """R: the sorted pairwise differences at qwilcox(alpha/2) and n1*n2 - that + 1 (1-based);
    the estimate is their median."""
    n1, n2 = len(x), len(y)
    diffs = sorted(a - b for a in x for b in y)
    alpha = 1.0 - confidence
    qu = exact_quantile(alpha / 2.0, n1, n2)
    if qu == 0:
        qu = 1
    ql = n1 * n2 - qu
    return median(diffs), (diffs[qu - 1], diffs[ql])


def _asymptotic_interval(x, y, confidence, continuity):
    """R: roots of the corrected z of x - d against y, at the normal quantiles (endpoints when the
    root is outside the range of the differences); the estimate is the root at z = 0, without the
    continuity correction (R >= 4.0)."""
    n1, n2 = len(x), len(y)
    low_end = min(x) - max(y)
    high_end = max(x) - min(y)

    def corrected_z(d, quantile, correct):
        ranks, ties = average_ranks([v - d for v in x] + y)
        dz = math.fsum(ranks[:n1]) - n1 * (n1 + 1) / 2.0 - n1 * n2 / 2.0
        correction = (0.5 if dz > 0 else -0.5 if dz < 0 else 0.0) if correct else 0.0
        sigma = math.sqrt(tie_variance(n1, n2, ties))
        if sigma == 0:
            raise StatsError("cannot compute a confidence interval when all observations are tied")
        return (dz - correction) / sigma - quantile

    def root(quantile, correct, clamp=True):
        f_lower = corrected_z(low_end, quantile, correct)
        f_upper = corrected_z(high_end, quantile, correct)
        if clamp and f_lower <= 0:
            return low_end
        if clamp and f_upper >= 0:
            return high_end
        if f_lower * f_upper > 0:
            return low_end if abs(f_lower) < abs(f_upper) else high_end
        return zeroin(lambda d: corrected_z(d, quantile, correct), low_end, high_end, f_lower, f_upper)

    alpha = 1.0 - confidence
    if low_end == high_end:
        return low_end, (low_end, high_end)
    low = root(_normal_quantile(1.0 - alpha / 2.0), continuity)
    high = root(_normal_quantile(alpha / 2.0), continuity)
    estimate = root(0.0, False, clamp=False)
    return estimate, (low, high)
