# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A small closed-loop benchmark of SGLang's /generate: N requests at a fixed concurrency.

Private to this collection: no compatibility promise. Stdlib threads; the request function is
injected (the module passes one built on the collection's HTTP client, _http), so the statistics and
the scheduling are tested without a server.
"""
from __future__ import annotations

import json
import threading
import time

MAX_ERRORS = 5


class Sample(object):
    """One request: ok, latency in seconds, completion tokens, spec accept length, error text."""

    def __init__(self, ok, latency, output_tokens=0, accept_length=None, error=None):
        self.ok = ok
        self.latency = latency
        self.output_tokens = output_tokens
        self.accept_length = accept_length
        self.error = error


def percentile(values, pct):
    """Linear interpolation between closest ranks (numpy's default); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    if len(ordered) == 1:
        return float(ordered[0])
    rank = (len(ordered) - 1) * (float(pct) / 100.0)
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return float(ordered[low] + (ordered[high] - ordered[low]) * (rank - low))


def _round(value, digits):
    return None if value is None else round(value, digits)


def summarize(samples, duration):
    """The figures the module returns, from the samples and the wall-clock duration in seconds."""
    ok = [s for s in samples if s.ok]
    failed = [s for s in samples if not s.ok]
    latencies_ms = [s.latency * 1000.0 for s in ok]
    output_tokens = sum(int(s.output_tokens or 0) for s in ok)
    accept = [float(s.accept_length) for s in ok if s.accept_length is not None]
    errors = []
    for sample in failed:
        if sample.error and sample.error not in errors:
            errors.append(sample.error)
        if len(errors) >= MAX_ERRORS:
            break
    rate = (lambda n: n / duration) if duration > 0 else (lambda n: 0.0)
    return {
        "requests_ok": len(ok),
        "requests_failed": len(failed),
        "output_tokens": output_tokens,
        "duration_s": round(duration, 4),
        "output_tokens_per_s": round(rate(output_tokens), 3),
        "requests_per_s": round(rate(len(ok)), 4),
        "p50_ms": _round(percentile(latencies_ms, 50), 3),
        "p90_ms": _round(percentile(latencies_ms, 90), 3),
        "p99_ms": _round(percentile(latencies_ms, 99), 3),
        "mean_ms": _round(sum(latencies_ms) / len(latencies_ms) if latencies_ms else None, 3),
        "spec_accept_length_mean": _round(sum(accept) / len(accept) if accept else None, 4),
        "errors": errors,
    }


def generate_payload(prompt, max_new_tokens, temperature):
    return {"text": prompt, "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": temperature}}


def sample_from_response(status, text, latency, error=None):
    """Turn one /generate exchange into a Sample (status None: no HTTP answer, see error)."""
    if status is None:
        return Sample(False, latency, error=error or "no answer")
    if status != 200:
        excerpt = (text or "").strip().replace("\n", " ")[:200]
        return Sample(False, latency, error="HTTP %s %s" % (status, excerpt))
    try:
        data = json.loads(text)
    except ValueError:
        return Sample(False, latency, error="HTTP 200 with a body that is not JSON")
    if isinstance(data, list):  # a batched answer: not what we sent, but count it honestly
        data = data[0] if data else {}
    meta = data.get("meta_info") if isinstance(data, dict) and isinstance(data.get("meta_info"), dict) else {}
    if not isinstance(data, dict) or "text" not in data:
        return Sample(False, latency, error="HTTP 200 without text")
    return Sample(True, latency, int(meta.get("completion_tokens") or 0), meta.get("spec_accept_length"))


def run_closed_loop(send, prompts, num_prompts, concurrency, clock=None):
    """Send ``num_prompts`` requests with at most ``concurrency`` in flight.

    ``send(prompt) -> Sample``; prompts are used in turn. Returns (samples, duration seconds).
    """
    clock = clock or time.monotonic
    samples = [None] * num_prompts
    lock = threading.Lock()
    cursor = {"next": 0}

    def worker():
        while True:
            with lock:
                index = cursor["next"]
                if index >= num_prompts:
                    return
                cursor["next"] = index + 1
            try:
                samples[index] = send(prompts[index % len(prompts)])
            except Exception as exc:  # pylint: disable=broad-except
                samples[index] = Sample(False, 0.0, error="%s: %s" % (type(exc).__name__, exc))

    started = clock()
    threads = [threading.Thread(target=worker) for dummy in range(max(1, min(concurrency, num_prompts)))]
    for thread in threads:
        thread.daemon = True
        thread.start()
    for thread in threads:
        thread.join()
    return samples, clock() - started
