#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_rollout
short_description: The controller's bookkeeping of a rollout - lock, records, capacity guard, summary
version_added: 0.1.0
description:
  - Used by the playbook C(gpufleet.inference.rollout); runs on the controller only (an action plugin), so it
    works whatever host the task is for.
  - V(start) checks the rollout's variables (plain errors, before anything changes), takes the fleet's lock
    (C(<results_dir>/lock.json) - run id, controller, PID and its start time, user, time) and names the run. A lock
    whose process is alive is never taken. A lock left by an interrupted run (its process is gone) is taken by the next
    rollout, which resumes that run (same run id, same records). A lock of another controller, or one older than
    O(lock_max_age), is only taken with O(break_lock). Run ids are unique even for runs started in the same second.
    In check mode no lock is taken and the run is a check run (C(<run id>-check)).
  - V(record) writes what a host's step is - before each step that can leave the host worse - to
    C(<run dir>/<host>.json), the fleet's ledger C(<results_dir>/fleet/<host>.json) (where each host was left,
    whichever run left it) and C(<run dir>/summary.json), atomically and under a lock, so the summary always agrees
    with the host files. It sets the fact C(rollout_host_state).
  - V(prepared) records every host of the prepare phase in one task (run once) from each host's C(sglang_drift) and
    C(sglang_endpoint) facts and its entry in the fleet's ledger (read before it is rewritten - a host an earlier run
    left out of the router changes even when in sync), and returns RV(apply) - the hosts that must change, in the
    order of O(hosts) - or no host when one of them failed (its C(rollout_host_state) says so) or left the prepare
    phase without a result; and RV(worker_urls) for the capacity guard.
  - V(capacity) reads the router's workers and their health and fails, naming the unhealthy hosts, when taking
    O(leaving) out would leave fewer than O(min_healthy) healthy workers of the group, after waiting
    O(capacity_wait) seconds for capacity to come back.
  - V(finish) writes the final summary, prints one table (host, status, old -> new InvocationID, time to ready, config
    seen), releases the lock, and fails when a host failed.
author:
  - gpufleet maintainers (@gpufleet)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
  - gpufleet.inference.attributes.controller
options:
  state:
    description: What to do.
    type: str
    required: true
    choices: [start, prepared, record, capacity, finish]
  results_dir:
    description: The results root (V(start)).
    type: path
  hosts:
    description: The hosts of the rollout (V(start)), in inventory order (V(prepared)).
    type: list
    elements: str
  batches:
    description:
      - The serial batches (V(start)), a list of counts and percentages like C([1, "25%"]); also accepted as the text of
        such a list or a single size (from C(-e key=value)). Ansible repeats the last size.
    type: raw
  min_healthy:
    description: Healthy workers of the group that must stay in the router - a count or C("N%") of the group (V(start), V(capacity)).
    type: raw
  capacity_wait:
    description: Seconds to wait for capacity to come back (V(start), V(capacity)).
    type: float
  run_id:
    description: Resume or name a run (V(start)).
    type: str
  break_lock:
    description: Take a lock whose holder cannot be checked or is gone, starting a new run (V(start)).
    type: bool
  lock_max_age:
    description: Hours after which a held lock is reported as stale (V(start)).
    type: float
  alive:
    description: The hosts still in the play (V(prepared)) - C(ansible_play_hosts); the others were lost.
    type: list
    elements: str
  run:
    description: The result of V(start) (V(prepared), V(record), V(finish)).
    type: dict
  step:
    description: The step to record - V(prepared), V(draining), V(applying), V(verified), V(rejoined), V(failed).
    type: str
  drift:
    description: The host's C(sglang_drift) fact (V(record)).
    type: dict
  verified:
    description: The host's C(sglang_verified) fact (V(record)).
    type: dict
  endpoint:
    description: The host's C(sglang_endpoint) fact (V(record)).
    type: dict
  router:
    description: Whether the rollout drains hosts through a router (V(prepared), V(record)).
    type: bool
  router_url:
    description: The router (V(capacity)).
    type: str
  api_key:
    description: The router's control-plane key (V(capacity)).
    type: str
  workers:
    description: Worker URLs of the whole group (V(capacity)).
    type: list
    elements: str
  leaving:
    description: Worker URLs about to leave the router (V(capacity)).
    type: list
    elements: str
"""

EXAMPLES = r"""
- name: Take the fleet's lock
  gpufleet.inference.sglang_rollout:
    state: start
    hosts: "{{ ansible_play_hosts_all }}"
    batches: [1, "25%"]
    results_dir: /srv/rollouts
  register: rollout_run
  run_once: true
"""

RETURN = r"""
run_id:
  description: The run's id (V(start)).
  returned: state=start
  type: str
  sample: 20261201T101500Z-3fa2c1
run_dir:
  description: Where the run's records are (V(start)).
  returned: state=start
  type: str
resumed:
  description: Whether this run resumes an interrupted one (V(start)).
  returned: state=start
  type: bool
batches:
  description: The checked batches, for the play's C(serial).
  returned: state=start
  type: list
  elements: raw
record:
  description: The host's record after this step (V(record)).
  returned: state=record
  type: dict
apply:
  description: The hosts that must change, in inventory order; empty when a host failed in the prepare phase (V(prepared)).
  returned: state=prepared
  type: list
  elements: str
worker_urls:
  description:
    - The router's worker URL of each host that was compared (V(prepared)), for the capacity guard of each batch.
  returned: state=prepared
  type: dict
  sample: {gpu-1: "http://10.0.0.1:30000"}
records:
  description: Every host record of the run (V(finish)).
  returned: state=finish
  type: list
  elements: dict
"""
