# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The canary analysis: benchmark a canary and its baseline alike, judge, report.

Private to this collection: no compatibility promise. Used by the action plugin
gpufleet.inference.sglang_canary_analysis (on the controller); docs/docsite/rst/canary.rst explains it.

- Both hosts get the same workload (_bench): round k sends the same prompts to both. Rounds are
  interleaved canary, baseline, baseline, canary, canary, ... (ABBA), so a slow minute of the machine
  or the network hits both sides alike; warm-up requests go to both first and are not measured.
  Each analysis draws its own built-in prompts (its rounds are numbered from a random start, kept in
  the result): a baseline that served an earlier analysis must not answer from its prefix cache
  while the freshly restarted canary computes every prompt.
- Samples for the judge (_canary_judge): every request's TTFT, TPOT and median ITL (all rounds pooled) and
  every round's output throughput, E2E p99 and mean accept length.
- Traffic: each host's /metrics counters (sglang:num_requests_total, sglang:generation_tokens_total)
  before and after the window, minus what the analysis itself sent, is what other clients (the
  router) made the host serve meanwhile; "unknown" when /metrics is off. With a router URL, whether
  the router lists each host is said too.
- Report: the result as JSON, a Markdown table and a PNG chart (matplotlib optional: without it the
  report says the chart was skipped and why).
"""
from __future__ import annotations

import datetime
import json
import os
import random
import re
import time

from ansible_collections.gpufleet.inference.plugins.module_utils import _bench, _canary_judge, _report, _stats
from ansible_collections.gpufleet.inference.plugins.module_utils._files import write_atomic
from ansible_collections.gpufleet.inference.plugins.module_utils._http import HttpClient
from ansible_collections.gpufleet.inference.plugins.module_utils._router import (
    RouterClient,
    RouterError,
    find_worker,
    normalize_url,
)

CANARY = "canary"
BASELINE = "baseline"
REPORT_NAME = "canary-analysis"
DEFAULT_ROUNDS = 6

# The round figures kept per round in the result and the report.
ROUND_FIGURES = ("output_throughput", "median_ttft_ms", "median_tpot_ms", "p99_e2e_latency_ms", "accept_length",
                 "completed", "failed_requests", "duration")


class AnalysisError(ValueError):
    """Inputs the analysis cannot run with (said before any request is sent)."""


class Target(object):
    def __init__(self, role, spec):
        spec = dict(spec or {})
        url = normalize_url(spec.get("url") or "")
        if not re.match(r"^https?://[^/]+", url):
            raise AnalysisError("%s.url must be the server's base URL like http://10.0.0.11:30000, got %r"
                                % (role, spec.get("url")))
        self.role = role
        self.url = url
        self.name = spec.get("name") or re.sub(r"^https?://", "", url)
        self.api_key = spec.get("api_key") or None

    def public(self):
        return {"name": self.name, "url": self.url}


def abba(rounds):
    """(role, round index) in run order: canary, baseline | baseline, canary | canary, baseline ..."""
    order = []
    for index in range(rounds):
        pair = (CANARY, BASELINE) if index % 2 == 0 else (BASELINE, CANARY)
        order.extend((role, index) for role in pair)
    return order


# --------------------------------------------------------------------------------------- traffic

_COUNTER = re.compile(r"^(sglang[:_](?:num_requests_total|generation_tokens_total))(?:\{[^}]*\})?\s+([0-9.eE+-]+)\s*$",
                      re.M)


def parse_counters(text):
    """{"requests": n, "generation_tokens": n} summed over every series (ranks, labels); a counter
    that is absent is None."""
    sums = {}
    for name, value in _COUNTER.findall(text or ""):
        key = "requests" if name.endswith("num_requests_total") else "generation_tokens"
        sums[key] = sums.get(key, 0.0) + float(value)
    return {"requests": sums.get("requests"), "generation_tokens": sums.get("generation_tokens")}


def read_counters(client, timeout=10.0):
    """(counters or None, why not) from the host's /metrics."""
    resp = client.get("/metrics", timeout)
    if resp.status != 200:
        hint = " (SGLang runs without --enable-metrics?)" if resp.status == 404 else ""
        return None, "/metrics answered %s%s" % (resp.describe(), hint)
    counters = parse_counters(resp.text)
    if counters["requests"] is None:
        return None, "/metrics has no sglang:num_requests_total"
    return counters, None


def _delta(after, before, ours):
    if after is None or before is None:
        return None
    return max(0, int(round(after - before)) - ours)


