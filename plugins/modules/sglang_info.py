#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_info
short_description: Read-only facts about an SGLang systemd unit and its running process
version_added: 0.1.0
description:
  - Reports the unit's current C(InvocationID), state, main PID, restart count and C(ExecStart) argv,
    the config line logged by the B(current) invocation (parsed), and a subset of C(/server_info).
  - Used to snapshot the invocation before a restart (feed RV(invocation_id) to
    M(gpufleet.inference.sglang_ready) as O(gpufleet.inference.sglang_ready#module:after_invocation)) and for drift checks.
  - Never changes anything. A missing unit returns RV(exists=false); an unreachable server returns
    RV(server_info=null); neither fails the task.
author:
  - gpufleet maintainers (@gpufleet)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - gpufleet.inference.attributes
  - gpufleet.inference.server
  - gpufleet.inference.unit
options:
  probe_server:
    description:
      - Ask the server for C(/server_info). V(false) reads only systemd and the journal (a snapshot before a restart).
    type: bool
    default: true
  timeout:
    description:
      - Seconds the C(/server_info) request may take.
    type: float
    default: 10
notes:
  - The config line comes from the receipt of the current invocation's verification, else from
    C(journalctl _SYSTEMD_INVOCATION_ID=<id> --grep ...), so the unit's older invocations are never read.
seealso:
  - module: gpufleet.inference.sglang_ready
"""

EXAMPLES = r"""
- name: Snapshot the running invocation
  gpufleet.inference.sglang_info:
    unit: sglang.service
  register: before

- name: Show what the running process logged
  ansible.builtin.debug:
    msg: "{{ before.config }} (invocation {{ before.invocation_id }})"

- name: Server facts with an API key
  gpufleet.inference.sglang_info:
    url: http://127.0.1.11:30000
    api_key: "{{ sglang_api_key }}"
  register: facts
"""

RETURN = r"""
exists:
  description: Whether systemd knows the unit.
  returned: always
  type: bool
  sample: true
invocation_id:
  description: The unit's current InvocationID (null when the unit never ran).
  returned: always
  type: str
  sample: 0b5a3c2d9e4f4c7a8b1d2e3f4a5b6c7d
active_state:
  description: systemd's ActiveState.
  returned: always
  type: str
  sample: active
sub_state:
  description: systemd's SubState.
  returned: always
  type: str
  sample: running
main_pid:
  description: The unit's MainPID (0 when not running).
  returned: always
  type: int
  sample: 4242
n_restarts:
  description: How often systemd restarted the unit automatically (C(Restart=)).
  returned: always
  type: int
  sample: 0
control_group:
  description: The unit's cgroup.
  returned: always
  type: str
  sample: /system.slice/sglang.service
unit_file_state:
  description: systemd's UnitFileState (enabled, disabled, ...).
  returned: always
  type: str
  sample: enabled
exec_start:
  description: The argv of the unit's (first) C(ExecStart=), as systemd reports it.
  returned: always
  type: list
  elements: str
  sample: ["/opt/sglang/venv/bin/python", "-m", "sglang.launch_server", "--speculative-draft-window-size", "2048"]
config:
  description: The key/value pairs of the current invocation's (last) config line, or null when none was logged.
  returned: always
  type: dict
  sample: {"attention_backend": "flashinfer", "model": "DFlashDraftModel", "block_size": 16,
           "draft_window_size": 2048, "compact_cache": true}
config_source:
  description:
    - Where RV(config) comes from - V(journal), V(receipt) (the receipt of its verification, the journal holding no
      later line), V(receipt+journal) (the receipt, and lines the journal holds after it), or null.
  returned: always
  type: str
  sample: journal
config_line:
  description: The config line as logged by the current invocation, or null.
  returned: always
  type: str
  sample: "[2026-11-29 10:00:00 TP0] Initialized DFLASH draft runner. attention_backend=flashinfer, model=DFlashDraftModel,
    block_size=16, draft_window_size=2048, compact_cache=True"
server_info:
  description:
    - A subset of C(/server_info) (version, status, model_path, tp_size, all C(speculative_*) keys and
      C(internal_states[].avg_spec_accept_length)); null when the server does not answer.
  returned: always
  type: dict
  sample: {"version": "0.5.11", "status": "Up", "tp_size": 8, "speculative_algorithm": "DFLASH",
           "speculative_dflash_draft_window_size": 2048, "internal_states": [{"avg_spec_accept_length": 3.1}]}
server_info_error:
  description: Why RV(server_info) is null.
  returned: when the server did not answer with 200
  type: str
  sample: connection refused
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.inference.plugins.module_utils import _argspec
from ansible_collections.gpufleet.inference.plugins.module_utils._http import server_api_key
from ansible_collections.gpufleet.inference.plugins.module_utils._host import CommandRunner, Host
from ansible_collections.gpufleet.inference.plugins.module_utils._probe import server_info_subset
from ansible_collections.gpufleet.inference.plugins.module_utils._process import redact, redact_text
from ansible_collections.gpufleet.inference.plugins.module_utils._startup import look_back
from ansible_collections.gpufleet.inference.plugins.module_utils._systemd import SystemdError

ARGUMENT_SPEC = _argspec.merged(
    _argspec.SERVER, _argspec.UNIT,
    probe_server=dict(type="bool", default=True),
    timeout=dict(type="float", default=10),
)


def run(module, host=None):
    params = module.params
    host = host or Host(CommandRunner(module), params["unit"], params["url"], server_api_key(module),
                        params["validate_certs"], receipt_dir=params["receipt_dir"])
    try:
        state = host.state()
    except SystemdError as exc:
        module.fail_json(msg="could not read the state of %s: %s" % (params["unit"], exc))
    result = dict(changed=False, exists=state.exists, invocation_id=state.invocation_id or None,
                  active_state=state.active_state, sub_state=state.sub_state, main_pid=state.main_pid,
                  n_restarts=state.n_restarts, control_group=state.control_group or None,
                  unit_file_state=state.unit_file_state, exec_start=[], config=None, config_line=None,
                  config_source=None, server_info=None)
    if not state.exists:
        module.exit_json(**result)
    try:
        effective = host.effective()
        result["exec_start"] = redact(effective.exec_start[0]) if effective.exec_start else []
    except SystemdError as exc:
        module.warn("could not read ExecStart of %s: %s" % (params["unit"], exc))
    if state.invocation_id:
        found = look_back(host, state.invocation_id)
        if found.note:
            module.warn(found.note)
        if found.lines:
            result.update(config=found.lines[-1]["values"], config_line=redact_text(found.lines[-1]["line"]),
                          config_source=found.source)
    if params["probe_server"]:
        resp = host.server_info(params["timeout"])
        data = resp.json() if resp.kind == "http" and resp.status == 200 else None
        if isinstance(data, dict):
            result["server_info"] = server_info_subset(data)
        else:
            result["server_info_error"] = resp.describe()
    module.exit_json(**result)


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    run(module)


if __name__ == "__main__":
    main()
