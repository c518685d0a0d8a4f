# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""_canary: inputs checked before any request, the ABBA schedule, samples for the judge, traffic from
/metrics and the router, and the report (JSON, Markdown, PNG or why not). The benchmark is faked
here (scripted request results); tests/functional/test_canary_analysis.py runs it against simulators."""
import json
import random

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils import _bench, _canary, _report
from ansible_collections.gpufleet.inference.plugins.module_utils._bench import RequestResult
from ansible_collections.gpufleet.inference.plugins.module_utils._canary import Analysis, AnalysisError
from ansible_collections.gpufleet.inference.plugins.module_utils._http import HTTP, Response
from ansible_collections.gpufleet.inference.plugins.module_utils._router import RouterError

KEY = "sk-canary-secret"
CANARY = {"name": "gpu-1", "url": "http://10.0.0.1:30000/", "api_key": KEY}
BASELINE = {"name": "gpu-2", "url": "http://10.0.0.2:30000"}
WORKLOAD = {"num_prompts": 24, "max_concurrency": 4, "output_len": 64}


def metrics_text(requests, tokens, ranks=1):
    lines = ["# TYPE sglang:num_requests_total counter"]
    for rank in range(ranks):
        lines.append('sglang:num_requests_total{model_name="m",tp_rank="%d"} %s' % (rank, float(requests) / ranks))
        lines.append('sglang:generation_tokens_total{model_name="m",tp_rank="%d"} %s' % (rank, float(tokens) / ranks))
    return "\n".join(lines) + "\n"


class FakeHost(object):
    """A host's HTTP client for the analysis: /metrics counters that other clients keep raising."""

    def __init__(self, other_requests_per_read=0, metrics=True):
        self.requests = 1000.0
        self.tokens = 50000.0
        self.other = other_requests_per_read
        self.metrics = metrics
        self.reads = 0

    def serve(self, requests, tokens):
        self.requests += requests
        self.tokens += tokens

    def get(self, path, timeout=None):
        assert path == "/metrics"
        self.reads += 1
        if not self.metrics:
            return Response(HTTP, 404, '{"detail":"Not Found"}')
        self.requests += self.other
        self.tokens += self.other * 100
        return Response(HTTP, 200, metrics_text(self.requests, self.tokens, ranks=2))


class FakeBench(object):
    """Stands in for _bench.benchmark: per host, requests with the given TPOT (s) and accept length."""

    def __init__(self, hosts, tpot, accept=None, fail=None):
        self.hosts = hosts
        self.tpot = tpot
        self.accept = accept or {}
        self.fail = fail or {}
        self.calls = []
        self.rng = random.Random(5)

    def __call__(self, client, workload, round_index, timeout, file_prompts=None, with_details=False):
        role = next(r for r, h in self.hosts.items() if h is client)
        self.calls.append((role, round_index, workload["num_prompts"]))
        results = []
        for dummy in range(workload["num_prompts"]):
            if self.fail.get(role):
                results.append(RequestResult(error=self.fail[role]))
                continue
            tpot = self.tpot[role] * (1 + self.rng.uniform(-0.05, 0.05))
            ttft = 0.05 * (1 + self.rng.uniform(-0.1, 0.1))
            out = workload["output_len"]
            results.append(RequestResult(True, None, ttft, [tpot] * (out - 1), ttft + tpot * (out - 1), out, 100,
                                         self.accept.get(role)))
        duration = sum(r.latency or 0 for r in results) / (workload["max_concurrency"] or 1) or 0.001
        figures = _bench.summarize(results, duration)
        client.serve(figures["completed"], figures["total_output_tokens"])
        return figures, results


class FakeRouter(object):
    def __init__(self, urls=None, error=None):
        self.urls = urls or []
        self.error = error

    def list_workers(self):
        if self.error:
            raise RouterError(self.error)
        return [{"url": url, "id": str(i), "healthy": True, "model_id": "m", "worker_type": "regular", "load": 0}
                for i, url in enumerate(self.urls)]


