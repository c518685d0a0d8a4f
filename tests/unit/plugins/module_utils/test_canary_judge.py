# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""_judge: per-metric verdicts (threshold AND significance), critical checks, the overall verdict
and its advice, from tables of both sides' samples."""
import random

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils import _canary_judge as judge_mod
from ansible_collections.gpufleet.inference.plugins.module_utils._canary_judge import (
    INCONCLUSIVE,
    INFO,
    NOT_MEASURED,
    PASS,
    REGRESSION,
    ThresholdError,
    check_thresholds,
    judge,
)


def noisy(centre, count, spread, seed):
    """``count`` values around ``centre``, +-``spread`` (relative, uniform), the same for the same seed."""
    rng = random.Random(seed)
    return [centre * (1.0 + rng.uniform(-spread, spread)) for dummy in range(count)]


def side(seed, ttft=100.0, tpot=10.0, itl=10.0, throughput=1000.0, e2e_p99=3000.0, accept=3.0, requests=192,
         rounds=6, request_noise=0.10, round_noise=0.01, throughput_noise=None, failed=0, errors=(), accept_values=None,
         throughput_values=None):
    return {
        "requests": {"ttft_ms": noisy(ttft, requests, request_noise, seed),
                     "tpot_ms": noisy(tpot, requests, request_noise, seed + 1),
                     "itl_ms": noisy(itl, requests, request_noise, seed + 2)},
        "rounds": {"output_throughput": throughput_values or noisy(throughput, rounds, round_noise if throughput_noise
                                                                   is None else throughput_noise, seed + 3),
                   "p99_e2e_latency_ms": noisy(e2e_p99, rounds, round_noise, seed + 4),
                   "accept_length": accept_values if accept_values is not None
                   else ([] if accept is None else noisy(accept, rounds, round_noise, seed + 5))},
        "completed": requests, "failed_requests": failed, "errors": list(errors),
    }


# Round throughputs 9 % apart in the median that overlap: not significant
OVERLAPPING_LOW = [700.0, 1250.0, 880.0, 1150.0, 820.0, 960.0]
OVERLAPPING_HIGH = [760.0, 1300.0, 980.0, 1200.0, 1000.0, 1050.0]


def verdicts(result):
    return dict((row["metric"], row["verdict"]) for row in result["metrics"])


# ------------------------------------------------------------------------------------ table

CASES = [
    # (name, canary, baseline, thresholds, overall, {metric: verdict})
    ("equal settings pass", side(1), side(100), None, PASS,
     {"output_throughput": PASS, "ttft_p50": PASS, "tpot_p50": PASS, "itl_p50": INFO, "e2e_p99": PASS,
      "accept_length": PASS}),
    ("2x slower decode is a regression on throughput, TPOT, E2E and accept length",
     side(1, tpot=20.0, itl=20.0, throughput=500.0, e2e_p99=5900.0, accept=2.1), side(100), None, REGRESSION,
     {"output_throughput": REGRESSION, "ttft_p50": PASS, "tpot_p50": REGRESSION, "e2e_p99": REGRESSION,
      "accept_length": REGRESSION}),
    ("1.3x slower decode is a regression too",
     side(1, tpot=13.0, throughput=770.0, e2e_p99=3850.0, accept=2.63), side(100), None, REGRESSION,
     {"output_throughput": REGRESSION, "tpot_p50": REGRESSION, "e2e_p99": REGRESSION, "accept_length": REGRESSION}),
    ("a significant change within the threshold passes",
     side(1, throughput=970.0, tpot=10.3), side(100), None, PASS, {"output_throughput": PASS, "tpot_p50": PASS}),
    ("a faster canary passes even when its numbers are noisy",
     side(1, throughput=1300.0, throughput_noise=0.2, tpot=7.0), side(100), None, PASS,
     {"output_throughput": PASS, "tpot_p50": PASS}),
    ("a drop past the threshold that is not significant is inconclusive",
     side(1, throughput_values=OVERLAPPING_LOW), side(100, throughput_values=OVERLAPPING_HIGH), None, INCONCLUSIVE,
     {"output_throughput": INCONCLUSIVE}),
    ("three rounds a side can never be significant",
     side(1, rounds=3, throughput=500.0), side(100, rounds=3), None, INCONCLUSIVE,
     {"output_throughput": INCONCLUSIVE, "e2e_p99": INCONCLUSIVE, "accept_length": INCONCLUSIVE}),
    ("too few requests for the per-request metrics",
     side(1, requests=10), side(100, requests=10), None, INCONCLUSIVE,
     {"ttft_p50": INCONCLUSIVE, "tpot_p50": INCONCLUSIVE, "output_throughput": PASS}),
    ("no speculative decoding on either side: accept length not measured",
     side(1, accept=None), side(100, accept=None), None, PASS, {"accept_length": NOT_MEASURED}),
    ("accept length on the baseline only is inconclusive",
     side(1, accept=None), side(100), None, INCONCLUSIVE, {"accept_length": INCONCLUSIVE}),
    ("ITL is judged once it has a threshold",
     side(1, itl=15.0), side(100), {"max_itl_p50_increase": "10%"}, REGRESSION, {"itl_p50": REGRESSION}),
    ("a threshold of None reports a metric without judging it",
     side(1, tpot=20.0), side(100), {"max_tpot_p50_increase": None}, PASS, {"tpot_p50": INFO}),
]


