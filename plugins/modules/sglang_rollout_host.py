#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_rollout_host
short_description: One host of a rollout's apply phase - the critical path in one task, reverted on failure
version_added: 0.2.0
description:
  - Used by the playbook C(gpufleet.inference.rollout) through the role's step C(rollout_host) (role
    C(gpufleet.inference.sglang), after its C(drift) in the prepare phase). An action plugin - it runs on the
    controller and sends the role's modules to the host.
  - The host's steps are the role's own (M(gpufleet.inference.sglang_host) runs the same implementation); this action
    adds the router and the rollout's records around them. It reads the role's variables (C(sglang_unit_name),
    C(sglang_api_key), C(sglang_ready_timeout), ...) and the fact C(sglang_drift) of the prepare phase.
  - "In order, each step recorded (M(gpufleet.inference.sglang_rollout) records) before it can leave the host worse:
    record C(draining); leave the router and drain (with O(router.url)); keep what runs now as last-known-good when the
    host has none (M(gpufleet.inference.sglang_last_good)); record C(applying); create missing accounts, install what
    differs (M(gpufleet.inference.sglang_unit_files), the unit checked by C(systemd-analyze verify) first); restart
    when a file changed or the process does not run the installed unit (start it when it is not running); wait for the
    NEW process (M(gpufleet.inference.sglang_ready) in slices, with progress), or verify the running one; record
    C(verified); put the host back into the router; save the verified unit as last-known-good; record C(rejoined)."
  - On a failure after the unit changed, the host is reverted to its last-known-good unit (restored, restarted and
    verified against the recorded intent), put back into the router only when the reverted process is verified, and
    the failure is recorded with what runs on the host and whether it is in the router. A lost connection is
    recorded as such and nothing more is done to the host.
  - Drop-ins that override what the role manages (C(blocking) in the drift result) fail the host before anything
    changes.
  - One task per host, so a batch's critical path holds nothing but its steps.
  - The head of a multi-node serving group runs this task for its whole group (its followers are in no batch), each
    follower reached over a connection made as C(delegate_to) makes one - install what differs on every node,
    restarting nothing; stop every node, head first; start every node at once, followers first; wait for the head's
    full contract with every follower watched meanwhile, then each follower's own verification (a follower's death
    fails the group at once, named); rejoin the head. Every node's step is recorded on that node with its own lease,
    and keeps its own last-known-good; a failure reverts every node as one, naming the node that failed.
author:
  - gpufleet maintainers (@gpufleet)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
  - gpufleet.inference.attributes.controller_to_host
notes:
  - In check mode the host is skipped; the rollout's prepare phase says what would change.
options:
  run:
    description:
      - The rollout's run (the result of M(gpufleet.inference.sglang_rollout) with
        O(gpufleet.inference.sglang_rollout#module:state=start)).
    type: dict
    required: true
  capacity:
    description:
      - The result of the batch's capacity check (M(gpufleet.inference.sglang_rollout) with C(state=capacity), run once
        for the batch and registered with C(ignore_errors)); when it failed, the host fails before anything changes.
    type: dict
  router:
    description: The router the host leaves and rejoins; none (no O(router.url)) - no drain.
    type: dict
    suboptions:
      url:
        description: The router's URL.
        type: str
      api_key:
        description: The router's control-plane key.
        type: str
      worker_url:
        description: How the router reaches this host.
        type: str
      drain_timeout:
        description: Seconds the host may take to finish its requests.
        type: int
        default: 300
      rejoin_timeout:
        description: Seconds for the router to list the host healthy again, per attempt.
        type: int
        default: 120
      rejoin_retries:
        description: Attempts after the first to put the host back, 5 seconds apart.
        type: int
        default: 3
seealso:
  - module: gpufleet.inference.sglang_rollout
  - module: gpufleet.inference.sglang_ready
"""

EXAMPLES = r"""
# Through the role (playbooks/rollout.yml): the role passes its own values.
- name: Roll out this host
  ansible.builtin.import_role:
    name: gpufleet.inference.sglang
    tasks_from: rollout_host
  vars:
    sglang_rollout_run: "{{ hostvars.localhost.rollout_run }}"
    sglang_rollout_router:
      url: "{{ sglang_router_url | default('') }}"
"""

RETURN = r"""
record:
  description:
    - The host's record after its last step; its C(status) is V(updated), V(recovered), V(unchanged (verified\)),
      V(reverted), V(failed) or V(verified, not rejoined).
    - With the role's C(sglang_verify=false) nothing sees the new process, so the status is V(updated (not verified\)) (the unit
      was restarted or started) or V(unchanged (not verified\)), C(new_invocation) is unknown (null) and the unit
      is not kept as last-known-good (C(last_good_note) says so).
    - C(continue_rollout) is true when the status lets the rollout go on (the playbook stops after a batch with a
      host where it is false, or that has no record).
  returned: always
  type: dict
verified:
  description: The verification of the new process (M(gpufleet.inference.sglang_ready)'s result, or the drift check's).
  returned: success
  type: dict
failed_step:
  description: The step that failed.
  returned: failure
  type: str
  sample: Wait until the new SGLang process runs the intended settings
failure:
  description: What the failed step returned.
  returned: failure
  type: dict
revert:
  description: The revert's outcome (C(healthy), C(verdict), C(msg), C(invocation_id), C(observed)), when one ran.
  returned: failure
  type: dict
"""
