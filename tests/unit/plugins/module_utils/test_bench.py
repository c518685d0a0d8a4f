# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""_bench: SSE parsing and per-request metrics on recorded streams, bench_serving's run figures,
the workload (built-in prompts, prompts files, checks) and the request scheduler."""
import json
import threading

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils import _bench as bench
from ansible_collections.gpufleet.inference.plugins.module_utils._http import HTTP, REFUSED, Stream


def chunk(text, tokens, finish=None, **meta):
    """One output as SGLang 0.5.23's tokenizer manager streams it (orjson: compact, cumulative text)."""
    info = {"id": "r1", "finish_reason": finish, "prompt_tokens": 7, "weight_version": "default",
            "num_retractions": 0, "reasoning_tokens": 0, "completion_tokens": tokens, "cached_tokens": 0}
    info.update(meta)
    return b"data: " + json.dumps({"text": text, "output_ids": list(range(tokens)), "meta_info": info},
                                  separators=(",", ":")).encode() + b"\n"


DONE = b"data: [DONE]\n"
BLANK = b"\n"
FINISH = {"type": "length", "length": 9}
SPEC = {"e2e_latency": 0.5, "spec_accept_length": 3.0, "spec_accept_rate": 0.13, "spec_verify_ct": 3}


def events(*timed):
    """(time, line) pairs; every data line is followed by the blank line SSE puts between events."""
    out = []
    for stamp, line in timed:
        out.append((stamp, line))
        out.append((stamp, BLANK))
    return out


# A speculative answer of 9 tokens: the prefill's token at 100 ms, then verify steps of 3, 0 (a
# detokenizer hold-back: empty text), 2, 3 tokens, then [DONE].
SPECULATIVE = events(
    (0.100, chunk(" The", 1, response_sent_to_client_ts=1764410400.1)),
    (0.130, chunk(" The cat sat on", 4)),
    (0.150, chunk("", 4)),
    (0.170, chunk(" The cat sat on the mat", 6)),
    (0.200, chunk(" The cat sat on the mat and slept.", 9, FINISH, **SPEC)),
    (0.201, DONE),
)


def test_a_speculative_stream_gives_bench_servings_per_request_figures():
    result = bench.parse_stream(SPECULATIVE, 0.0)
    assert result.success and result.error is None
    assert result.ttft == pytest.approx(0.100)
    # 30 ms over 3 tokens, (empty chunk skipped) 40 ms over 2, 30 ms over 3
    assert result.itl == pytest.approx([0.010] * 3 + [0.020] * 2 + [0.010] * 3)
    assert result.latency == pytest.approx(0.201)  # the [DONE] line is the last one read
    assert result.output_len == 9 and result.prompt_len == 7 and result.accept_length == 3.0
    assert result.tpot == pytest.approx((0.201 - 0.100) / 8)


def test_a_chunk_that_adds_no_token_is_not_an_inter_token_gap():
    stream = events((0.1, chunk(" a", 1)), (0.2, chunk(" a!", 1)), (0.3, chunk(" a! b", 2, FINISH)), (0.3, DONE))
    result = bench.parse_stream(stream, 0.0)
    # as bench_serving: the repeated count is skipped and the next gap runs from the last counted chunk
    assert result.success and result.itl == pytest.approx([0.2])


def test_a_one_token_answer_has_no_tpot_and_no_itl():
    result = bench.parse_stream(events((0.05, chunk(" Yes", 1, FINISH)), (0.06, DONE)), 0.0)
    assert result.success and result.ttft == pytest.approx(0.05) and result.itl == [] and result.tpot is None


def test_without_speculative_decoding_there_is_no_accept_length():
    result = bench.parse_stream(events((0.1, chunk(" a", 1)), (0.2, chunk(" a b", 2, FINISH)), (0.2, DONE)), 0.0)
    assert result.success and result.accept_length is None


def test_leading_empty_chunks_do_not_count_as_the_first_token():
    stream = events((0.01, chunk("", 0)), (0.02, chunk("", 1)), (0.09, chunk(" hi", 1)), (0.1, chunk(" hi x", 2, FINISH)),
                    (0.1, DONE))
    assert bench.parse_stream(stream, 0.0).ttft == pytest.approx(0.09)


def test_incremental_streaming_output_is_read_by_token_counts_not_text():
    stream = events((0.1, chunk(" a", 1)), (0.2, chunk(" b c", 3)), (0.3, chunk(" d", 4, FINISH)), (0.3, DONE))
    result = bench.parse_stream(stream, 0.0)
    assert result.success and result.output_len == 4 and result.itl == pytest.approx([0.05, 0.05, 0.1])