class Analysis(object):
    """One canary analysis. ``prepare`` checks everything, ``run`` benchmarks and judges."""

    def __init__(self, canary, baseline, workload, rounds, warmup_requests, thresholds, router=None, timeout=300.0,
                 file_prompts=None, clients=None, progress=None, clock=None, first_round=None):
        self.targets = {CANARY: canary, BASELINE: baseline}
        self.workload = workload
        self.rounds = rounds
        self.warmup_requests = warmup_requests
        self.thresholds = thresholds
        self.router = router
        self.timeout = timeout
        self.file_prompts = file_prompts
        self.clients = clients
        self.progress = progress or (lambda message: None)
        self.clock = clock or time.time
        self.first_round = random.Random().randrange(1, 10 ** 6) if first_round is None else first_round

    # ---------------------------------------------------------------------------- inputs
    @classmethod
    def prepare(cls, params, clients=None, progress=None, router=None, first_round=None):
        """An Analysis from the action's parameters, or AnalysisError naming what is wrong."""
        canary = Target(CANARY, params.get("canary"))
        baseline = Target(BASELINE, params.get("baseline"))
        if canary.url == baseline.url:
            raise AnalysisError("canary and baseline are the same server (%s): the baseline must be a host that still "
                                "runs the previous settings" % canary.url)
        try:
            workload = _bench.check_workload(params.get("workload"))
            file_prompts = None
            if workload["prompts_file"]:
                file_prompts = _bench.load_prompts_file(workload["prompts_file"], workload["output_len"])
            thresholds = _canary_judge.check_thresholds(params.get("thresholds"))
        except (_bench.WorkloadError, _canary_judge.ThresholdError) as exc:
            raise AnalysisError(str(exc))
        rounds = params.get("rounds", DEFAULT_ROUNDS)
        if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
            raise AnalysisError("rounds must be a whole number of at least 1 per host, got %r" % (rounds,))
        warmup = params.get("warmup_requests")
        warmup = workload["max_concurrency"] or workload["num_prompts"] if warmup is None else warmup
        if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
            raise AnalysisError("warmup_requests must be a whole number of at least 0, got %r" % (warmup,))
        validate = params.get("validate_certs", True)
        if router is None and params.get("router_url"):
            router = RouterClient(params["router_url"], params.get("router_api_key"), timeout=10.0)
        clients = clients or dict((role, HttpClient(target.url, target.api_key, validate))
                                  for role, target in ((CANARY, canary), (BASELINE, baseline)))
        return cls(canary, baseline, workload, rounds, warmup, thresholds, router, params.get("timeout", 300.0),
                   file_prompts, clients, progress, first_round=first_round)

    # ------------------------------------------------------------------------------- run
    def _bench(self, role, round_index, workload=None):
        return _bench.benchmark(self.clients[role], workload or self.workload, self.first_round + round_index,
                                self.timeout, self.file_prompts)

    def _side(self, role, rounds, results):
        return dict(self.targets[role].public(), figures=pooled_figures(results[role], rounds[role]),
                    rounds=rounds[role])

    def _membership(self):
        if self.router is None:
            return dict((role, None) for role in self.targets), None
        try:
            workers = self.router.list_workers()
        except RouterError as exc:
            return dict((role, None) for role in self.targets), str(exc)
        found = {}
        for role, target in self.targets.items():
            worker = find_worker(workers, target.url)
            found[role] = {"in_router": worker is not None, "healthy": bool(worker and worker["healthy"])}
        return found, None

    def run(self):
        started = self.clock()
        started_at = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        membership, router_error = self._membership()
        counters_before = dict((role, read_counters(self.clients[role])) for role in self.targets)
        sent = dict((role, {"requests": 0, "tokens": 0}) for role in self.targets)
        if self.warmup_requests:
            warm = dict(self.workload, num_prompts=self.warmup_requests)
            for role in (CANARY, BASELINE):
                figures, dummy = self._bench(role, -1, warm)
                sent[role]["requests"] += figures["completed"]
                sent[role]["tokens"] += figures["total_output_tokens"]
                self.progress("warm-up %s %s: %d/%d requests answered" % (
                    role, self.targets[role].name, figures["completed"], self.warmup_requests))
        rounds = dict((role, []) for role in self.targets)
        results = dict((role, []) for role in self.targets)
        order = abba(self.rounds)
        stopped = None
        for step, (role, index) in enumerate(order, 1):
            figures, answers = self._bench(role, index)
            sent[role]["requests"] += figures["completed"]
            sent[role]["tokens"] += figures["total_output_tokens"]
            rounds[role].append(dict([("round", index + 1)] + [(k, figures[k]) for k in ROUND_FIGURES]
                                     + [("errors", figures["errors"])]))
            results[role].extend(answers)
            self.progress("round %d/%d (%d of %d) %s %s: %s tok/s, TPOT p50 %s ms, %d failed" % (
                index + 1, self.rounds, step, len(order), role, self.targets[role].name, figures["output_throughput"],
                figures["median_tpot_ms"], figures["failed_requests"]))
            if figures["completed"] == 0:
                stopped = "stopped after round %d: every request to the %s failed (%s)" % (
                    index + 1, role, "; ".join(figures["errors"]) or "no error text")
                break
        counters_after = dict((role, read_counters(self.clients[role])) for role in self.targets)
        membership_after, router_error_after = self._membership()
        membership = merge_membership(membership, membership_after)
        router_error = router_error or router_error_after
        sides = dict((role, side_samples(rounds[role], results[role])) for role in self.targets)
        verdict = _canary_judge.judge(sides[CANARY], sides[BASELINE], self.thresholds,
                                      {"rounds": self.rounds, "num_prompts": self.workload["num_prompts"],
                                       "max_concurrency": self.workload["max_concurrency"]})
        for row in verdict["metrics"]:
            row["spread"] = spread(row, sides)
        traffic = traffic_report(self.targets, membership, router_error, counters_before, counters_after, sent)
        message = verdict["message"]
        if stopped:
            message += " (%s)" % stopped
        if verdict["verdict"] == _canary_judge.INCONCLUSIVE and traffic["summary"]:
            message += " Router traffic during the window: %s." % traffic["summary"]
        return {
            "verdict": verdict["verdict"],
            "message": message,
            "metrics": verdict["metrics"],
            "critical": verdict["critical"],
            "advice": verdict["advice"],
            "canary": self._side(CANARY, rounds, results),
            "baseline": self._side(BASELINE, rounds, results),
            "traffic": traffic,
            "workload": self.workload,
            "rounds": self.rounds,
            "warmup_requests": self.warmup_requests,
            "thresholds": verdict["thresholds"],
            "schedule": "ABBA, canary first" + (" (%s)" % stopped if stopped else ""),
            "prompt_rounds": [self.first_round, self.first_round + self.rounds - 1],
            "started": started_at,
            "duration": round(self.clock() - started, 3),
        }


