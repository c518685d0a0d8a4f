# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The canary judge: is the canary slower than its baseline? A pure function over both sides' samples.

Private to this collection: no compatibility promise. docs/docsite/rst/canary.rst explains it for people.

Per metric, a relative threshold AND a significance test (Kayenta's judge, R's wilcox.test):

- the metric's value on each side (median of the per-request values, or of the per-round values),
  its relative change, and the Mann-Whitney test of the canary's samples against the baseline's with
  the Hodges-Lehmann interval of the shift (``confidence``, 95 % by default);
- regression: the interval lies wholly on the bad side of zero (significant) AND the change is past
  the metric's threshold in the bad direction;
- inconclusive: one side has no values, too few samples to ever be significant, a change past the
  threshold that is not significant, or an interval that reaches past twice the threshold on the bad
  side (too noisy: a regression of twice the tolerance cannot be ruled out);
- pass otherwise. A metric whose threshold is None is reported, not judged.

Samples: per request (all rounds pooled) for TTFT, TPOT and ITL; per round for the output
throughput, the accept length and the E2E p99 (a tail is a property of a round, not of a request).

Critical, whatever the statistics: failed requests on the canary while the baseline had none, and
an accept-length collapse (the canary's mean below ``accept_length_collapse`` times the
baseline's), are a regression outright. Failed requests on both sides make the analysis
inconclusive (the workload, a key or the network is wrong, not the settings).

Overall: regression if any metric or critical check says so, else inconclusive if any metric does,
else pass. Every inconclusive verdict says what to change.
"""
from __future__ import annotations

from ansible_collections.gpufleet.inference.plugins.module_utils import _stats

PASS = "pass"
REGRESSION = "regression"
INCONCLUSIVE = "inconclusive"
INFO = "info"  # reported, not judged (no threshold)
NOT_MEASURED = "not measured"  # neither side has values (e.g. no speculative decoding)

NOISE_LIMIT = 2.0  # an interval reaching past this many thresholds on the bad side is too noisy to pass

LOWER = "lower"    # lower is better (latencies)
HIGHER = "higher"  # higher is better (throughput, accept length)

DEFAULT_THRESHOLDS = {
    "max_throughput_drop": 0.05,
    "max_ttft_p50_increase": 0.10,
    "max_tpot_p50_increase": 0.05,
    "max_itl_p50_increase": None,
    "max_e2e_p99_increase": 0.10,
    "max_accept_length_drop": 0.05,
    "accept_length_collapse": 0.5,
    "max_canary_failed_requests": 0,
    "confidence": 0.95,
    "min_requests": 20,
}


class Metric(object):
    def __init__(self, key, label, unit, source, sample, statistic, better, threshold):
        self.key = key
        self.label = label
        self.unit = unit
        self.source = source          # "requests" or "rounds"
        self.sample = sample          # the key of the samples in a side's "requests" / "rounds"
        self.statistic = statistic    # "median" or "mean"
        self.better = better
        self.threshold = threshold    # the key in the thresholds


METRICS = (
    Metric("output_throughput", "output throughput", "tok/s", "rounds", "output_throughput", "median", HIGHER,
           "max_throughput_drop"),
    Metric("ttft_p50", "TTFT p50", "ms", "requests", "ttft_ms", "median", LOWER, "max_ttft_p50_increase"),
    Metric("tpot_p50", "TPOT p50", "ms", "requests", "tpot_ms", "median", LOWER, "max_tpot_p50_increase"),
    Metric("itl_p50", "ITL p50", "ms", "requests", "itl_ms", "median", LOWER, "max_itl_p50_increase"),
    Metric("e2e_p99", "E2E p99", "ms", "rounds", "p99_e2e_latency_ms", "median", LOWER, "max_e2e_p99_increase"),
    Metric("accept_length", "accept length", "tokens/step", "rounds", "accept_length", "mean", HIGHER,
           "max_accept_length_drop"),
)


class ThresholdError(ValueError):
    pass


def fraction(name, value):
    """A threshold given as 0.05 or "5%"; None (not judged) stays None."""
    if value is None:
        return None
    text = str(value).strip()
    try:
        number = float(text[:-1]) / 100.0 if text.endswith("%") else float(text)
    except ValueError:
        raise ThresholdError("threshold %s must be a fraction like 0.05 or a percentage like '5%%', got %r" % (name, value))
    if isinstance(value, bool) or not 0 <= number < 1:
        raise ThresholdError("threshold %s must be at least 0 and below 1 (100%%), got %r" % (name, value))
    return number


def check_thresholds(thresholds):
    """The thresholds with defaults filled in; unknown keys and bad values are refused."""
    given = dict(thresholds or {})
    unknown = sorted(set(given) - set(DEFAULT_THRESHOLDS))
    if unknown:
        raise ThresholdError("unknown threshold(s) %s; known: %s" % (", ".join(unknown), ", ".join(sorted(DEFAULT_THRESHOLDS))))
    merged = dict(DEFAULT_THRESHOLDS)
    merged.update(given)
    for metric in METRICS:
        merged[metric.threshold] = fraction(metric.threshold, merged[metric.threshold])
    merged["accept_length_collapse"] = fraction("accept_length_collapse", merged["accept_length_collapse"])
    confidence = fraction("confidence", merged["confidence"])
    if confidence is None or not 0.5 <= confidence < 1:
        raise ThresholdError("confidence must be between 0.5 and 1 (like 0.95 or '95%%'), got %r" % (merged["confidence"],))
    merged["confidence"] = confidence
    for name in ("max_canary_failed_requests", "min_requests"):
        value = merged[name]
        try:
            number = int(str(value))
        except ValueError:
            number = -1
        if isinstance(value, bool) or number < 0:
            raise ThresholdError("%s must be a whole number of at least 0, got %r" % (name, value))
        merged[name] = number
    return merged


def _statistic(metric, values):
    return _stats.mean(values) if metric.statistic == "mean" else _stats.median(values)


def rounds_needed(alpha):
    """The fewest rounds per side whose exact test can reach a two-sided p below alpha."""
    for count in range(2, 50):
        if _stats.smallest_p(count, count) <= alpha:
            return count
    return 50


def _pct(value):
    return "%+.1f%%" % (100.0 * value)


def judge_metric(metric, canary, baseline, threshold, confidence=0.95, min_requests=20):
    """The verdict of one metric from both sides' samples (lists of numbers)."""
    canary = [float(v) for v in canary if v is not None]
    baseline = [float(v) for v in baseline if v is not None]
    row = {"metric": metric.key, "label": metric.label, "unit": metric.unit, "samples": metric.source,
           "better": metric.better, "threshold": threshold, "n_canary": len(canary), "n_baseline": len(baseline),
           "canary": None, "baseline": None, "change": None, "p_value": None, "ci": None, "advice": []}

    def verdict(word, reason, *advice):
        row["verdict"] = word
        row["reason"] = reason
        row["advice"] = list(advice)
        return row

    if not canary and not baseline:
        return verdict(NOT_MEASURED, "neither side reports it")
    if not canary or not baseline:
        empty = "canary" if not canary else "baseline"
        return verdict(INCONCLUSIVE, "no %s from the %s" % (metric.label, empty), "empty:%s" % empty)
    row["canary"] = _statistic(metric, canary)
    row["baseline"] = _statistic(metric, baseline)
    if row["baseline"] == 0:
        return verdict(INCONCLUSIVE, "the baseline's %s is 0: no relative change" % metric.label, "empty:baseline")
    relative = row["canary"] / row["baseline"] - 1.0
    row["change"] = relative
    worse = relative if metric.better == LOWER else -relative
    alpha = 1.0 - confidence
    try:
        test = _stats.mann_whitney(canary, baseline, confidence=confidence)
    except _stats.StatsError as exc:
        return verdict(INCONCLUSIVE, "no test: %s" % exc, "noisy")
    row["p_value"] = test.p_value
    low, high = sorted(bound / row["baseline"] for bound in test.ci)
    row["ci"] = [low, high]
    significant_worse = low > 0 if metric.better == LOWER else high < 0
    spread = "p=%.2g, %d%% interval %s..%s" % (test.p_value, round(confidence * 100), _pct(low), _pct(high))
    change = "%s %s" % (metric.label, _pct(relative))
    if threshold is None:
        return verdict(INFO, "%s (%s; not judged)" % (change, spread))
    limit = "threshold %s" % _pct(threshold if metric.better == LOWER else -threshold)
    too_few = min(len(canary), len(baseline))
    if metric.source == "rounds" and _stats.smallest_p(len(canary), len(baseline)) > alpha:
        return verdict(INCONCLUSIVE, "%s, but %d canary and %d baseline rounds can never be significant at %d%%"
                       % (change, len(canary), len(baseline), round(confidence * 100)),
                       "rounds:%d" % rounds_needed(alpha))
    if metric.source == "requests" and too_few < min_requests:
        return verdict(INCONCLUSIVE, "%s, from only %d requests on one side (min_requests %d)"
                       % (change, too_few, min_requests), "requests:%d" % min_requests)
    if significant_worse and worse > threshold:
        return verdict(REGRESSION, "%s past the %s, significant (%s)" % (change, limit, spread))
    if worse > threshold:
        return verdict(INCONCLUSIVE, "%s past the %s but not significant (%s)" % (change, limit, spread), "noisy")
    worst_case = high if metric.better == LOWER else -low
    if threshold > 0 and worst_case > NOISE_LIMIT * threshold:
        return verdict(INCONCLUSIVE, "%s, too noisy to tell: the interval (%s) reaches past twice the %s"
                       % (change, spread, limit), "noisy")
    return verdict(PASS, "%s within the %s (%s)" % (change, limit, spread))


def _failure_rate(side):
    total = side.get("completed", 0) + side.get("failed_requests", 0)
    return (side.get("failed_requests", 0) / float(total)) if total else 0.0


def critical_checks(canary, baseline, thresholds):
    """(verdict or None, messages) of the checks that decide whatever the statistics say."""
    messages = []
    word = None
    c_failed, b_failed = canary.get("failed_requests", 0), baseline.get("failed_requests", 0)
    if c_failed > thresholds["max_canary_failed_requests"]:
        said = "; ".join(canary.get("errors") or []) or "no error text"
        if b_failed:
            word = INCONCLUSIVE
            messages.append("failed requests on both sides (canary %d, %.0f%%; baseline %d, %.0f%%): the workload, a key "
                            "or the network is wrong, not only the settings - canary: %s; baseline: %s"
                            % (c_failed, 100 * _failure_rate(canary), b_failed, 100 * _failure_rate(baseline), said,
                               "; ".join(baseline.get("errors") or []) or "no error text"))
        else:
            word = REGRESSION
            messages.append("the canary failed %d request(s) (%.0f%%), the baseline none: %s"
                            % (c_failed, 100 * _failure_rate(canary), said))
    elif b_failed:
        messages.append("the baseline failed %d request(s) (%.0f%%): %s" % (
            b_failed, 100 * _failure_rate(baseline), "; ".join(baseline.get("errors") or []) or "no error text"))
    collapse = thresholds["accept_length_collapse"]
    accepts = [[v for v in side.get("rounds", {}).get("accept_length", []) if v is not None]
               for side in (canary, baseline)]
    if collapse is not None and accepts[0] and accepts[1]:
        c_accept, b_accept = (sum(values) / len(values) for values in accepts)
        if c_accept < collapse * b_accept:
            word = REGRESSION
            messages.append("the accept length collapsed: %.2f on the canary against %.2f on the baseline (below "
                            "%.0f%%)" % (c_accept, b_accept, 100 * collapse))
    return word, messages


def advice_text(keys, context=None):
    """What to change, in words, for the advice keys of inconclusive metrics."""
    context = context or {}
    rounds = context.get("rounds")
    prompts = context.get("num_prompts")
    concurrency = context.get("max_concurrency")
    said = []
    for key in keys:
        kind, dummy, value = key.partition(":")
        if kind == "rounds":
            text = "run at least %s rounds per host%s" % (value, " (now %s)" % rounds if rounds else "")
        elif kind == "requests":
            text = "send more requests per host: num_prompts x rounds%s should reach %s" % (
                " (now %s x %s)" % (prompts, rounds) if prompts and rounds else "", value)
        elif kind == "empty":
            text = "find out why the %s gave no values (every request failed? no speculative decoding?)" % value
        else:
            text = "more rounds%s or more requests per round%s; a lower max_concurrency%s; both hosts out of the router " \
                   "(rollout_analysis_isolate) when router traffic skews the window" % (
                       " (now %s)" % rounds if rounds else "", " (now %s)" % prompts if prompts else "",
                       " (now %s)" % concurrency if concurrency else "")
        if text not in said:
            said.append(text)
    return said


def judge(canary, baseline, thresholds=None, context=None):
    """The verdict of a canary against its baseline.

    Each side: ``{"requests": {"ttft_ms": [...], "tpot_ms": [...], "itl_ms": [...]}, "rounds":
    {"output_throughput": [...], "p99_e2e_latency_ms": [...], "accept_length": [...]}, "completed": n,
    "failed_requests": n, "errors": [...]}``. ``context`` (rounds, num_prompts, max_concurrency) words the
    advice. Returns verdict, message, metrics (one row each), critical and advice.
    """
    thresholds = check_thresholds(thresholds)
    rows = []
    for metric in METRICS:
        rows.append(judge_metric(metric, canary.get(metric.source, {}).get(metric.sample, []),
                                 baseline.get(metric.source, {}).get(metric.sample, []),
                                 thresholds[metric.threshold], thresholds["confidence"], thresholds["min_requests"]))
    critical, critical_messages = critical_checks(canary, baseline, thresholds)
    verdicts = [row["verdict"] for row in rows]
    if critical == REGRESSION or REGRESSION in verdicts:
        overall = REGRESSION
    elif critical == INCONCLUSIVE or INCONCLUSIVE in verdicts:
        overall = INCONCLUSIVE
    else:
        overall = PASS
    advice = advice_text([key for row in rows if row["verdict"] == INCONCLUSIVE for key in row["advice"]], context)
    if critical == INCONCLUSIVE:
        advice.insert(0, "check the workload, the API keys and that both hosts answer /generate")
    parts = list(critical_messages)
    for word in (REGRESSION, INCONCLUSIVE):
        parts.extend(row["reason"] for row in rows if row["verdict"] == word)
    if overall == PASS:
        parts = ["every judged metric is within its threshold"] + critical_messages
    message = "%s: %s" % (overall, "; ".join(parts))
    if overall == INCONCLUSIVE and advice:
        message += ". To decide: %s." % "; ".join(advice)
    return {"verdict": overall, "message": message, "metrics": rows, "critical": critical_messages,
            "advice": advice, "thresholds": thresholds}