def test_comments_and_other_sse_fields_are_ignored_and_bare_json_lines_are_read():
    bare = json.dumps({"text": " a b", "meta_info": {"completion_tokens": 2, "finish_reason": FINISH}}).encode()
    stream = [(0.0, b": keep-alive\n"), (0.0, b"event: message\n"), (0.1, chunk(" a", 1)), (0.2, bare + b"\n"),
              (0.2, DONE)]
    result = bench.parse_stream(stream, 0.0)
    assert result.success and result.output_len == 2


@pytest.mark.parametrize("stream,error", [
    (events((0.1, chunk(" a", 1)), (0.2, b'data: {"error":{"message":"The input is too long.","type":"invalid_request_error"}}\n'),
            (0.2, DONE)),
     "the server reported an error in the stream: The input is too long."),
    (events((0.1, chunk(" a", 1)), (0.2, chunk(" a", 1, {"type": "abort", "message": "Abort by the scheduler"})),
            (0.2, DONE)),
     "the server aborted the request: Abort by the scheduler"),
    (events((0.1, chunk(" a", 1)), (0.2, chunk(" a b", 2))),
     "the stream ended before [DONE] (2 tokens read)"),
    (events((0.1, chunk("", 1, FINISH)), (0.1, DONE)),
     "the stream carried no text"),
    ([], "the stream carried no text"),
    (events((0.1, b"data: {not json\n")), "a stream line that is not JSON: {not json"),
    (events((0.1, b"data: [1, 2]\n")), "a stream line that is not a JSON object: [1, 2]"),
    (events((0.1, b'data: {"text":"a","meta_info":{}}\n')), "a text chunk without meta_info.completion_tokens"),
])
def test_broken_streams_fail_the_request_with_what_was_wrong(stream, error):
    result = bench.parse_stream(stream, 0.0)
    assert result.success is False and result.error == error


def test_a_read_that_times_out_mid_stream_fails_the_request():
    import socket

    def broken():
        yield 0.1, chunk(" a", 1)
        raise socket.timeout("timed out")
    result = bench.parse_stream(broken(), 0.0)
    assert result.success is False and result.error == "reading the stream: no answer within the request timeout"


# ------------------------------------------------------------------------------ the sender

class FakeClient(object):
    """An HttpClient whose stream() answers from a script: a Stream or (status, lines)."""

    def __init__(self, answer):
        self.answer = answer
        self.sent = []

    def stream(self, path, payload, timeout=None):
        self.sent.append((path, payload, timeout))
        if isinstance(self.answer, Stream):
            return self.answer
        status, lines = self.answer
        handle = type("Handle", (), {})()
        remaining = list(lines)
        handle.readline = lambda: remaining.pop(0) if remaining else b""
        handle.close = lambda: None
        return Stream(HTTP, status, handle=handle)


WORKLOAD = bench.check_workload({"num_prompts": 2, "input_len": 3, "output_len": 9})


def test_the_sender_posts_bench_servings_payload_and_reads_the_stream():
    client = FakeClient((200, [line for dummy, line in SPECULATIVE]))
    clock = iter(float(i) for i in range(100))
    send = bench.make_sender(client, WORKLOAD, 30.0, clock=lambda: next(clock))
    result = send(bench.Prompt("one two three", 9))
    assert client.sent == [("/generate", {"text": "one two three", "stream": True, "sampling_params": {
        "temperature": 0.0, "max_new_tokens": 9, "ignore_eos": True}}, 30.0)]
    assert result.success and result.ttft == 1.0 and result.output_len == 9


@pytest.mark.parametrize("answer,error", [
    (Stream(HTTP, 401, body='{"error": "Unauthorized"}'), 'HTTP 401 {"error": "Unauthorized"}'),
    (Stream(HTTP, 503, body=""), "HTTP 503"),
    (Stream(REFUSED, error="[Errno 111] Connection refused"), "connection refused"),
])
def test_the_sender_reports_an_answer_that_is_not_a_stream(answer, error):
    result = bench.make_sender(FakeClient(answer), WORKLOAD, 30.0)(bench.Prompt("x", 9))
    assert result.success is False and result.error == error


# ------------------------------------------------------------------------------ run figures

def done(ttft, itl, latency, output_len, prompt_len=100, accept=None):
    return bench.RequestResult(True, None, ttft, itl, latency, output_len, prompt_len, accept)