# ----------------------------------------------------------------------------------- samples

def _median_itl(result):
    return _stats.median(result.itl) if result.itl else None


def side_samples(rounds, results):
    """What the judge reads of one side: per-request values in ms, per-round figures, failures."""
    ok = [r for r in results if r.success]
    errors = []
    for result in results:
        if not result.success and result.error and result.error not in errors:
            errors.append(result.error)
    return {
        "requests": {
            "ttft_ms": [r.ttft * 1000.0 for r in ok],
            "tpot_ms": [r.tpot * 1000.0 for r in ok if r.tpot is not None],
            "itl_ms": [_median_itl(r) * 1000.0 for r in ok if r.itl],
        },
        "rounds": {
            "output_throughput": [r["output_throughput"] for r in rounds if r["completed"]],
            "p99_e2e_latency_ms": [r["p99_e2e_latency_ms"] for r in rounds if r["completed"]],
            "accept_length": [r["accept_length"] for r in rounds if r["accept_length"] is not None],
        },
        "completed": len(ok),
        "failed_requests": len(results) - len(ok),
        "errors": errors[:_bench.MAX_ERRORS],
    }


def pooled_figures(results, rounds):
    """bench_serving's figures over every measured request of a side (duration: the rounds' sum)."""
    return _bench.summarize(results, sum(r["duration"] for r in rounds))


def spread(row, sides):
    """The spread the chart draws for a metric: interquartile range of the requests, or the range of
    the rounds."""
    found = {}
    for role in (CANARY, BASELINE):
        metric = next(m for m in _canary_judge.METRICS if m.key == row["metric"])
        values = [v for v in sides[role][metric.source].get(metric.sample, []) if v is not None]
        if not values:
            found[role] = None
        elif metric.source == "requests":
            found[role] = [_stats.percentile(values, 25), _stats.percentile(values, 75)]
        else:
            found[role] = [min(values), max(values)]
    found["kind"] = "interquartile range of the requests" if row["samples"] == "requests" else "range of the rounds"
    return found