@pytest.mark.parametrize("name,canary,baseline,thresholds,overall,expected", CASES, ids=[c[0] for c in CASES])
def test_verdict_table(name, canary, baseline, thresholds, overall, expected):
    result = judge(canary, baseline, thresholds)
    assert result["verdict"] == overall, result["message"]
    got = verdicts(result)
    assert dict((metric, got[metric]) for metric in expected) == expected, result["message"]
    assert result["message"].startswith(overall + ": ")


# ------------------------------------------------------------------------- the words of verdicts

def test_a_regression_says_the_change_the_threshold_and_the_statistics():
    result = judge(side(1, tpot=13.0), side(100))
    row = next(r for r in result["metrics"] if r["metric"] == "tpot_p50")
    assert row["change"] == pytest.approx(0.3, abs=0.03) and row["threshold"] == 0.05
    assert row["ci"][0] > 0.2 and row["p_value"] < 1e-10
    assert row["reason"].startswith("TPOT p50 +3") and "past the threshold +5.0%, significant (p=" in row["reason"]
    assert "95% interval +" in row["reason"]
    assert row["canary"] == pytest.approx(13.0, rel=0.03) and row["baseline"] == pytest.approx(10.0, rel=0.03)
    assert (row["n_canary"], row["n_baseline"], row["samples"], row["unit"]) == (192, 192, "requests", "ms")


def test_throughput_is_judged_on_rounds_and_a_drop_reads_as_a_negative_threshold():
    row = next(r for r in judge(side(1, throughput=770.0), side(100))["metrics"] if r["metric"] == "output_throughput")
    assert row["samples"] == "rounds" and row["n_canary"] == 6 and row["better"] == "higher"
    assert "past the threshold -5.0%" in row["reason"]


def test_too_few_rounds_advises_how_many():
    result = judge(side(1, rounds=3, throughput=500.0), side(100, rounds=3), context={"rounds": 3, "num_prompts": 8})
    assert "run at least 4 rounds per host (now 3)" in result["advice"]
    assert "can never be significant at 95%" in result["message"] and "To decide: run at least 4 rounds" in result["message"]


def test_too_few_requests_advises_more_requests():
    result = judge(side(1, requests=10), side(100, requests=10), context={"rounds": 2, "num_prompts": 5})
    assert "send more requests per host: num_prompts x rounds (now 5 x 2) should reach 20" in result["advice"]


def test_noise_advises_rounds_requests_concurrency_and_isolation():
    result = judge(side(1, throughput_values=OVERLAPPING_LOW), side(100, throughput_values=OVERLAPPING_HIGH),
                   context={"rounds": 6, "num_prompts": 32, "max_concurrency": 8})
    assert result["advice"] == ["more rounds (now 6) or more requests per round (now 32); a lower max_concurrency "
                                "(now 8); both hosts out of the router (rollout_analysis_isolate) when router traffic "
                                "skews the window"]


def test_an_interval_that_reaches_past_twice_the_threshold_is_too_noisy():
    metric = next(m for m in judge_mod.METRICS if m.key == "output_throughput")
    canary = [1000.0, 1150.0, 850.0, 1100.0, 900.0, 1000.0]
    baseline = [1010.0, 1160.0, 860.0, 1110.0, 910.0, 1010.0]
    row = judge_mod.judge_metric(metric, canary, baseline, 0.05)
    assert row["verdict"] == INCONCLUSIVE and row["ci"][0] < -0.10
    assert row["reason"].startswith("output throughput -1.0%, too noisy to tell: the interval (p=")
    assert row["reason"].endswith("reaches past twice the threshold -5.0%")
    # the same spread against a 10 % threshold is resolved: it cannot hide a drop of twice that
    assert row["ci"][0] > -0.20 and judge_mod.judge_metric(metric, canary, baseline, 0.10)["verdict"] == PASS
    # a zero threshold judges any drop: a slightly better canary passes, noise or not
    better = [value + 20.0 for value in baseline]
    assert judge_mod.judge_metric(metric, better, baseline, 0.0)["verdict"] == PASS
    assert judge_mod.judge_metric(metric, canary, baseline, 0.0)["verdict"] == INCONCLUSIVE  # -1%, not significant


