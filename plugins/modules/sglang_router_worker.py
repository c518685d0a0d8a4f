#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_router_worker
short_description: Add an SGLang worker to an sglang-router, or remove it and wait until it has drained
version_added: 0.1.0
description:
  - Manages one worker of a running C(sglang-router) (the SGLang model gateway) through its control-plane API
    (C(GET /workers), C(POST /workers), C(DELETE /workers/<id>)).
  - With O(state=absent) the worker is removed from the router, then the module waits until the worker itself
    reports no running or waiting request, so the server can be restarted without cutting requests.
  - With O(state=present) the worker is added (the router health-checks it first) and, with O(wait_healthy),
    the module waits until the router lists it as healthy, that is until the router routes requests to it.
  - Runs wherever the router and the worker are reachable, typically with C(delegate_to=localhost).
author:
  - gpufleet maintainers (@gpufleet)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details:
      - Reads the router's worker list and reports the change it would make; never waits or drains.
  diff_mode:
    support: full
    details:
      - The router's worker URLs before and after.
  platform:
    platforms: posix
options:
  router_url:
    description:
      - Base URL of the router, for example C(http://10.0.0.2:30080).
    type: str
    required: true
  worker_url:
    description:
      - URL of the SGLang server as the router reaches it, for example C(http://10.0.0.11:30000).
      - Compared with the router's list without a trailing slash.
    type: str
    required: true
  state:
    description:
      - V(present) adds the worker when the router does not list it.
      - V(absent) removes it when listed and then waits for it to drain (see O(drain_timeout)). Before the removal it
        reads the worker's load once; when that fails (for example a worker that refuses O(worker_api_key)), the task
        fails and the router is left as it was.
    type: str
    choices: [present, absent]
    default: present
  api_key:
    description:
      - "Control-plane key of the router (one of its C(--control-plane-api-keys), with role C(admin)),
        sent as C(Authorization: Bearer <api_key>)."
    type: str
  worker_api_key:
    description:
      - The worker's own C(--api-key).
      - Sent to the router with a new worker (so the router can call it) and used to read the worker's load while draining.
    type: str
  drain_timeout:
    description:
      - With O(state=absent), seconds to wait for the worker to report no in-flight request, after the router
        stopped sending it new ones. The task fails when requests remain after that time.
      - The in-flight count is read from the worker's C(/v1/loads) (running plus waiting requests),
        C(/get_load) on older servers, or C(/metrics) (C(sglang:num_running_reqs) + C(sglang:num_queue_reqs)).
      - A worker whose port refuses connections counts as drained.
      - V(0) takes one reading without waiting and never fails on it.
    type: int
    default: 600
  wait_healthy:
    description:
      - With O(state=present), wait until the router lists the worker as healthy.
      - When false, the module still waits until an added worker is listed.
    type: bool
    default: true
  timeout:
    description:
      - Seconds to wait for the router to list (and report healthy) an added worker, or to drop a removed one.
      - A loading server only answers C(/health) once its weights are loaded, which can take minutes.
    type: int
    default: 300
  request_timeout:
    description:
      - Timeout of each HTTP request, in seconds.
    type: float
    default: 10
  validate_certs:
    description:
      - Whether to validate TLS certificates for C(https) URLs.
    type: bool
    default: true
notes:
  - The router adds workers in a background job that retries the worker's C(/health) until the router's
    C(--worker-startup-timeout-secs) and then drops it; the module reports the job's failure message.
  - Requests already proxied to a removed worker run to completion; that is what the drain waits for.
"""

EXAMPLES = r"""
- name: Take the host out of the router and wait until its requests are done
  gpufleet.inference.sglang_router_worker:
    router_url: "{{ sglang_router_url }}"
    worker_url: "http://{{ sglang_host }}:30000"
    state: absent
    drain_timeout: 900
  delegate_to: localhost

- name: Put it back once the new process is verified
  gpufleet.inference.sglang_router_worker:
    router_url: "{{ sglang_router_url }}"
    worker_url: "http://{{ sglang_host }}:30000"
    state: present
    wait_healthy: true
  delegate_to: localhost
"""

RETURN = r"""
workers:
  description: The router's workers after the task (in check mode, as they would be).
  returned: always
  type: list
  elements: dict
  contains:
    url:
      description: Worker URL.
      type: str
    id:
      description: The router's id of the worker (null for a worker that check mode would add).
      type: str
    healthy:
      description: Whether the router considers the worker healthy.
      type: bool
    model_id:
      description: Model id the router discovered from the worker.
      type: str
    worker_type:
      description: C(regular), C(prefill) or C(decode).
      type: str
    load:
      description: The router's count of requests it has in flight to the worker.
      type: int
  sample:
    - url: http://127.0.1.11:30000
      id: 02b70eb8-a510-4a8c-8ff7-ea2103c3ae22
      healthy: true
      model_id: moonshotai/Kimi-K2.6
      worker_type: regular
      load: 0
drained:
  description:
    - Whether the worker reported no in-flight request after its removal.
    - Always false with O(state=present) and in check mode.
  returned: always
  type: bool
  sample: true
drain_seconds:
  description: Seconds spent waiting for the drain.
  returned: always
  type: float
  sample: 4.52
in_flight:
  description: The last in-flight request count read from the worker.
  returned: when O(state=absent) and not in check mode
  type: int
  sample: 0
drain_signal:
  description: The worker endpoint that gave the count, or C(refused) when the port was closed.
  returned: when O(state=absent) and not in check mode
  type: str
  sample: /v1/loads
wait_seconds:
  description: Seconds spent waiting for the router to list the added worker (and report it healthy).
  returned: when O(state=present) and not in check mode
  type: float
  sample: 1.5
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.inference.plugins.module_utils._argspec import ROUTER_WORKER
from ansible_collections.gpufleet.inference.plugins.module_utils._router import RouterError, worker_change


ARGUMENT_SPEC = ROUTER_WORKER


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    try:
        result = worker_change(module.params, module.check_mode)
    except RouterError as exc:
        module.fail_json(msg=str(exc))
    if not module._diff:
        result.pop("diff")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