def analysis(monkeypatch, tpot, accept=None, fail=None, other=(0, 0), metrics=True, router=None, rounds=6, **params):
    hosts = {"canary": FakeHost(other[0], metrics), "baseline": FakeHost(other[1], metrics)}
    bench = FakeBench(hosts, tpot, accept, fail)
    monkeypatch.setattr(_bench, "benchmark", bench)
    lines = []
    args = dict({"canary": CANARY, "baseline": BASELINE, "workload": WORKLOAD, "rounds": rounds}, **params)
    prepared = Analysis.prepare(args, clients=hosts, progress=lines.append, router=router, first_round=1000)
    return prepared, bench, hosts, lines


# ------------------------------------------------------------------------------------ inputs

def test_abba_alternates_the_first_host_of_each_round():
    assert _canary.abba(3) == [("canary", 0), ("baseline", 0), ("baseline", 1), ("canary", 1), ("canary", 2),
                               ("baseline", 2)]


@pytest.mark.parametrize("change,message", [
    ({"canary": {"url": "10.0.0.1:30000"}}, "canary.url must be the server's base URL like http://10.0.0.11:30000, "
                                            "got '10.0.0.1:30000'"),
    ({"baseline": {"url": "http://10.0.0.1:30000"}}, "canary and baseline are the same server (http://10.0.0.1:30000)"),
    ({"rounds": 0}, "rounds must be a whole number of at least 1 per host, got 0"),
    ({"warmup_requests": -1}, "warmup_requests must be a whole number of at least 0, got -1"),
    ({"workload": {"num_prompts": 0}}, "workload num_prompts must be a whole number of at least 1, got 0"),
    ({"workload": {"prompts_file": "/nonexistent/p.jsonl"}}, "cannot read the prompts file /nonexistent/p.jsonl"),
    ({"thresholds": {"max_throughput_drop": "50"}}, "threshold max_throughput_drop must be at least 0 and below 1"),
])
def test_bad_inputs_are_refused_before_any_request(monkeypatch, change, message):
    monkeypatch.setattr(_bench, "benchmark", lambda *a, **k: pytest.fail("a request was sent"))
    args = dict({"canary": CANARY, "baseline": BASELINE}, **change)
    with pytest.raises(AnalysisError) as failed:
        Analysis.prepare(args, clients={"canary": FakeHost(), "baseline": FakeHost()})
    assert str(failed.value).startswith(message)


def test_defaults_and_names():
    prepared = Analysis.prepare({"canary": {"url": "http://10.0.0.1:30000"}, "baseline": BASELINE},
                                clients={"canary": FakeHost(), "baseline": FakeHost()})
    assert prepared.rounds == 6 and prepared.warmup_requests == 8 and prepared.workload == _bench.DEFAULT_WORKLOAD
    assert prepared.targets["canary"].name == "10.0.0.1:30000"
    assert 1 <= prepared.first_round < 10 ** 6


# --------------------------------------------------------------------------------------- run

def test_a_slower_canary_is_a_regression_from_abba_rounds_after_a_warmup(monkeypatch):
    prepared, bench, hosts, lines = analysis(monkeypatch, {"canary": 0.013, "baseline": 0.010},
                                             accept={"canary": 2.6, "baseline": 3.0})
    result = prepared.run()
    assert result["verdict"] == "regression"
    verdicts = dict((row["metric"], row["verdict"]) for row in result["metrics"])
    assert verdicts["tpot_p50"] == "regression" and verdicts["ttft_p50"] == "pass"
    assert verdicts["accept_length"] == "regression"
    # warm-up of max_concurrency requests on each (prompt round first_round - 1), then ABBA from first_round
    assert bench.calls[:2] == [("canary", 999, 4), ("baseline", 999, 4)]
    assert [(role, index) for role, index, dummy in bench.calls[2:]] == [
        (role, 1000 + index) for role, index in _canary.abba(6)]
    assert result["prompt_rounds"] == [1000, 1005] and result["schedule"] == "ABBA, canary first"
    assert [r["round"] for r in result["canary"]["rounds"]] == [1, 2, 3, 4, 5, 6]
    assert result["canary"]["figures"]["completed"] == 6 * 24 and result["canary"]["url"] == "http://10.0.0.1:30000"
    assert lines[0] == "warm-up canary gpu-1: 4/4 requests answered"
    assert lines[2].startswith("round 1/6 (1 of 12) canary gpu-1: ") and len(lines) == 14
    tpot = next(row for row in result["metrics"] if row["metric"] == "tpot_p50")
    assert tpot["spread"]["kind"] == "interquartile range of the requests"
    assert tpot["spread"]["canary"][0] < 13.0 < tpot["spread"]["canary"][1]


