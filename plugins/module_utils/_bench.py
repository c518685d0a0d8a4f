# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The collection's one benchmark of SGLang's /generate, on SGLang bench_serving's terms.

Private to this collection: no compatibility promise. Standard library only, so the same code runs
in a module on a managed host (gpufleet.inference.sglang_bench) and in-process on the controller
(the canary analysis).

A request is what ``python -m sglang.bench_serving --backend sglang`` sends: a streaming
``POST /generate`` with ``sampling_params`` {temperature, max_new_tokens, ignore_eos}. The answer is
read as Server-Sent Events (``data: {json}`` lines, the last ``data: [DONE]``); per request:

- TTFT: from sending the request to the first chunk whose ``text`` is not empty;
- ITL: a later chunk's gap since the previous counted chunk, split evenly over the tokens it adds
  (``meta_info.completion_tokens`` growth; a chunk that adds none is skipped, as bench_serving does);
- E2E latency: to the last line read; output length: ``completion_tokens`` of the last text chunk;
- TPOT: (E2E - TTFT) / (output length - 1) when the output has more than one token;
- accept length: the final chunk's ``meta_info.spec_accept_length`` (that request's own figure).

Stricter than bench_serving, because a canary must not pass on broken answers: a request also fails
when the stream carries an error object, an aborted finish reason, no text at all, or ends before
``[DONE]`` or a finish reason.

Per run (``summarize``): bench_serving's figure names - completed, total_input_tokens,
total_output_tokens, duration, request_throughput, input_throughput, output_throughput,
total_throughput, mean/median/std/p90/p95/p99 of ttft, tpot, itl and e2e_latency in ms (ITL pooled
over every token, plus max_itl_ms), concurrency - plus ``failed_requests`` (not ``failed``: Ansible reads that
key of a result as the task's failure), ``errors`` and ``accept_length``:
the mean of the requests' own accept lengths (bench_serving prints the server-wide cumulative
``avg_spec_accept_length`` of /server_info instead, which mixes in every other request).
"""
from __future__ import annotations

import json
import math
import random
import threading
import time

from ansible_collections.gpufleet.inference.plugins.module_utils import _stats
from ansible_collections.gpufleet.inference.plugins.module_utils._http import describe_exception

MAX_ERRORS = 5

# Figures of a run in the order reports show them (the sweep's CSV columns among them).
FIGURES = (
    "output_throughput", "request_throughput", "input_throughput", "total_throughput",
    "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p90_ttft_ms", "p95_ttft_ms", "p99_ttft_ms",
    "mean_tpot_ms", "median_tpot_ms", "std_tpot_ms", "p90_tpot_ms", "p95_tpot_ms", "p99_tpot_ms",
    "mean_itl_ms", "median_itl_ms", "std_itl_ms", "p90_itl_ms", "p95_itl_ms", "p99_itl_ms", "max_itl_ms",
    "mean_e2e_latency_ms", "median_e2e_latency_ms", "std_e2e_latency_ms", "p90_e2e_latency_ms",
    "p95_e2e_latency_ms", "p99_e2e_latency_ms",
    "accept_length", "concurrency", "completed", "failed_requests", "total_input_tokens", "total_output_tokens", "duration",
)

DEFAULT_WORKLOAD = {
    "num_prompts": 32,        # requests per run (per round in the canary analysis)
    "max_concurrency": 8,     # requests in flight at most (None: all at once)
    "request_rate": "inf",    # requests per second (Poisson arrivals), inf: all at once
    "input_len": 256,         # words of each built-in prompt (about one token each)
    "output_len": 256,        # max_new_tokens (with ignore_eos: every answer has this length)
    "seed": 42,
    "temperature": 0.0,
    "ignore_eos": True,
    "prompts_file": None,     # JSONL ({"prompt": ..., "output_len": ...} per line) or text (a prompt per line)
}

# Plain English words: about one token each in the tokenizers SGLang serves, so a built-in prompt of
# input_len words is about input_len tokens (the server reports the real count as prompt_tokens).
_WORDS = (
    "the be to of and a in that have it for not on with he as you do at this but his by from they we say her "
    "she or an will my one all would there their what so up out if about who get which go me when make can "
    "like time no just him know take people into year your good some could them see other than then now look "
    "only come its over think also back after use two how our work first well way even new want because any "
    "these give day most us is are was were been has had did said made found used river paper world house "
    "water light music story table window garden market letter school family number system program question "
    "city court field power money order paper point reason report result service state study voice movement"
).split()


class WorkloadError(ValueError):
    """A workload the benchmark cannot run (said before any request is sent)."""


class Prompt(object):
    def __init__(self, text, output_len):
        self.text = text
        self.output_len = int(output_len)


def _positive_int(workload, name, allow_none=False):
    value = workload.get(name)
    if value is None and allow_none:
        return None
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise WorkloadError("workload %s must be a whole number, got %r" % (name, value))
    if number < 1 or isinstance(value, bool) or (isinstance(value, float) and value != number):
        raise WorkloadError("workload %s must be a whole number of at least 1, got %r" % (name, value))
    return number


def request_rate(value):
    """A request rate: a positive number of requests per second, or inf (all at once)."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("inf", "infinity", "")):
        return float("inf")
    try:
        rate = float(value)
    except (TypeError, ValueError):
        raise WorkloadError("workload request_rate must be a number of requests per second or inf, got %r" % (value,))
    if math.isnan(rate) or rate <= 0:
        raise WorkloadError("workload request_rate must be above 0 (or inf), got %r" % (value,))
    return rate


