#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_canary_analysis
short_description: Prove a canary is not slower than its baseline - bench_serving's metrics, judged with statistics
version_added: 0.1.0
description:
  - Runs on the controller (an action plugin) and changes nothing on the hosts (C(changed=false)).
  - Benchmarks O(canary) (a host on the new settings) and O(baseline) (a host still on the previous ones) with the same
    O(workload) - streaming C(POST /generate) requests as SGLang's bench_serving sends them, to each host's own port -
    in O(rounds) rounds per host, interleaved canary, baseline, baseline, canary, ... (ABBA) so that machine and network
    noise hits both alike, after O(warmup_requests) unmeasured requests on each.
  - "Judges, per metric, a relative threshold AND a Mann-Whitney U test: output throughput (per-round samples), TTFT
    p50, TPOT p50 (per-request samples), E2E p99 and the mean speculative accept length (per-round samples); ITL p50
    is reported. A metric is a regression when the Hodges-Lehmann interval of the shift lies wholly on the bad side of
    zero and the change is past its threshold."
  - "Verdicts: V(regression) (a metric, failed requests on the canary while the baseline had none, or an accept-length
    collapse), V(inconclusive) (too few samples, too noisy, a change past a threshold that is not significant, one side
    without values, failed requests on both sides - the message says what to change), else V(pass)."
  - With O(router_url), says whether the router lists each host; from each host's C(/metrics) counters (SGLang's
    C(--enable-metrics)), how many other requests each served during the window - a skew is visible - or that this is
    unknown.
  - With O(report_dir), writes C(canary-analysis.json), C(canary-analysis.md) (a table per metric) and
    C(canary-analysis.png) (canary against baseline per metric with its spread, the sweep's chart style; skipped, and
    said so, when the controller has no matplotlib).
  - Never fails on a verdict; use RV(verdict). Fails on bad input before any request is sent.
  - The guide's canary analysis page (docs/docsite/rst/canary.rst) has the statistics and the defaults.
author:
  - gpufleet maintainers (@gpufleet)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
  - gpufleet.inference.attributes.controller
notes:
  - In check mode the benchmark runs (it only sends requests) and the report files are not written.
  - The judge follows Kayenta's Mann-Whitney judge (Spinnaker, Argo Rollouts) with R's C(wilcox.test) interval.