def test_equal_hosts_pass(monkeypatch):
    prepared = analysis(monkeypatch, {"canary": 0.010, "baseline": 0.010}, accept={"canary": 3.0, "baseline": 3.0})[0]
    result = prepared.run()
    assert result["verdict"] == "pass", result["message"]


def test_other_traffic_is_the_counters_delta_minus_the_analysis_own_requests(monkeypatch):
    prepared, bench, hosts, lines = analysis(monkeypatch, {"canary": 0.010, "baseline": 0.010}, other=(7, 0),
                                             router=FakeRouter(["http://10.0.0.1:30000"]))
    traffic = prepared.run()["traffic"]
    # /metrics is read before and after the window; the fake adds 7 other requests at each read: 7 between
    assert traffic["canary"]["requests"] == 7 and traffic["canary"]["generation_tokens"] == 700
    assert traffic["baseline"]["requests"] == 0
    assert traffic["canary"]["in_router"] is True and traffic["baseline"]["in_router"] is False
    assert traffic["summary"] == "canary gpu-1 7 requests, baseline gpu-2 0 requests"
    assert traffic["router_error"] is None


def test_traffic_is_unknown_without_metrics_or_router(monkeypatch):
    prepared = analysis(monkeypatch, {"canary": 0.010, "baseline": 0.010}, metrics=False,
                        router=FakeRouter(error="listing the router's workers at http://r/workers: connection refused"))[0]
    traffic = prepared.run()["traffic"]
    assert traffic["canary"]["requests"] is None and traffic["canary"]["in_router"] is None
    assert traffic["canary"]["note"] == ('unknown: /metrics answered HTTP 404 {"detail":"Not Found"} '
                                         "(SGLang runs without --enable-metrics?)")
    assert traffic["summary"] == "canary gpu-1 unknown, baseline gpu-2 unknown"
    assert "connection refused" in traffic["router_error"]


def test_a_canary_that_fails_every_request_stops_the_analysis_as_a_regression(monkeypatch):
    prepared, bench, hosts, lines = analysis(monkeypatch, {"canary": 0.010, "baseline": 0.010},
                                             fail={"canary": "HTTP 500 Internal Server Error"}, warmup_requests=0)
    result = prepared.run()
    assert len(bench.calls) == 1  # round 1 of the canary, nothing after
    assert result["verdict"] == "regression"
    assert result["critical"] == ["the canary failed 24 request(s) (100%), the baseline none: HTTP 500 Internal "
                                  "Server Error"]
    assert "stopped after round 1: every request to the canary failed (HTTP 500 Internal Server Error)" in \
        result["message"]


def test_an_inconclusive_message_carries_the_router_traffic(monkeypatch):
    prepared = analysis(monkeypatch, {"canary": 0.010, "baseline": 0.010}, rounds=3, other=(50, 2))[0]
    result = prepared.run()
    assert result["verdict"] == "inconclusive"
    assert result["message"].endswith("Router traffic during the window: canary gpu-1 50 requests, baseline gpu-2 "
                                      "2 requests.")


def test_counters_are_summed_over_series_and_missing_counters_are_none():
    assert _canary.parse_counters(metrics_text(10, 500, ranks=2)) == {"requests": 10.0, "generation_tokens": 500.0}
    assert _canary.parse_counters("sglang:num_requests_total 3\n") == {"requests": 3.0, "generation_tokens": None}
    counters, why = _canary.read_counters(type("C", (), {"get": lambda self, p, t=None: Response(HTTP, 200, "x 1\n")})())
    assert counters is None and why == "/metrics has no sglang:num_requests_total"


# ------------------------------------------------------------------------------------ report

@pytest.fixture
def regression(monkeypatch):
    prepared = analysis(monkeypatch, {"canary": 0.013, "baseline": 0.010}, accept={"canary": 2.6, "baseline": 3.0},
                        router=FakeRouter(["http://10.0.0.1:30000", "http://10.0.0.2:30000"]))[0]
    return prepared.run()


