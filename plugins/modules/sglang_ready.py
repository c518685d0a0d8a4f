#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_ready
short_description: Wait until the new process of an SGLang systemd unit serves the intended settings, and prove it
version_added: 0.1.0
description:
  - Blocks until the B(new) process of an SGLang systemd unit has logged its config line and answers C(/generate),
    stays up for O(min_ready_seconds), and fails as soon as that process disagrees with the intended settings.
  - The new process is identified by systemd's C(InvocationID) only, never by time or by grepping the unit's log.
  - Only journal entries of that invocation are read, followed as they arrive (C(journalctl --follow) on
    C(_SYSTEMD_INVOCATION_ID=)), so readiness is seen within a tick and the cost never grows with the journal.
  - "What counts as evidence: the config line(s) the invocation logged, or the receipt written when that same
    invocation was verified; its real command line (C(/proc/MAINPID/cmdline)) and environment. C(/server_info)
    only echoes the parsed arguments and never counts. Without evidence the verdict is V(unverified), never V(pass)."
  - Fails fast when the invocation dies or systemd restarts it (crash loop), when something else restarts the unit,
    when a process outside the unit answers on the port, and on timeout with the last phase and journal line seen.
  - On V(pass) it writes a receipt (O(receipt_dir)); that is its only change to the host.
  - An action plugin of the same name drives the module in slices of O(slice_seconds), prints per-host progress
    (invocation, weight shards, KV cache, CUDA graphs, config line, port, C(/generate), settle) and retries a slice
    lost to a broken SSH connection for up to O(connection_retry_seconds). With O(slice_seconds=0) one module call
    does the whole wait.
author:
  - gpufleet maintainers (@gpufleet)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
  - gpufleet.inference.attributes
  - gpufleet.inference.server
  - gpufleet.inference.unit
  - gpufleet.inference.intent
  - gpufleet.inference.wait
  - gpufleet.inference.probe