def merge_membership(before, after):
    """In the router for the whole window only when listed at its start and at its end."""
    merged = {}
    for role in before:
        first, last = before[role], after.get(role)
        if first is None or last is None:
            merged[role] = first or last
        elif first["in_router"] == last["in_router"]:
            merged[role] = {"in_router": first["in_router"], "healthy": first["healthy"] and last["healthy"]}
        else:
            moved = "left" if first["in_router"] else "joined"
            merged[role] = {"in_router": None, "healthy": last["healthy"],
                            "router_note": "%s the router during the window" % moved}
    return merged


def traffic_report(targets, membership, router_error, before, after, sent):
    """What other clients made each host serve during the window."""
    report = {"router_error": router_error}
    said = []
    for role, target in targets.items():
        counters_before, why_before = before[role]
        counters_after, why_after = after[role]
        entry = {"name": target.name, "in_router": None, "healthy": None, "requests": None, "generation_tokens": None,
                 "source": "/metrics", "note": None}
        if membership.get(role):
            entry.update(membership[role])
        note = entry.pop("router_note", None)
        if counters_before and counters_after:
            requests = _delta(counters_after["requests"], counters_before["requests"], sent[role]["requests"])
            entry["requests"] = requests
            entry["generation_tokens"] = _delta(counters_after["generation_tokens"],
                                                counters_before["generation_tokens"], sent[role]["tokens"])
            said.append("%s %s %s requests" % (role, target.name, requests))
        else:
            note = "; ".join(n for n in (note, "unknown: %s" % (why_before or why_after)) if n)
            said.append("%s %s unknown" % (role, target.name))
        entry["note"] = note
        report[role] = entry
    report["summary"] = ", ".join(said)
    return report


# ------------------------------------------------------------------------------------- report

def _cell(value, digits=1):
    if value is None:
        return "-"
    if isinstance(value, float):
        return ("%%.%df" % digits) % value
    return str(value)


def _pct(value):
    return "-" if value is None else "%+.1f%%" % (100.0 * value)


