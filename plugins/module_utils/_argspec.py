# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Argument specs shared by the modules, each paired with the doc fragment of the same name.

Private to this collection: no compatibility promise.
"""
from __future__ import annotations

# plugins/doc_fragments/server.py
SERVER = dict(
    url=dict(type="str", default="http://127.0.0.1:30000"),
    api_key=dict(type="str", no_log=True),
    api_key_file=dict(type="path"),
    validate_certs=dict(type="bool", default=True),
)

# plugins/doc_fragments/unit.py
UNIT = dict(
    unit=dict(type="str", default="sglang.service"),
    receipt_dir=dict(type="path", default="/var/lib/gpufleet-inference/receipts"),
)

# plugins/doc_fragments/intent.py
INTENT = dict(
    expect=dict(type="dict", default={}),
    config_line=dict(type="str", choices=["required", "absent", "optional"]),
    command=dict(type="list", elements="str"),
    environment=dict(type="dict"),
)

# plugins/doc_fragments/wait.py
WAIT = dict(
    timeout=dict(type="float", default=900),
    poll_interval=dict(type="float", default=0.25),
    request_timeout=dict(type="float", default=60),
)

# plugins/doc_fragments/probe.py
PROBE = dict(
    prompt=dict(type="str", default="The capital of France is"),
    max_new_tokens=dict(type="int", default=8, no_log=False),
    verify_listener=dict(type="bool", default=True),
)


def merged(*specs, **extra):
    spec = {}
    for part in specs:
        spec.update(part)
    spec.update(extra)
    return spec


# sglang_router_worker (the module, and its action that runs on the controller)
ROUTER_WORKER = dict(
    router_url=dict(type="str", required=True),
    worker_url=dict(type="str", required=True),
    state=dict(type="str", default="present", choices=["present", "absent"]),
    api_key=dict(type="str", no_log=True),
    worker_api_key=dict(type="str", no_log=True),
    drain_timeout=dict(type="int", default=600),
    wait_healthy=dict(type="bool", default=True),
    timeout=dict(type="int", default=300),
    request_timeout=dict(type="float", default=10),
    validate_certs=dict(type="bool", default=True),
)