options:
  canary:
    description: The host on the new settings.
    type: dict
    required: true
    suboptions:
      name:
        description: Its name in the report (default - the URL's host and port).
        type: str
      url:
        description: Base URL of its SGLang server, for example C(http://10.0.0.11:30000) (its own port, not the router).
        type: str
        required: true
      api_key:
        description: "Its C(--api-key), sent as C(Authorization: Bearer <api_key>)."
        type: str
  baseline:
    description: A host that still runs the previous settings; same suboptions as O(canary).
    type: dict
    required: true
    suboptions:
      name:
        description: Its name in the report.
        type: str
      url:
        description: Base URL of its SGLang server.
        type: str
        required: true
      api_key:
        description: Its C(--api-key).
        type: str
  workload:
    description:
      - The requests of one round, the same on both hosts; keys as M(gpufleet.inference.sglang_bench)'s options -
        C(num_prompts) (32), C(max_concurrency) (8), C(request_rate) (C(inf), or requests per second as a Poisson
        process), C(input_len) (256 words of the built-in prompts), C(output_len) (256), C(seed) (42),
        C(temperature) (0.0), C(ignore_eos) (true), C(prompts_file) (on the controller - C(.jsonl) with C(prompt) and
        optional C(output_len) per line, or one prompt per line).
      - Each analysis draws its own built-in prompts, so no host answers from a prefix cache of an earlier analysis.
    type: dict
    default: {}
  rounds:
    description:
      - Rounds per host (each host runs O(workload) this many times). At least 4 for the per-round metrics to be
        able to reach significance at 95 %.
    type: int
    default: 6
  warmup_requests:
    description: Unmeasured requests sent to each host first (default - the workload's C(max_concurrency)).
    type: int
  thresholds:
    description:
      - The judge's limits, as fractions (V(0.05)) or percentages (V('5%')); V(null) reports a metric without judging it.
      - C(max_throughput_drop) (5%), C(max_ttft_p50_increase) (10%), C(max_tpot_p50_increase) (5%),
        C(max_itl_p50_increase) (null), C(max_e2e_p99_increase) (10%), C(max_accept_length_drop) (5%).
      - C(accept_length_collapse) (50% - a canary accept length below this share of the baseline's is a regression
        outright), C(max_canary_failed_requests) (0 - more failed requests on the canary while the baseline had none is
        a regression outright), C(confidence) (95% - of the interval), C(min_requests) (20 - per side, for the
        per-request metrics).
    type: dict
    default: {}
  router_url:
    description: The router's base URL, to say whether it lists each host during the window.
    type: str
  router_api_key:
    description: The router's control-plane key.
    type: str
  report_dir:
    description: Where to write the report files on the controller (created when missing); no files without it.
    type: path
  chart:
    description: Whether to draw C(canary-analysis.png) (needs matplotlib on the controller).
    type: bool
    default: true
  timeout:
    description: Seconds a request may wait for the next byte of its answer before it fails.
    type: float
    default: 300
  validate_certs:
    description: Whether to validate TLS certificates of C(https) URLs.
    type: bool
    default: true
seealso:
  - module: gpufleet.inference.sglang_bench
"""

EXAMPLES = r"""
- name: Is the canary slower than a host on the previous settings?
  gpufleet.inference.sglang_canary_analysis:
    canary:
      name: "{{ inventory_hostname }}"
      url: "{{ sglang_endpoint.worker_url }}"
      api_key: "{{ sglang_api_key | default(omit, true) }}"
    baseline:
      name: "{{ baseline_host }}"
      url: "{{ hostvars[baseline_host].sglang_endpoint.worker_url }}"
      api_key: "{{ hostvars[baseline_host].sglang_api_key | default(omit, true) }}"
    workload: {num_prompts: 32, max_concurrency: 8, input_len: 512, output_len: 256}
    rounds: 6
    thresholds: {max_throughput_drop: 5%, max_tpot_p50_increase: 5%}
    router_url: "{{ sglang_router_url | default(omit, true) }}"
    report_dir: "{{ playbook_dir }}/results/canary"
  register: analysis

- name: Stop on a regression
  ansible.builtin.fail:
    msg: "{{ analysis.message }}"
  when: analysis.verdict == 'regression'
"""

RETURN = r"""
verdict:
  description: V(pass), V(regression) or V(inconclusive).
  returned: always
  type: str
  sample: regression
message:
  description: The verdict and why (the regressions and inconclusive metrics, critical findings, what to change).
  returned: always
  type: str
  sample: "regression: TPOT p50 +31.2% past the threshold +5.0%, significant (p=2e-33, 95% interval +28.9%..+32.1%)"
metrics:
  description:
    - One row per metric - C(metric), C(label), C(unit), C(samples) (requests or rounds), C(better) (lower or higher),
      C(baseline) and C(canary) (median, accept length - mean), C(change) (relative), C(threshold), C(p_value),
      C(ci) (the shift's interval relative to the baseline), C(n_baseline), C(n_canary), C(verdict) (pass,
      regression, inconclusive, info, not measured), C(reason), C(spread) (what the chart draws).
  returned: always
  type: list
  elements: dict
critical:
  description: Findings that decide whatever the statistics say (failed requests, an accept-length collapse).
  returned: always
  type: list
  elements: str
advice:
  description: What to change for an inconclusive analysis to decide.
  returned: always
  type: list
  elements: str
canary:
  description:
    - C(name), C(url), C(figures) (bench_serving's figures over all its measured requests, as
      M(gpufleet.inference.sglang_bench) returns them) and C(rounds) (each round's figures, in run order).
  returned: always
  type: dict
baseline:
  description: The same for the baseline.
  returned: always
  type: dict
traffic:
  description:
    - Per side (C(canary), C(baseline)) - C(in_router) (null without O(router_url)), C(healthy), C(requests) and
      C(generation_tokens) served to other clients during the window (C(/metrics) counters minus the analysis's own;
      null and a C(note) when unknown); C(summary) in words; C(router_error).
  returned: always
  type: dict
workload:
  description: The workload as run (defaults filled in).
  returned: always
  type: dict
thresholds:
  description: The thresholds as judged (defaults filled in, fractions).
  returned: always
  type: dict
rounds:
  description: Rounds per host.
  returned: always
  type: int
prompt_rounds:
  description: The first and last round numbers of the built-in prompts (C(seed) and these reproduce the prompts).
  returned: always
  type: list
  elements: int
duration:
  description: Seconds the analysis took.
  returned: always
  type: float
report:
  description: C(json), C(markdown) and C(png) paths (C(png) null when no chart), and C(chart) - what became of it.
  returned: when O(report_dir) is set
  type: dict
"""