def test_identical_samples_pass_with_no_shift():
    metric = judge_mod.METRICS[0]
    row = judge_mod.judge_metric(metric, [5.0] * 6, [5.0] * 6, 0.05)
    assert row["verdict"] == PASS and row["change"] == 0.0 and row["ci"] == [0.0, 0.0]


# ------------------------------------------------------------------------------ critical checks

def test_failed_requests_on_the_canary_alone_are_a_regression_outright():
    result = judge(side(1, failed=3, errors=["HTTP 500 boom"]), side(100))
    assert result["verdict"] == REGRESSION
    assert result["critical"] == ["the canary failed 3 request(s) (2%), the baseline none: HTTP 500 boom"]
    assert result["message"].startswith("regression: the canary failed 3 request(s)")


def test_a_canary_that_answered_nothing_is_a_regression_with_its_errors():
    canary = {"requests": {}, "rounds": {}, "completed": 0, "failed_requests": 32, "errors": ["connection refused"]}
    result = judge(canary, side(100))
    assert result["verdict"] == REGRESSION and "(100%), the baseline none: connection refused" in result["critical"][0]
    assert verdicts(result)["tpot_p50"] == INCONCLUSIVE


def test_failed_requests_on_both_sides_are_inconclusive_and_name_both():
    result = judge(side(1, failed=32, errors=["HTTP 401 Unauthorized"]), side(100, failed=30, errors=["HTTP 401"]))
    assert result["verdict"] == INCONCLUSIVE
    assert "failed requests on both sides (canary 32, 14%; baseline 30, 14%)" in result["critical"][0]
    assert result["advice"][0] == "check the workload, the API keys and that both hosts answer /generate"


def test_failures_allowed_by_the_threshold_do_not_decide():
    result = judge(side(1, failed=1, errors=["x"]), side(100), {"max_canary_failed_requests": 1})
    assert result["verdict"] == PASS and result["critical"] == []


def test_failures_on_the_baseline_only_are_said_but_do_not_block_a_good_canary():
    result = judge(side(1), side(100, failed=2, errors=["timeout"]))
    assert result["verdict"] == PASS and result["critical"] == ["the baseline failed 2 request(s) (1%): timeout"]
    assert "the baseline failed 2 request(s)" in result["message"]


def test_an_accept_length_collapse_is_a_regression_even_from_two_rounds():
    result = judge(side(1, rounds=2, accept_values=[1.1, 1.3]), side(100, rounds=2, accept_values=[3.0, 3.0]))
    assert result["verdict"] == REGRESSION
    assert result["critical"] == ["the accept length collapsed: 1.20 on the canary against 3.00 on the baseline "
                                  "(below 50%)"]


# ------------------------------------------------------------------------------------ thresholds

def test_default_thresholds_and_percent_strings():
    assert check_thresholds(None) == judge_mod.DEFAULT_THRESHOLDS
    merged = check_thresholds({"max_throughput_drop": "3%", "confidence": "98%", "max_ttft_p50_increase": 0.2})
    assert merged["max_throughput_drop"] == pytest.approx(0.03) and merged["confidence"] == pytest.approx(0.98)
    assert merged["max_ttft_p50_increase"] == 0.2


@pytest.mark.parametrize("given,message", [
    ({"max_throughput_drop": 5}, "threshold max_throughput_drop must be at least 0 and below 1 (100%), got 5"),
    ({"max_throughput_drop": "five"}, "threshold max_throughput_drop must be a fraction like 0.05 or a percentage"),
    ({"confidence": 0.3}, "confidence must be between 0.5 and 1"),
    ({"min_requests": -1}, "min_requests must be a whole number of at least 0, got -1"),
    ({"max_canary_failed_requests": True}, "max_canary_failed_requests must be a whole number of at least 0, got True"),
    ({"max_latency": 0.1}, "unknown threshold(s) max_latency; known: "),
])
def test_bad_thresholds_are_refused_naming_them(given, message):
    with pytest.raises(ThresholdError) as failed:
        check_thresholds(given)
    assert str(failed.value).startswith(message)