def test_run_figures_have_bench_servings_names_and_definitions():
    results = [
        done(0.1, [0.01] * 9, 0.2, 10, accept=3.0),
        done(0.3, [0.02] * 4, 0.4, 5, accept=4.0),
        bench.RequestResult(error="HTTP 503"),
    ]
    figures = bench.summarize(results, 2.0)
    assert (figures["completed"], figures["failed_requests"], figures["errors"]) == (2, 1, ["HTTP 503"])
    assert figures["total_output_tokens"] == 15 and figures["total_input_tokens"] == 200
    assert figures["output_throughput"] == 7.5 and figures["request_throughput"] == 1.0
    assert figures["input_throughput"] == 100.0 and figures["total_throughput"] == 107.5
    assert figures["mean_ttft_ms"] == 200.0 and figures["median_ttft_ms"] == 200.0 and figures["std_ttft_ms"] == 100.0
    assert figures["p99_ttft_ms"] == pytest.approx(298.0)
    # TPOT = (E2E - TTFT) / (output_len - 1): 100/9 ms and 100/4 ms
    assert figures["mean_tpot_ms"] == pytest.approx((100 / 9 + 25) / 2, abs=1e-3)
    # ITL pooled over tokens: nine of 10 ms, four of 20 ms
    assert figures["median_itl_ms"] == 10.0 and figures["max_itl_ms"] == 20.0
    assert figures["mean_itl_ms"] == pytest.approx((9 * 10 + 4 * 20) / 13, abs=1e-3)
    assert figures["median_e2e_latency_ms"] == pytest.approx(300.0) and figures["p90_e2e_latency_ms"] == pytest.approx(380.0)
    assert figures["concurrency"] == 0.3 and figures["accept_length"] == 3.5
    assert set(bench.FIGURES) <= set(figures)


def test_a_run_where_every_request_failed_has_no_latency_and_at_most_five_errors():
    figures = bench.summarize([bench.RequestResult(error="e%d" % i) for i in range(9)], 0.0)
    assert figures["completed"] == 0 and figures["output_throughput"] == 0.0 and figures["concurrency"] == 0.0
    assert figures["median_ttft_ms"] is None and figures["max_itl_ms"] is None and figures["accept_length"] is None
    assert figures["errors"] == ["e0", "e1", "e2", "e3", "e4"]


def test_details_are_per_request_in_seconds():
    out = bench.details([done(0.1, [0.01], 0.2, 2, accept=2.0), bench.RequestResult(error="x")])
    assert out == {"ttfts": [0.1, None], "itls": [[0.01], []], "e2e_latencies": [0.2, None], "output_lens": [2, 0],
                   "accept_lengths": [2.0, None], "errors": ["", "x"]}


# ---------------------------------------------------------------------------------- workload

def test_the_default_workload_and_its_checks():
    assert bench.check_workload({}) == dict(bench.DEFAULT_WORKLOAD)
    assert bench.check_workload({"max_concurrency": None})["max_concurrency"] is None
    assert bench.check_workload({"request_rate": "4"})["request_rate"] == 4.0
    assert bench.check_workload({"num_prompts": "8"})["num_prompts"] == 8


@pytest.mark.parametrize("workload,message", [
    ({"num_prompts": 0}, "workload num_prompts must be a whole number of at least 1, got 0"),
    ({"output_len": 2.5}, "workload output_len must be a whole number of at least 1, got 2.5"),
    ({"max_concurrency": "many"}, "workload max_concurrency must be a whole number, got 'many'"),
    ({"request_rate": 0}, "workload request_rate must be above 0 (or inf), got 0"),
    ({"request_rate": "fast"}, "workload request_rate must be a number of requests per second or inf, got 'fast'"),
    ({"temperature": -1}, "workload temperature must not be negative, got -1.0"),
    ({"prompt_len": 5}, "unknown workload key(s) prompt_len; known: "),
])
def test_a_bad_workload_is_refused_naming_the_key(workload, message):
    with pytest.raises(bench.WorkloadError) as failed:
        bench.check_workload(workload)
    assert str(failed.value).startswith(message)