def test_the_report_has_json_markdown_and_a_chart_and_no_key(regression, tmp_path):
    report = _canary.write_report(regression, str(tmp_path / "out"))
    assert report == {"json": str(tmp_path / "out" / "canary-analysis.json"),
                      "markdown": str(tmp_path / "out" / "canary-analysis.md"),
                      "png": str(tmp_path / "out" / "canary-analysis.png"), "chart": "Chart: canary-analysis.png."}
    data = json.loads((tmp_path / "out" / "canary-analysis.json").read_text())
    assert data["verdict"] == "regression" and data["report"] == report
    md = (tmp_path / "out" / "canary-analysis.md").read_text()
    assert md.startswith("# Canary analysis: gpu-1 against gpu-2\n\n**Verdict: REGRESSION** - ")
    assert "| metric | baseline gpu-2 | canary gpu-1 | change | threshold | p | 95% interval of the shift | samples | " \
           "verdict |" in md
    tpot = next(line for line in md.splitlines() if line.startswith("| TPOT p50 (ms) |"))
    assert tpot.endswith("| 144 / 144 requests | **regression** |") and "| +5.0% |" in tpot
    assert "| output throughput (tok/s) |" in md and "| -5.0% |" in md  # a drop reads as a negative threshold
    assert "| canary gpu-1 | yes | 0 | 0 |  |" in md
    assert (tmp_path / "out" / "canary-analysis.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for path in (tmp_path / "out").iterdir():
        assert KEY.encode() not in path.read_bytes(), path


def test_without_matplotlib_the_chart_is_skipped_and_said_so(regression, tmp_path, monkeypatch):
    missing = "Traceback...\nModuleNotFoundError: No module named 'matplotlib'\n"
    monkeypatch.setattr(_report, "matplotlib_missing", lambda: missing)
    report = _canary.write_report(regression, str(tmp_path))
    assert report["png"] is None and report["chart"] == (
        "The chart was skipped: matplotlib is not installed where the analysis ran (ModuleNotFoundError: No module "
        "named 'matplotlib').")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["canary-analysis.json", "canary-analysis.md"]
    assert report["chart"] in (tmp_path / "canary-analysis.md").read_text()


def test_check_mode_writes_nothing_and_chart_false_draws_nothing(regression, tmp_path):
    report = _canary.write_report(regression, str(tmp_path / "none"), check_mode=True)
    assert not (tmp_path / "none").exists() and report["png"] == str(tmp_path / "none" / "canary-analysis.png")
    report = _canary.write_report(regression, str(tmp_path), chart=False)
    assert report["png"] is None and report["chart"] == "The chart was not asked for (chart: false)."


def test_the_result_never_holds_an_api_key(regression):
    assert KEY not in json.dumps(regression)
    assert regression["canary"]["name"] == "gpu-1" and "api_key" not in regression["canary"]


def test_a_host_that_joins_the_router_during_the_window_is_neither_in_nor_out():
    before = {"canary": {"in_router": False, "healthy": False}, "baseline": {"in_router": True, "healthy": True}}
    after = {"canary": {"in_router": True, "healthy": True}, "baseline": {"in_router": True, "healthy": False}}
    merged = _canary.merge_membership(before, after)
    assert merged == {"canary": {"in_router": None, "healthy": True, "router_note": "joined the router during the window"},
                      "baseline": {"in_router": True, "healthy": False}}
    hosts = {"canary": _canary.Target("canary", CANARY), "baseline": _canary.Target("baseline", BASELINE)}
    counters = {"canary": ({"requests": 5.0, "generation_tokens": 50.0}, None),
                "baseline": ({"requests": 5.0, "generation_tokens": 50.0}, None)}
    sent = dict((role, {"requests": 0, "tokens": 0}) for role in hosts)
    traffic = _canary.traffic_report(hosts, merged, None, counters, counters, sent)
    assert traffic["canary"]["note"] == "joined the router during the window" and traffic["canary"]["requests"] == 0
    assert "router_note" not in traffic["canary"] and traffic["baseline"]["note"] is None