def check_workload(workload):
    """The workload with defaults filled in and values checked; unknown keys are refused."""
    given = dict(workload or {})
    unknown = sorted(set(given) - set(DEFAULT_WORKLOAD))
    if unknown:
        raise WorkloadError("unknown workload key(s) %s; known: %s" % (", ".join(unknown), ", ".join(sorted(DEFAULT_WORKLOAD))))
    merged = dict(DEFAULT_WORKLOAD)
    merged.update(dict((k, v) for k, v in given.items() if v is not None or k in ("max_concurrency", "prompts_file")))
    for name in ("num_prompts", "input_len", "output_len"):
        merged[name] = _positive_int(merged, name)
    merged["max_concurrency"] = _positive_int(merged, "max_concurrency", allow_none=True)
    rate = request_rate(merged["request_rate"])
    merged["request_rate"] = "inf" if rate == float("inf") else rate
    try:
        merged["seed"] = int(merged["seed"])
        merged["temperature"] = float(merged["temperature"])
    except (TypeError, ValueError):
        raise WorkloadError("workload seed must be a whole number and temperature a number, got %r and %r"
                            % (merged["seed"], merged["temperature"]))
    if merged["temperature"] < 0:
        raise WorkloadError("workload temperature must not be negative, got %r" % merged["temperature"])
    merged["ignore_eos"] = bool(merged["ignore_eos"])
    return merged


def load_prompts_file(path, default_output_len):
    """Prompts of an operator's file: ``.jsonl`` holds one JSON object per line with ``prompt`` (and
    optionally ``output_len``); any other file holds one prompt per non-empty line."""
    try:
        with open(path, "rb") as handle:
            text = handle.read().decode("utf-8")
    except (IOError, OSError) as exc:
        raise WorkloadError("cannot read the prompts file %s: %s" % (path, exc))
    except UnicodeDecodeError:
        raise WorkloadError("the prompts file %s is not UTF-8" % path)
    prompts = []
    jsonl = str(path).lower().endswith(".jsonl")
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if not jsonl:
            prompts.append(Prompt(line, default_output_len))
            continue
        try:
            item = json.loads(line)
        except ValueError as exc:
            raise WorkloadError("%s line %d is not JSON: %s" % (path, number, exc))
        if not isinstance(item, dict) or not isinstance(item.get("prompt"), str) or not item["prompt"]:
            raise WorkloadError('%s line %d needs a non-empty string "prompt"' % (path, number))
        output_len = item.get("output_len", default_output_len)
        if isinstance(output_len, bool) or not isinstance(output_len, int) or output_len < 1:
            raise WorkloadError("%s line %d: output_len must be a whole number of at least 1, got %r"
                                % (path, number, output_len))
        prompts.append(Prompt(item["prompt"], output_len))
    if not prompts:
        raise WorkloadError("the prompts file %s holds no prompt" % path)
    return prompts


def random_prompt(rng, words):
    return " ".join(rng.choice(_WORDS) for dummy in range(words))


def round_prompts(workload, round_index=0, file_prompts=None):
    """The requests of one run: the same for the same (workload, round) wherever it runs, different
    from round to round, so two hosts get identical work and no round reuses a cached prompt.
    From a prompts file, round k takes the next num_prompts prompts (wrapping around)."""
    count = workload["num_prompts"]
    if file_prompts:
        start = round_index * count
        return [file_prompts[(start + i) % len(file_prompts)] for i in range(count)]
    rng = random.Random("%d:%d" % (workload["seed"], round_index))
    return [Prompt(random_prompt(rng, workload["input_len"]), workload["output_len"]) for dummy in range(count)]