options:
  after_invocation:
    description:
      - The unit's C(InvocationID) snapshotted before the restart (for example RV(gpufleet.inference.sglang_info#module:invocation_id)).
      - When given, only a B(different) invocation counts; the old process is never probed. In check mode nothing was
        restarted, so the module returns at once (V(check_mode)).
      - When omitted, the current invocation is verified (no restart).
    type: str
  min_ready_seconds:
    description:
      - After the first good C(/generate), keep watching this many seconds (like Kubernetes' C(minReadySeconds)) - same
        invocation, no restart by systemd, main process alive, C(/generate) still answering at the end - before passing.
      - A running invocation that a receipt shows verified at least this long ago passes without waiting again.
      - V(0) passes at the first good answer.
    type: float
    default: 10
  follower:
    description:
      - The unit runs a follower node of a multi-node serving group (C(--node-rank) 1 and up). A follower serves no HTTP
        (its stand-in C(/health) proves only that its main process lives) and logs no config line (only global TP rank
        0, on the head, does), so no HTTP request is made.
      - It is ready once its own invocation's journal says that it joined the group - C(Dummy health check server
        started ...), which SGLang logs once every scheduler of the node is ready - and passes after
        O(min_ready_seconds) since that line without a restart or death. Its command line and environment are compared
        as for any unit; deaths and restarts fail it as for any unit.
      - The group serves only when its head passes the full contract (its C(/generate) answers only once every node
        joined).
    type: bool
    default: false
  crash_loop_restarts:
    description:
      - How many restarts by systemd (C(Restart=)) of the new process to tolerate before failing.
      - The default V(0) fails at the first one.
    type: int
    default: 0
  journal_grace:
    description:
      - When C(/generate) answers but the invocation's journal has no config line and nothing SGLang logs after it
        has arrived yet, how many seconds to wait for such a line (or journald's C(Suppressed N messages) notice)
        before the verdict V(unverified).
    type: float
    default: 35
  accept_unverified:
    description:
      - Accept an invocation that serves but whose config line was lost (rate limit, retention) with no receipt -
        pass with a warning and RV(verified=false) instead of failing with V(unverified).
    type: bool
    default: false
  write_receipt:
    description:
      - Write a receipt on pass (not in check mode).
    type: bool
    default: true
  slice_seconds:
    description:
      - Used by the action plugin - one module call waits at most this long and returns its state
        (RV(verdict=waiting)), which the plugin hands to the next call. V(0) - the whole wait in one call.
      - A call also returns when the start reaches a new phase (at least 5 seconds in), so each phase shows when it
        begins; between phases a progress line comes at least this often.
      - Each call is one module run on the host, which costs the controller CPU; long slices keep a minutes-long
        model load cheap (figures - the guide's controller tuning page).
    type: float
    default: 30
  progress:
    description:
      - Whether the action plugin prints progress lines (at most one per host every few seconds, plus one per phase).
    type: bool
    default: true
  connection_retry_seconds:
    description:
      - How long the action plugin keeps retrying slices lost to the connection (SSH dropped or timed out) before the
        task fails with the verdict V(connection_lost). The wait goes on from its state; no verdict is lost.
    type: float
    default: 120
  resume:
    description:
      - Internal - the state returned by the previous slice (RV(state)). Set by the action plugin.
    type: dict
notes:
  - Needs C(systemctl) and C(journalctl) on the managed host; no Python libraries beyond Ansible's own.
  - Reading other units' journal entries and C(/proc/*/fd) needs privileges; run the task with C(become=true).
attributes:
  action:
    support: full
    details:
      - The action plugin only loops over the module; all checks run on the managed host.
  async:
    support: none
  bypass_host_loop:
    support: none
  check_mode:
    details:
      - With O(after_invocation) nothing was restarted in check mode, so the module returns at once without waiting.
      - Without O(after_invocation) it verifies the running invocation, which is read-only, and writes no receipt.
seealso:
  - module: gpufleet.inference.sglang_info
  - module: gpufleet.inference.sglang_drift
"""

EXAMPLES = r"""
- name: Snapshot the running invocation before changing the unit
  gpufleet.inference.sglang_info:
    unit: sglang.service
  register: before

- name: Restart SGLang
  ansible.builtin.systemd_service:
    name: sglang.service
    state: restarted
    daemon_reload: true

- name: Wait for the NEW process and check it runs the new settings
  gpufleet.inference.sglang_ready:
    unit: sglang.service
    after_invocation: "{{ before.invocation_id }}"
    url: http://127.0.0.1:30000
    expect:
      draft_window_size: 2048
      compact_cache: true
      block_size: 16
    timeout: 1200

- name: A server meant to run without speculative decoding
  gpufleet.inference.sglang_ready:
    unit: sglang.service
    config_line: absent
    timeout: 60
"""

RETURN = r"""
module_runs:
  description: How many times the action plugin ran the module on the host for this wait (slices, and slices run
    again after a lost connection).
  returned: always (from the action plugin)
  type: int
  sample: 3
verdict:
  description:
    - How the wait ended; V(pass) on success, V(check_mode) when skipped in check mode, otherwise one of
      V(mismatch), V(died), V(crash_loop), V(replaced), V(unstable) (stopped answering while settling), V(timeout),
      V(foreign_listener), V(missing_config_line), V(unverified), V(unauthorized), V(not_active), V(not_found),
      V(connection_lost) (action plugin).
    - V(waiting) only when the module is called with O(slice_seconds) and its slice ended first.
  returned: always
  type: str
  sample: pass
verified:
  description: Whether the verdict rests on evidence (config line in the journal, or a receipt) - false only with O(accept_unverified).
  returned: always
  type: bool
invocation_id:
  description: The InvocationID of the process that was checked.
  returned: always
  type: str
  sample: 0b5a3c2d9e4f4c7a8b1d2e3f4a5b6c7d
main_pid:
  description: The invocation's main PID.
  returned: always
  type: int
  sample: 4242
unit_state:
  description: The unit's state at the last look, with C(exit) (how the main process ended, systemd's words).
  returned: always
  type: dict
  sample: {"invocation_id": "0b5a3c2d9e4f4c7a8b1d2e3f4a5b6c7d", "active_state": "active", "sub_state": "running",
           "main_pid": 4242, "n_restarts": 0, "control_group": "/system.slice/sglang.service", "result": "success",
           "exit": null}
expected:
  description: O(expect) with its values coerced (what was compared).
  returned: always
  type: dict
  sample: {"draft_window_size": 2048, "compact_cache": true, "block_size": 16}
config_line_mode:
  description: The effective O(config_line).
  returned: always
  type: str
  sample: required
observed:
  description: The key/value pairs of the (last) config line, from the journal or the receipt (see RV(source)).
  returned: always
  type: dict
  sample: {"attention_backend": "flashinfer", "model": "DFlashDraftModel", "block_size": 16,
           "draft_window_size": 2048, "compact_cache": true}
config_line:
  description: The (last) config line as logged by the checked invocation.
  returned: always
  type: str
config_lines:
  description: Every rank-0 config line of the invocation, in order.
  returned: always
  type: list
  elements: str
source:
  description:
    - Where the evidence comes from - V(journal), V(receipt) (the receipt of this invocation's verification, its journal
      holding no later config line), V(receipt+journal) (the receipt, and later lines from the journal), or null when
      there is none.
  returned: always
  type: str
  sample: journal
launched:
  description: What was checked about the running process - C(command_checked), C(environment_checked), its
    C(command) (secrets masked) and the unit's C(drop_in_paths).
  returned: always
  type: dict
elapsed:
  description: Seconds spent waiting (monotonic clock).
  returned: always
  type: float
  sample: 312.4
phases:
  description:
    - When each phase was reached, as C(elapsed) seconds since the wait started and C(at) (UTC).
    - Keys are V(new_invocation) (or V(invocation) without O(after_invocation)), V(config_line), V(port_open) and
      V(generate) (the first good C(/generate)).
  returned: always
  type: dict
phase:
  description: The last phase reached, in words.
  returned: always
  type: str
events:
  description: Progress events of the wait (elapsed, phase, text), as the action plugin printed them.
  returned: always
  type: list
  elements: dict
generate:
  description: The first good C(/generate) answer, with a text excerpt and its C(meta_info).
  returned: when /generate answered
  type: dict
  sample: {"status": 200, "text": " Paris. The capital of Germany is",
           "meta_info": {"completion_tokens": 8, "spec_accept_length": 3.2}}
listener:
  description: Who owns the socket listening on the host and port of O(url) (O(verify_listener)).
  returned: when the port was open
  type: dict
journal_tail:
  description: The last journal lines of the invocation that ended (secrets masked).
  returned: when the invocation died or crash-looped
  type: list
  elements: str
suppression:
  description: journald's rate-limit notices for the invocation, when the config line was lost to them.
  returned: when journald suppressed messages of the invocation
  type: dict
receipt:
  description: The receipt written on pass, or null.
  returned: always
  type: str
  sample: /var/lib/gpufleet-inference/receipts/sglang.service.json
notes:
  description: Things worth knowing about how the result was reached (tolerated restarts, unverified acceptance).
  returned: always
  type: list
  elements: str
state:
  description: The state of the wait, for the next slice.
  returned: when RV(verdict=waiting)
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.inference.plugins.module_utils import _argspec
from ansible_collections.gpufleet.inference.plugins.module_utils._http import server_api_key
from ansible_collections.gpufleet.inference.plugins.module_utils._host import CommandRunner, Host
from ansible_collections.gpufleet.inference.plugins.module_utils._evidence import Intent
from ansible_collections.gpufleet.inference.plugins.module_utils._judge import CHECK_MODE, WAITING, Policy
from ansible_collections.gpufleet.inference.plugins.module_utils._wait import Waiter

ARGUMENT_SPEC = _argspec.merged(
    _argspec.SERVER, _argspec.UNIT, _argspec.INTENT, _argspec.WAIT, _argspec.PROBE,
    after_invocation=dict(type="str"),
    follower=dict(type="bool", default=False),
    min_ready_seconds=dict(type="float", default=10),
    crash_loop_restarts=dict(type="int", default=0),
    journal_grace=dict(type="float", default=35),
    accept_unverified=dict(type="bool", default=False),
    write_receipt=dict(type="bool", default=True),
    slice_seconds=dict(type="float", default=30),
    progress=dict(type="bool", default=True),
    connection_retry_seconds=dict(type="float", default=120),
    resume=dict(type="dict"),
)


def check_numbers(params):
    """The first invalid number, as a message (None when all are valid)."""
    for name in ("timeout", "poll_interval", "request_timeout"):
        if params[name] <= 0:
            return "%s must be greater than 0, got %s" % (name, params[name])
    for name in ("min_ready_seconds", "journal_grace", "slice_seconds", "crash_loop_restarts"):
        if params[name] < 0:
            return "%s must be 0 or more, got %s" % (name, params[name])
    return None


def build_waiter(module, host=None):
    params = module.params
    host = host or Host(CommandRunner(module), params["unit"], params["url"], server_api_key(module),
                        params["validate_certs"], params["prompt"], params["max_new_tokens"],
                        params["verify_listener"], params["receipt_dir"])
    intent = Intent(params["expect"], params["config_line"], params["command"], params["environment"],
                    params["follower"])
    policy = Policy(timeout=params["timeout"], min_ready_seconds=params["min_ready_seconds"],
                    tick=params["poll_interval"], request_timeout=params["request_timeout"],
                    crash_loop_restarts=params["crash_loop_restarts"], journal_grace=params["journal_grace"],
                    accept_unverified=params["accept_unverified"],
                    write_receipt=params["write_receipt"] and not module.check_mode)
    return Waiter(host, params["unit"], intent, policy, params["after_invocation"], resume=params["resume"])


def run(module, host=None):
    params = module.params
    problem = check_numbers(params)
    if problem:
        module.fail_json(msg=problem)
    if module.check_mode and params["after_invocation"]:
        module.exit_json(changed=False, skipped=True, verdict=CHECK_MODE, verified=False,
                         msg="check mode: nothing was restarted, so there is no new invocation of %s to wait for"
                         % params["unit"])
    waiter = build_waiter(module, host)
    judgement = waiter.run(params["slice_seconds"] or None)
    result = waiter.result()
    result.update(changed=bool(result["receipt"]), verdict=judgement.verdict, msg=judgement.message)
    if judgement.verdict == WAITING:
        result["state"] = waiter.to_state()
        module.exit_json(**result)
    if not result["verified"] and judgement.ok:
        module.warn(judgement.message)
    if not judgement.ok:
        module.fail_json(**result)
    module.exit_json(**result)


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    run(module)


if __name__ == "__main__":
    main()
