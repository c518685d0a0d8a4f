#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_bench
short_description: Benchmark an SGLang server with concurrent /generate requests
version_added: 0.1.0
description:
  - Sends O(num_prompts) C(POST /generate) requests to an SGLang server (or a router in front of servers), keeping
    O(concurrency) requests in flight, and reports throughput, latency percentiles and the mean speculative
    accept length (C(meta_info.spec_accept_length)).
  - Meant for the controller, with C(delegate_to=localhost); needs nothing beyond Python's standard library.
  - Fails when every request fails. Never changes anything (C(changed) is always false).
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
      - How many requests to send in total.
    type: int
    default: 32
  concurrency:
    description:
      - How many requests are in flight at once.
    type: int
    default: 4
  max_new_tokens:
    description:
      - C(sampling_params.max_new_tokens) of every request.
    type: int
    default: 256
  prompt:
    description:
      - The prompt of every request when O(prompts) is not given.
    type: str
    default: Explain speculative decoding in three sentences.
  prompts:
    description:
      - Prompts used in turn, one per request; replaces O(prompt).
    type: list
    elements: str
  temperature:
    description:
      - C(sampling_params.temperature) of every request.
    type: float
    default: 0.0
  timeout:
    description:
      - Timeout of each request, in seconds.
    type: float
    default: 300
  validate_certs:
    description:
      - Whether to validate TLS certificates when O(url) is C(https).
    type: bool
    default: true
"""

EXAMPLES = r"""
- name: Benchmark the host's server
  gpufleet.inference.sglang_bench:
    url: "http://{{ sglang_host }}:30000"
    num_prompts: 64
    concurrency: 8
    max_new_tokens: 512
  delegate_to: localhost
  register: bench

- name: Show the throughput
  ansible.builtin.debug:
    msg: "{{ bench.output_tokens_per_s }} tok/s, p90 {{ bench.p90_ms }} ms, accept {{ bench.spec_accept_length_mean }}"
"""

RETURN = r"""
requests_ok:
  description: Requests answered with HTTP 200 and a text.
  returned: always
  type: int
  sample: 64
requests_failed:
  description: Requests that failed (HTTP error, timeout, refused, malformed answer).
  returned: always
  type: int
  sample: 0
output_tokens:
  description: Sum of C(meta_info.completion_tokens) of the successful requests.
  returned: always
  type: int
  sample: 32768
duration_s:
  description: Wall-clock seconds from the first request sent to the last answer.
  returned: always
  type: float
  sample: 12.5
output_tokens_per_s:
  description: RV(output_tokens) divided by RV(duration_s).
  returned: always
  type: float
  sample: 2621.44
requests_per_s:
  description: Successful requests per second.
  returned: always
  type: float
  sample: 5.12
p50_ms:
  description: Median latency of the successful requests, in milliseconds.
  returned: always
  type: float
  sample: 1480.2
p90_ms:
  description: 90th percentile latency, in milliseconds.
  returned: always
  type: float
  sample: 1702.9
p99_ms:
  description: 99th percentile latency, in milliseconds.
  returned: always
  type: float
  sample: 1810.0
mean_ms:
  description: Mean latency, in milliseconds.
  returned: always
  type: float
  sample: 1501.7
spec_accept_length_mean:
  description: Mean of C(meta_info.spec_accept_length) over the requests that report it; null without speculative decoding.
  returned: always
  type: float
  sample: 3.21
errors:
  description: The first few distinct error messages.
  returned: always
  type: list
  elements: str
  sample: ["HTTP 503 "]
"""

import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.inference.plugins.module_utils._bench import (
    generate_payload,
    run_closed_loop,
    sample_from_response,
    summarize,
)
from ansible_collections.gpufleet.inference.plugins.module_utils._http import HttpClient


def make_sender(params, client=None):
    """A send(prompt) -> Sample over the collection's HTTP client (_http), one request each."""
    client = client or HttpClient(params["url"], params.get("api_key"), params["validate_certs"])

    def send(prompt):
        payload = generate_payload(prompt, params["max_new_tokens"], params["temperature"])
        started = time.monotonic()
        resp = client.post("/generate", payload, params["timeout"])
        elapsed = time.monotonic() - started
        if resp.status is None:
            return sample_from_response(None, None, elapsed, error=resp.describe())
        return sample_from_response(resp.status, resp.body, elapsed)

    return send


def run(params, send=None):
    """The benchmark as a plain function: the result dict (caller decides about failure)."""
    prompts = params.get("prompts") or [params["prompt"]]
    samples, duration = run_closed_loop(send or make_sender(params), prompts, params["num_prompts"], params["concurrency"])
    return summarize(samples, duration)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            url=dict(type="str", required=True),
            api_key=dict(type="str", no_log=True),
            num_prompts=dict(type="int", default=32),
            concurrency=dict(type="int", default=4),
            max_new_tokens=dict(type="int", default=256, no_log=False),
            prompt=dict(type="str", default="Explain speculative decoding in three sentences."),
            prompts=dict(type="list", elements="str"),
            temperature=dict(type="float", default=0.0),
            timeout=dict(type="float", default=300),
            validate_certs=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    params = module.params
    for name in ("num_prompts", "concurrency"):
        if params[name] < 1:
            module.fail_json(msg="%s must be at least 1, got %s" % (name, params[name]))
    if params["prompts"] is not None and not params["prompts"]:
        module.fail_json(msg="prompts must not be empty")
    result = run(params)
    if result["requests_ok"] == 0:
        module.fail_json(msg="all %s requests to %s/generate failed: %s"
                         % (result["requests_failed"], params["url"].rstrip("/"), "; ".join(result["errors"])),
                         changed=False, **result)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
