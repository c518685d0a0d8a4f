# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""_bench: percentiles, the summary figures, response parsing and the closed loop's concurrency."""
import json
import threading
import time

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils._bench import (
    Sample,
    generate_payload,
    percentile,
    run_closed_loop,
    sample_from_response,
    summarize,
)


@pytest.mark.parametrize("values,pct,expected", [
    ([], 50, None),
    ([7], 99, 7.0),
    ([1, 2, 3, 4], 50, 2.5),
    ([4, 1, 3, 2], 0, 1.0),
    ([1, 2, 3, 4], 100, 4.0),
    (list(range(1, 11)), 90, 9.1),
    (list(range(1, 101)), 99, 99.01),
])
def test_percentile_matches_linear_interpolation(values, pct, expected):
    result = percentile(values, pct)
    assert result == (None if expected is None else pytest.approx(expected))


def test_summarize_figures():
    samples = [Sample(True, 0.1, 100, 3.0), Sample(True, 0.2, 100, 4.0), Sample(True, 0.3, 50, None),
               Sample(False, 0.0, error="HTTP 503 x"), Sample(False, 0.0, error="HTTP 503 x"),
               Sample(False, 0.0, error="timed out")]
    result = summarize(samples, 2.0)
    assert result["requests_ok"] == 3 and result["requests_failed"] == 3
    assert result["output_tokens"] == 250
    assert result["output_tokens_per_s"] == 125.0
    assert result["requests_per_s"] == 1.5
    assert result["p50_ms"] == 200.0
    assert result["mean_ms"] == 200.0
    assert result["p90_ms"] == pytest.approx(280.0)
    assert result["spec_accept_length_mean"] == 3.5
    assert result["errors"] == ["HTTP 503 x", "timed out"]


def test_summarize_all_failed_has_no_latency_and_caps_errors():
    samples = [Sample(False, 0.0, error="e%d" % i) for i in range(9)]
    result = summarize(samples, 0.0)
    assert result["requests_ok"] == 0 and result["output_tokens_per_s"] == 0.0
    assert result["p50_ms"] is None and result["mean_ms"] is None and result["spec_accept_length_mean"] is None
    assert result["errors"] == ["e0", "e1", "e2", "e3", "e4"]


def test_sample_from_response_variants():
    body = json.dumps({"text": " a b", "meta_info": {"completion_tokens": 2, "spec_accept_length": 3.2}})
    ok = sample_from_response(200, body, 0.5)
    assert (ok.ok, ok.output_tokens, ok.accept_length, ok.latency) == (True, 2, 3.2, 0.5)
    assert sample_from_response(400, '{"error": {"message": "bad"}}', 0.1).error.startswith("HTTP 400")
    assert sample_from_response(200, "not json", 0.1).ok is False
    assert sample_from_response(200, "{}", 0.1).error == "HTTP 200 without text"
    assert sample_from_response(None, None, 0.1, error="refused").error == "refused"
    batched = sample_from_response(200, json.dumps([{"text": "x", "meta_info": {"completion_tokens": 4}}]), 0.1)
    assert batched.ok and batched.output_tokens == 4


def test_generate_payload():
    assert generate_payload("hi", 8, 0.0) == {"text": "hi", "sampling_params": {"max_new_tokens": 8, "temperature": 0.0}}


def test_closed_loop_keeps_concurrency_and_cycles_prompts():
    lock = threading.Lock()
    state = {"now": 0, "peak": 0}
    seen = []

    def send(prompt):
        with lock:
            state["now"] += 1
            state["peak"] = max(state["peak"], state["now"])
            seen.append(prompt)
        time.sleep(0.02)
        with lock:
            state["now"] -= 1
        return Sample(True, 0.02, 10)

    samples, duration = run_closed_loop(send, ["a", "b", "c"], 12, 4)
    assert len(samples) == 12 and all(s.ok for s in samples)
    assert state["peak"] == 4
    assert sorted(seen) == sorted(["a", "b", "c"] * 4)
    assert duration >= 0.06  # 12 requests / 4 in flight * 20 ms


def test_closed_loop_turns_exceptions_into_failed_samples():
    def send(prompt):
        raise ValueError("boom")
    samples, dummy = run_closed_loop(send, ["p"], 3, 8)
    assert [s.error for s in samples] == ["ValueError: boom"] * 3