def test_builtin_prompts_are_the_same_for_a_round_everywhere_and_differ_between_rounds():
    workload = bench.check_workload({"num_prompts": 4, "input_len": 12})
    first = [p.text for p in bench.round_prompts(workload, 0)]
    assert first == [p.text for p in bench.round_prompts(workload, 0)]
    assert len(set(first)) == 4 and all(len(text.split()) == 12 for text in first)
    assert not set(first) & set(p.text for p in bench.round_prompts(workload, 1))
    other_seed = bench.check_workload({"num_prompts": 4, "input_len": 12, "seed": 7})
    assert first != [p.text for p in bench.round_prompts(other_seed, 0)]


def test_a_jsonl_prompts_file_and_rounds_taking_the_next_prompts(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "a"}\n\n{"prompt": "b", "output_len": 5}\n{"prompt": "c"}\n')
    prompts = bench.load_prompts_file(str(path), 64)
    assert [(p.text, p.output_len) for p in prompts] == [("a", 64), ("b", 5), ("c", 64)]
    workload = bench.check_workload({"num_prompts": 2})
    assert [p.text for p in bench.round_prompts(workload, 1, prompts)] == ["c", "a"]


def test_a_text_prompts_file_has_one_prompt_per_line(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("first prompt\n\n{not json} is fine here\n")
    assert [p.text for p in bench.load_prompts_file(str(path), 8)] == ["first prompt", "{not json} is fine here"]


@pytest.mark.parametrize("name,text,message", [
    ("p.jsonl", '{"prompt": "a"}\nnope\n', "p.jsonl line 2 is not JSON"),
    ("p.jsonl", '{"text": "a"}\n', 'p.jsonl line 1 needs a non-empty string "prompt"'),
    ("p.jsonl", '{"prompt": "a", "output_len": 0}\n', "p.jsonl line 1: output_len must be a whole number of at least 1, got 0"),
    ("p.txt", "\n\n", "holds no prompt"),
])
def test_a_bad_prompts_file_is_refused_with_the_line(tmp_path, name, text, message):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(bench.WorkloadError, match=message.replace("(", r"\(").replace(")", r"\)")):
        bench.load_prompts_file(str(path), 8)


def test_a_missing_prompts_file_is_refused():
    with pytest.raises(bench.WorkloadError, match="cannot read the prompts file /nonexistent/p.txt"):
        bench.load_prompts_file("/nonexistent/p.txt", 8)


# ---------------------------------------------------------------------------------- scheduling

def test_at_most_max_concurrency_requests_are_in_flight_and_all_are_sent_in_order():
    lock = threading.Lock()
    state = {"now": 0, "peak": 0}
    started = []
    gate = threading.Event()

    def send(prompt):
        with lock:
            state["now"] += 1
            state["peak"] = max(state["peak"], state["now"])
            started.append(prompt)
            if state["now"] == 3:
                gate.set()
        gate.wait(5)
        with lock:
            state["now"] -= 1
        return done(0.01, [], 0.02, 1)

    results, duration = bench.run_requests(send, list(range(10)), max_concurrency=3)
    assert len(results) == 10 and all(r.success for r in results) and state["peak"] == 3
    assert started[:3] == sorted(started[:3]) and sorted(started) == list(range(10))
    assert duration >= 0


def test_poisson_arrivals_follow_the_rate_and_the_seed():
    offsets = bench.arrival_offsets(2001, 10.0, 42)
    assert offsets[0] == 0.0 and offsets == sorted(offsets)
    assert offsets[-1] / 2000 == pytest.approx(0.1, rel=0.1)  # mean gap 1 / rate
    assert offsets == bench.arrival_offsets(2001, 10.0, 42) != bench.arrival_offsets(2001, 10.0, 43)
    assert bench.arrival_offsets(3, float("inf"), 42) == [0.0, 0.0, 0.0]


def test_each_request_waits_for_its_arrival_time():
    now = {"t": 100.0}
    slept = []

    def sleep(seconds):
        slept.append(round(seconds, 6))
        now["t"] += seconds
    results, dummy = bench.run_requests(lambda p: done(0.0, [], 0.0, 1), ["a", "b", "c"], max_concurrency=1, rate=2.0,
                                        seed=1, clock=lambda: now["t"], sleep=sleep)
    offsets = bench.arrival_offsets(3, 2.0, 1)
    assert len(results) == 3 and slept == [round(offsets[1], 6), round(offsets[2] - offsets[1], 6)]


def test_a_sender_that_raises_gives_a_failed_request_not_a_crash():
    def send(prompt):
        raise ValueError("boom")
    results, dummy = bench.run_requests(send, ["p"] * 3, max_concurrency=8)
    assert [r.error for r in results] == ["ValueError: boom"] * 3 and not any(r.success for r in results)
