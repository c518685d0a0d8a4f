#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_bench
short_description: Benchmark an SGLang server as SGLang's bench_serving does (streaming, TTFT, TPOT, ITL)
version_added: 0.1.0
description:
  - Sends O(num_prompts) streaming C(POST /generate) requests to an SGLang server (or a router in front of servers),
    at most O(max_concurrency) in flight and, with a finite O(request_rate), arriving as a Poisson process - the
    requests of C(python -m sglang.bench_serving --backend sglang).
  - Reports bench_serving's figures under bench_serving's names - output, request, input and total token throughput;
    mean, median, standard deviation, p90, p95 and p99 of the time to first token (TTFT), the time per output token
    (TPOT), the inter-token latency (ITL) and the end-to-end latency, in milliseconds - and the mean speculative
    accept length of the requests (each request's final C(meta_info.spec_accept_length)).
  - The prompts are built-in (seeded random words, O(input_len) words each, the same for the same O(seed)), from
    O(prompts), or from O(prompts_file). Every answer is O(output_len) tokens long (C(ignore_eos)).
  - "A request counts as failed on an HTTP error, a refused or broken connection, a read timeout, an error or abort
    inside the stream, a stream without text, or one that ends before C(data: [DONE])."
  - Needs nothing beyond Python's standard library; runs on a managed host or on the controller
    (C(delegate_to=localhost)). Fails when every request fails. Never changes anything.
author:
  - gpufleet maintainers (@gpufleet)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details:
      - Sending requests changes nothing, so the benchmark runs in check mode too.
  diff_mode:
    support: none
  platform:
    platforms: posix
options:
  url:
    description:
      - Base URL of the SGLang server or router, for example C(http://10.0.0.11:30000).
    type: str
    required: true
  api_key:
    description:
      - "The server's C(--api-key), sent as C(Authorization: Bearer <api_key>)."
    type: str
  num_prompts:
    description:
      - How many requests to send.
    type: int
    default: 32
  max_concurrency:
    description:
      - How many requests are in flight at most (bench_serving's C(--max-concurrency)).
    type: int
    default: 8
    aliases: [concurrency]
  request_rate:
    description:
      - Requests per second, arriving as a Poisson process seeded by O(seed); C(inf) sends them all at once (bounded
        by O(max_concurrency)).
    type: str
    default: inf
  input_len:
    description:
      - Words of each built-in prompt (about one token each; the server reports the real count). Ignored with
        O(prompts) or O(prompts_file).
    type: int
    default: 256
  output_len:
    description:
      - C(sampling_params.max_new_tokens) of every request (a prompts file line may set its own).
    type: int
    default: 256
    aliases: [max_new_tokens]
  prompts:
    description:
      - Prompts used in turn, one per request, instead of the built-in ones.
    type: list
    elements: str
  prompts_file:
    description:
      - A file of prompts, read where the module runs. C(.jsonl) - one JSON object per line with C(prompt) and
        optionally C(output_len); any other name - one prompt per non-empty line.
    type: path
  seed:
    description:
      - Seed of the built-in prompts and of the arrival times.
    type: int
    default: 42
  temperature:
    description:
      - C(sampling_params.temperature) of every request.
    type: float
    default: 0.0
  timeout:
    description:
      - Seconds a request may wait for the next byte of its answer before it fails.
    type: float
    default: 300
  details:
    description:
      - Also return the per-request values (RV(details)), as bench_serving's C(--output-details).
    type: bool
    default: false
  validate_certs:
    description:
      - Whether to validate TLS certificates when O(url) is C(https).
    type: bool
    default: true
notes:
  - The requests and the figures are those of SGLang's C(python -m sglang.bench_serving --backend sglang)
    (C(sglang/benchmark/serving.py)); the guide's canary analysis page (docs/docsite/rst/canary.rst) lists the definitions.
"""

EXAMPLES = r"""
- name: Benchmark the host's server
  gpufleet.inference.sglang_bench:
    url: "http://{{ sglang_host }}:30000"
    num_prompts: 64
    max_concurrency: 8
    input_len: 512
    output_len: 512
  delegate_to: localhost
  register: bench

- name: Show the figures
  ansible.builtin.debug:
    msg: >-
      {{ bench.output_throughput }} tok/s, TTFT p50 {{ bench.median_ttft_ms }} ms, TPOT p50 {{ bench.median_tpot_ms }} ms,
      accept length {{ bench.accept_length }}
"""

RETURN = r"""
completed:
  description: Requests that succeeded.
  returned: always
  type: int
  sample: 64
failed_requests:
  description: Requests that failed (see the module's description).
  returned: always
  type: int
  sample: 0
errors:
  description: The first few distinct error messages.
  returned: always
  type: list
  elements: str
  sample: ["HTTP 503 "]
duration:
  description: Seconds from the first request sent to the last answer read.
  returned: always
  type: float
  sample: 12.5
total_input_tokens:
  description: Sum of the successful requests' C(meta_info.prompt_tokens).
  returned: always
  type: int
  sample: 16384
total_output_tokens:
  description: Sum of the successful requests' C(meta_info.completion_tokens).
  returned: always
  type: int
  sample: 32768
output_throughput:
  description: RV(total_output_tokens) per second of RV(duration).
  returned: always
  type: float
  sample: 2621.44
request_throughput:
  description: RV(completed) per second.
  returned: always
  type: float
  sample: 5.12
input_throughput:
  description: RV(total_input_tokens) per second.
  returned: always
  type: float
total_throughput:
  description: Input and output tokens per second.
  returned: always
  type: float
mean_ttft_ms:
  description:
    - Time to first token (first chunk with text), in ms; the same statistics are returned as C(median_ttft_ms),
      C(std_ttft_ms), C(p90_ttft_ms), C(p95_ttft_ms), C(p99_ttft_ms). Null when no request succeeded.
  returned: always
  type: float
  sample: 61.2
median_tpot_ms:
  description:
    - Median time per output token after the first, in ms; also C(mean_tpot_ms), C(std_tpot_ms), C(p90_tpot_ms),
      C(p95_tpot_ms), C(p99_tpot_ms).
  returned: always
  type: float
  sample: 7.4
median_itl_ms:
  description:
    - Median inter-token latency over every token (a chunk's gap split over its tokens), in ms; also C(mean_itl_ms),
      C(std_itl_ms), C(p90_itl_ms), C(p95_itl_ms), C(p99_itl_ms), C(max_itl_ms).
  returned: always
  type: float
  sample: 6.9
p99_e2e_latency_ms:
  description:
    - 99th percentile end-to-end latency, in ms; also C(mean_e2e_latency_ms), C(median_e2e_latency_ms),
      C(std_e2e_latency_ms), C(p90_e2e_latency_ms), C(p95_e2e_latency_ms).
  returned: always
  type: float
  sample: 1950.0
concurrency:
  description: Sum of the end-to-end latencies over RV(duration) (bench_serving's measured concurrency).
  returned: always
  type: float
  sample: 7.8
accept_length:
  description:
    - Mean of the requests' C(meta_info.spec_accept_length) (completion tokens per verify step); null without
      speculative decoding.
  returned: always
  type: float
  sample: 3.21
details:
  description: Per request, in seconds - C(ttfts), C(itls), C(e2e_latencies), C(output_lens), C(accept_lengths), C(errors).
  returned: when O(details=true)
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.inference.plugins.module_utils._bench import (
    Prompt,
    WorkloadError,
    benchmark,
    check_workload,
    load_prompts_file,
)
from ansible_collections.gpufleet.inference.plugins.module_utils._http import HttpClient

WORKLOAD_OPTIONS = ("num_prompts", "max_concurrency", "request_rate", "input_len", "output_len", "seed", "temperature")


def run(params, client=None):
    """The benchmark as a plain function: the figures (the caller decides about failure). Raises
    WorkloadError for a workload that cannot run."""
    workload = check_workload(dict((name, params[name]) for name in WORKLOAD_OPTIONS))
    file_prompts = None
    if params.get("prompts"):
        file_prompts = [Prompt(text, workload["output_len"]) for text in params["prompts"]]
    elif params.get("prompts_file"):
        file_prompts = load_prompts_file(params["prompts_file"], workload["output_len"])
    client = client or HttpClient(params["url"], params.get("api_key"), params["validate_certs"])
    figures, dummy = benchmark(client, workload, 0, params["timeout"], file_prompts, params["details"])
    return figures


ARGUMENT_SPEC = dict(
    url=dict(type="str", required=True),
    api_key=dict(type="str", no_log=True),
    num_prompts=dict(type="int", default=32),
    max_concurrency=dict(type="int", default=8, aliases=["concurrency"]),
    request_rate=dict(type="str", default="inf"),
    input_len=dict(type="int", default=256),
    output_len=dict(type="int", default=256, aliases=["max_new_tokens"], no_log=False),
    prompts=dict(type="list", elements="str"),
    prompts_file=dict(type="path"),
    seed=dict(type="int", default=42),
    temperature=dict(type="float", default=0.0),
    timeout=dict(type="float", default=300),
    details=dict(type="bool", default=False),
    validate_certs=dict(type="bool", default=True),
)


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, mutually_exclusive=[("prompts", "prompts_file")],
                           supports_check_mode=True)
    params = module.params
    if params["prompts"] is not None and not params["prompts"]:
        module.fail_json(msg="prompts must not be empty")
    try:
        result = run(params)
    except WorkloadError as exc:
        module.fail_json(msg=str(exc))
    if result["completed"] == 0:
        module.fail_json(msg="all %s requests to %s/generate failed: %s"
                         % (result["failed_requests"], params["url"].rstrip("/"), "; ".join(result["errors"])),
                         changed=False, **result)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