def generate_payload(prompt, workload):
    sampling = {"temperature": workload["temperature"], "max_new_tokens": prompt.output_len,
                "ignore_eos": workload["ignore_eos"]}
    return {"text": prompt.text, "sampling_params": sampling, "stream": True}


# ----------------------------------------------------------------------------- one request

class RequestResult(object):
    """One streamed request: times in seconds from sending it."""

    def __init__(self, success=False, error=None, ttft=None, itl=None, latency=None, output_len=0,
                 prompt_len=None, accept_length=None):
        self.success = success
        self.error = error
        self.ttft = ttft
        self.itl = itl or []
        self.latency = latency
        self.output_len = output_len
        self.prompt_len = prompt_len
        self.accept_length = accept_length

    @property
    def tpot(self):
        if not self.success or self.output_len <= 1 or self.ttft is None:
            return None
        return (self.latency - self.ttft) / (self.output_len - 1)


def _excerpt(text, limit=200):
    return " ".join(str(text).split())[:limit]


def _sse_data(raw):
    """The payload of one SSE line; None for blank lines, comments and other fields."""
    line = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    line = line.strip()
    if not line or line.startswith(":"):
        return None
    if line.startswith("data:"):
        return line[5:].strip()
    if line.split(":", 1)[0] in ("event", "id", "retry"):
        return None
    return line  # bench_serving reads a line without the prefix as data too


def parse_stream(events, start):
    """A RequestResult from ``(timestamp, raw line)`` pairs of one streamed answer; ``start`` is when the
    request was sent (same clock). A failing read inside ``events`` fails the request."""
    result = RequestResult(latency=0.0)
    last_time = start
    last_len = 0
    done = finished = False
    try:
        for stamp, raw in events:
            data = _sse_data(raw)
            if data is None:
                continue
            result.latency = stamp - start
            if data == "[DONE]":
                done = True
                continue
            try:
                chunk = json.loads(data)
            except ValueError:
                result.error = "a stream line that is not JSON: %s" % _excerpt(data)
                return result
            if not isinstance(chunk, dict):
                result.error = "a stream line that is not a JSON object: %s" % _excerpt(data)
                return result
            if chunk.get("error") is not None:
                error = chunk["error"]
                message = error.get("message") if isinstance(error, dict) else error
                result.error = "the server reported an error in the stream: %s" % _excerpt(message)
                return result
            meta = chunk.get("meta_info") if isinstance(chunk.get("meta_info"), dict) else {}
            if meta.get("spec_accept_length") is not None:
                result.accept_length = float(meta["spec_accept_length"])
            if meta.get("prompt_tokens") is not None:
                result.prompt_len = int(meta["prompt_tokens"])
            reason = meta.get("finish_reason")
            if reason:
                finished = True
                if isinstance(reason, dict) and reason.get("type") == "abort":
                    result.error = "the server aborted the request: %s" % _excerpt(reason.get("message") or reason)
                    return result
            if chunk.get("text"):
                if meta.get("completion_tokens") is None:
                    result.error = "a text chunk without meta_info.completion_tokens"
                    return result
                produced = int(meta["completion_tokens"])
                if result.ttft is None:
                    result.ttft = stamp - start
                else:
                    added = produced - last_len
                    if added == 0:
                        continue
                    gap = (stamp - last_time) / added
                    result.itl.extend([gap] * added)
                last_time = stamp
                last_len = produced
                result.output_len = produced
    except Exception as exc:  # pylint: disable=broad-except
        result.error = "reading the stream: %s" % describe_exception(exc)
        return result
    if result.ttft is None:
        result.error = "the stream carried no text"
    elif not (done or finished):
        result.error = "the stream ended before [DONE] (%d tokens read)" % result.output_len
    else:
        result.success = True
    return result


def make_sender(client, workload, timeout, clock=None):
    """``send(prompt) -> RequestResult`` over an _http.HttpClient: one streamed /generate each."""
    clock = clock or time.perf_counter

    def send(prompt):
        start = clock()
        stream = client.stream("/generate", generate_payload(prompt, workload), timeout)
        try:
            if stream.status != 200:
                return RequestResult(error=stream.describe(), latency=clock() - start)

            def events():
                while True:
                    line = stream.readline()
                    stamp = clock()
                    if not line:
                        return
                    yield stamp, line
            return parse_stream(events(), start)
        finally:
            stream.close()

    return send


# --------------------------------------------------------------------------------- one run