def render_markdown(result, chart_note):
    canary, baseline = result["canary"], result["baseline"]
    lines = ["# Canary analysis: %s against %s" % (canary["name"], baseline["name"]), "",
             "**Verdict: %s** - %s" % (result["verdict"].upper(), result["message"].split(": ", 1)[-1]), ""]
    header = ["metric", "baseline %s" % baseline["name"], "canary %s" % canary["name"], "change", "threshold", "p",
              "%d%% interval of the shift" % round(result["thresholds"]["confidence"] * 100), "samples", "verdict"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in result["metrics"]:
        threshold = row["threshold"]
        if threshold is not None and row["better"] == _canary_judge.HIGHER:
            threshold = -threshold
        interval = "-" if not row["ci"] else "%s..%s" % (_pct(row["ci"][0]), _pct(row["ci"][1]))
        word = row["verdict"]
        lines.append("| %s (%s) | %s | %s | %s | %s | %s | %s | %d / %d %s | %s |" % (
            row["label"], row["unit"], _cell(row["baseline"], 2), _cell(row["canary"], 2), _pct(row["change"]),
            "-" if threshold is None else _pct(threshold), "-" if row["p_value"] is None else "%.2g" % row["p_value"],
            interval, row["n_baseline"], row["n_canary"], row["samples"],
            "**%s**" % word if word in (_canary_judge.REGRESSION, _canary_judge.INCONCLUSIVE) else word))
    lines.append("")
    if result["critical"]:
        lines += ["Critical: " + "; ".join(result["critical"]), ""]
    if result["advice"]:
        lines += ["To decide: " + "; ".join(result["advice"]) + ".", ""]
    workload = result["workload"]
    lines += ["## Workload", "",
              "%s requests per round, at most %s in flight, request rate %s; %s; output_len %s, temperature %s, seed %s. "
              "%d rounds per host, %s; %d warm-up requests per host first. %s" % (
                  workload["num_prompts"], workload["max_concurrency"] or "all", workload["request_rate"],
                  "prompts from %s" % workload["prompts_file"] if workload["prompts_file"]
                  else "built-in prompts of %s words" % workload["input_len"],
                  workload["output_len"], workload["temperature"], workload["seed"], result["rounds"],
                  result["schedule"], result["warmup_requests"], chart_note), ""]
    traffic = result["traffic"]
    lines += ["## Other traffic during the window", "",
              "| host | in the router | other requests | other generation tokens | note |", "|---|---|---|---|---|"]
    for role in (CANARY, BASELINE):
        entry = traffic[role]
        in_router = {True: "yes", False: "no", None: "unknown"}[entry["in_router"]]
        cells = (role, entry["name"], in_router, _cell(entry["requests"]), _cell(entry["generation_tokens"]),
                 entry["note"] or "")
        lines.append("| %s %s | %s | %s | %s | %s |" % cells)
    if traffic.get("router_error"):
        lines.append("")
        lines.append("Router: %s" % traffic["router_error"])
    lines += ["", "## bench_serving figures over all rounds", "", "| figure | baseline | canary |", "|---|---|---|"]
    for name in _report.METRIC_FIELDS:
        lines.append("| %s | %s | %s |" % (name, _cell(baseline["figures"].get(name), 3),
                                           _cell(canary["figures"].get(name), 3)))
    lines += ["", "## Rounds (run order: %s)" % result["schedule"], "",
              "| round | host | " + " | ".join(ROUND_FIGURES) + " |", "|" + "---|" * (len(ROUND_FIGURES) + 2)]
    for role in (CANARY, BASELINE):
        for entry in result[role]["rounds"]:
            lines.append("| %d | %s | %s |" % (entry["round"], role, " | ".join(_cell(entry[k], 3) for k in ROUND_FIGURES)))
    return "\n".join(lines) + "\n"


def render_png(result):
    """Canary against baseline, one panel per metric: the value, the spread, the change and verdict."""
    rows = [row for row in result["metrics"] if row["canary"] is not None and row["baseline"] is not None]
    if not rows:
        raise _report.ReportError("no metric has values on both sides")
    columns = 3
    lines = (len(rows) + columns - 1) // columns
    figure = _report.new_figure(4.0 * columns, 3.4 * lines + 0.6)
    figure.suptitle("Canary %s vs baseline %s: %s" % (result["canary"]["name"], result["baseline"]["name"],
                                                      result["verdict"].upper()),
                    color=_report.VERDICT_COLORS.get(result["verdict"], "black"))
    for index, row in enumerate(rows):
        axes = figure.add_subplot(lines, columns, index + 1)
        values = [row["baseline"], row["canary"]]
        low_high = [row["spread"].get(BASELINE), row["spread"].get(CANARY)]
        errors = [[max(0.0, v - (s or [v, v])[0]) for v, s in zip(values, low_high)],
                  [max(0.0, (s or [v, v])[1] - v) for v, s in zip(values, low_high)]]
        axes.bar([0, 1], values, color=[_report.BAR_COLOR, _report.HIGHLIGHT_COLOR], yerr=errors, capsize=4,
                 ecolor="#333333")
        axes.set_xticks([0, 1])
        axes.set_xticklabels(["baseline\n%s" % result["baseline"]["name"], "canary\n%s" % result["canary"]["name"]],
                             fontsize=7)
        axes.set_title("%s (%s)\n%s: %s" % (row["label"], row["unit"], _pct(row["change"]), row["verdict"]),
                       fontsize=9, color=_report.VERDICT_COLORS.get(row["verdict"], "black"))
        axes.tick_params(axis="y", labelsize=7)
        _report.annotate_bars(axes, [0, 1], values, [v + e for v, e in zip(values, errors[1])])
    figure.text(0.5, 0.005, "bars: median (accept length: mean); whiskers: interquartile range of the requests or "
                "range of the rounds", ha="center", fontsize=7)
    return _report.png_bytes(figure)


def write_report(result, report_dir, chart=True, check_mode=False):
    """canary-analysis.json, .md and .png in report_dir; returns the paths and what became of the chart."""
    paths = dict((kind, os.path.join(report_dir, "%s.%s" % (REPORT_NAME, kind))) for kind in ("json", "md", "png"))
    png = None
    if not chart:
        chart_note = "The chart was not asked for (chart: false)."
    else:
        missing = _report.matplotlib_missing()
        if missing:
            chart_note = "The chart was skipped: matplotlib is not installed where the analysis ran (%s)." % (
                missing.strip().splitlines()[-1])
        else:
            try:
                png = render_png(result)
                chart_note = "Chart: %s.png." % REPORT_NAME
            except _report.ReportError as exc:
                chart_note = "The chart was skipped: %s." % exc
    report = {"json": paths["json"], "markdown": paths["md"], "png": paths["png"] if png else None, "chart": chart_note}
    outputs = {paths["json"]: (json.dumps(dict(result, report=report), indent=2, sort_keys=True) + "\n").encode("utf-8"),
               paths["md"]: render_markdown(result, chart_note).encode("utf-8")}
    if png:
        outputs[paths["png"]] = png
    if not check_mode:
        if not os.path.isdir(report_dir):
            os.makedirs(report_dir)
        for path, data in sorted(outputs.items()):
            write_atomic(path, data, 0o644)
    return report