def arrival_offsets(count, rate, seed):
    """When each request is due, in seconds from the start: all at once for an infinite rate, else
    Poisson arrivals (exponential gaps, the first at 0) as bench_serving sends them."""
    if rate == float("inf"):
        return [0.0] * count
    rng = random.Random(seed)
    offsets = [0.0]
    for dummy in range(count - 1):
        offsets.append(offsets[-1] + rng.expovariate(rate))
    return offsets


def run_requests(send, prompts, max_concurrency=None, rate=float("inf"), seed=42, clock=None, sleep=None):
    """Send every prompt (in order, each at its arrival time) with at most ``max_concurrency`` in flight.
    Returns (results in prompt order, duration in seconds)."""
    clock = clock or time.perf_counter
    sleep = sleep or time.sleep
    count = len(prompts)
    offsets = arrival_offsets(count, rate, seed)
    results = [None] * count
    lock = threading.Lock()
    cursor = {"next": 0}
    started = clock()

    def worker():
        while True:
            with lock:
                index = cursor["next"]
                if index >= count:
                    return
                cursor["next"] = index + 1
            delay = started + offsets[index] - clock()
            if delay > 0:
                sleep(delay)
            try:
                results[index] = send(prompts[index])
            except Exception as exc:  # pylint: disable=broad-except
                results[index] = RequestResult(error="%s: %s" % (type(exc).__name__, exc), latency=0.0)

    threads = [threading.Thread(target=worker) for dummy in range(max(1, min(max_concurrency or count, count)))]
    for thread in threads:
        thread.daemon = True
        thread.start()
    for thread in threads:
        thread.join()
    return results, clock() - started


def _ms(value):
    return None if value is None else round(value * 1000.0, 3)


def _rate(amount, duration):
    return round(amount / duration, 3) if duration > 0 else 0.0


def summarize(results, duration):
    """bench_serving's figures of one run (None where no request gave a value)."""
    ok = [r for r in results if r.success]
    series = {
        "ttft": [r.ttft for r in ok],
        "tpot": [r.tpot for r in ok if r.tpot is not None],
        "itl": [gap for r in ok for gap in r.itl],
        "e2e_latency": [r.latency for r in ok],
    }
    inputs = sum(r.prompt_len or 0 for r in ok)
    outputs = sum(r.output_len for r in ok)
    figures = {
        "completed": len(ok),
        "failed_requests": len(results) - len(ok),
        "duration": round(duration, 4),
        "total_input_tokens": inputs,
        "total_output_tokens": outputs,
        "request_throughput": _rate(len(ok), duration),
        "input_throughput": _rate(inputs, duration),
        "output_throughput": _rate(outputs, duration),
        "total_throughput": _rate(inputs + outputs, duration),
    }
    for name, values in series.items():
        figures["mean_%s_ms" % name] = _ms(_stats.mean(values))
        figures["median_%s_ms" % name] = _ms(_stats.median(values))
        figures["std_%s_ms" % name] = _ms(_stats.pstdev(values))
        for pct in (90, 95, 99):
            figures["p%d_%s_ms" % (pct, name)] = _ms(_stats.percentile(values, pct))
    figures["max_itl_ms"] = _ms(max(series["itl"])) if series["itl"] else None
    figures["concurrency"] = round(sum(series["e2e_latency"]) / duration, 3) if duration > 0 else 0.0
    accepts = [r.accept_length for r in ok if r.accept_length is not None]
    figures["accept_length"] = round(_stats.mean(accepts), 4) if accepts else None
    errors = []
    for result in results:
        if not result.success and result.error and result.error not in errors:
            errors.append(result.error)
            if len(errors) >= MAX_ERRORS:
                break
    figures["errors"] = errors
    return figures


def details(results):
    """Per-request values, as bench_serving's --output-details (seconds), plus E2E and accept length."""
    return {
        "ttfts": [r.ttft for r in results],
        "itls": [r.itl for r in results],
        "e2e_latencies": [r.latency if r.success else None for r in results],
        "output_lens": [r.output_len if r.success else 0 for r in results],
        "accept_lengths": [r.accept_length for r in results],
        "errors": [r.error or "" for r in results],
    }


def benchmark(client, workload, round_index=0, timeout=300.0, file_prompts=None, with_details=False):
    """One run of a checked workload against the server behind ``client``: the figures of summarize()
    (and, with_details, the per-request values under ``details``)."""
    prompts = round_prompts(workload, round_index, file_prompts)
    results, duration = run_requests(make_sender(client, workload, timeout), prompts, workload["max_concurrency"],
                                     request_rate(workload["request_rate"]), workload["seed"] + round_index)
    figures = summarize(results, duration)
    if with_details:
        figures["details"] = details(results)
    return figures, results
