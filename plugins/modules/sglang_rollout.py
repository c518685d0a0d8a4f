#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_rollout
short_description: The controller's side of a rollout - the plan from what the fleet holds, the capacity guard, the copy
version_added: 0.1.0
description:
  - Used by the playbooks C(gpufleet.inference.rollout) and C(gpufleet.inference.status); runs on the controller only
    (an action plugin). The fleet is the source of truth - each host's lease and record (M(gpufleet.inference.sglang_lease),
    next to its last-known-good copy) and the router's own list of workers - so any controller (a laptop, a bastion, an
    AWX job in a fresh container) plans, resumes or reports the same run. The results directory is a copy for people
    (JSON and Markdown).
  - V(start) checks the rollout's variables (plain errors, before anything is asked of a host) and names the run and
    its holder - kind, run id, a session id of this ansible-playbook run, controller, user, AWX job id. It writes
    nothing. In check mode the run is a check run (C(<run id>-check)). It reads the multi-node serving groups of the
    group's hosts (each judged whole, from the variables of all its nodes) and fails, naming the group and its nodes in
    and out, when the run (C(--limit)) or O(group) takes part of one; its result's C(servers) are the group's servers -
    single-node hosts and each serving group's head.
  - V(record) keeps a host's prepare-phase failure as the fact C(rollout_host_state) until V(prepared) writes the copy.
  - V(prepared) plans the run from each host's C(sglang_drift) (its lease and record), the records of the group's hosts
    the run leaves out (O(outside)) and the router's workers. It refuses, naming the holder, a host leased by a live
    holder of another session; it resumes an interrupted run only when its intent (settings digest) is the one each
    host it left mid-change was left with, and refuses otherwise (O(takeover) brings those hosts to the new settings
    instead); it refuses a run id that holds no host mid-change (a finished run is never reopened) and a run that
    leaves out a host an interrupted run left mid-change. The worker to drain is the one the router has for the host
    now. A host this collection took out of the router and left out is brought back; one taken out by someone else is
    reported and left out. When a host failed or was lost in the prepare phase nothing is leased or changed. A serving
    group changes as one - when any of its nodes must change, every node is planned to, and only its head goes on to
    the apply phase (its task changes the group); a follower is never a router worker.
  - V(leased) checks that every host of the run was leased (all or none) and names the hosts to release otherwise.
  - V(batch) runs once per batch of the apply phase - it renews the leases of the run's hosts outside O(batch) once
    half a lease has passed since their last renewal, takes the group's batch slot (one batch of the group out of the
    router at a time, whichever run takes it out; asked again every 5 seconds for at most the run's capacity wait;
    none when the run holds every host of the group), then runs V(capacity) with the run's group, O(min_healthy) and
    capacity wait. Its result's C(slot) is the slot's lease (to release after the batch) even when the check refuses.
    Without O(router_url) it only renews.
  - V(capacity) counts the whole group (O(group); not only the play's hosts - C(--limit) changes nothing), takes
    membership from the router and health from a fresh C(/generate) probe of each of the group's workers (the
    router's own health flag lags a stopped server), and fails, naming the unhealthy hosts and how, when taking
    O(leaving) out would leave fewer than O(min_healthy) healthy workers, after waiting O(capacity_wait) seconds.
  - V(finish) writes the copy (C(summary.json), C(summary.md)), prints one table, returns the leases to release (a
    host caught mid-change keeps its lease until a re-run brings it back), the summary for C(set_stats), and the
    message to fail with when a host failed.
  - V(status) is read-only - per host, its lease, the run, step and status of its record, settings digest and router
    membership (like C(kubectl rollout status)).
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
    choices: [start, record, prepared, leased, batch, capacity, finish, status]
  results_dir:
    description: Where the copy of the run's records is written (V(start)).
    type: path
  hosts:
    description: The hosts of the run (V(start), V(prepared), V(leased), V(status)), in inventory order.
    type: list
    elements: str
  group:
    description:
      - Every host of the rollout's group, whatever C(--limit) says (V(start), V(capacity)). V(prepared) reads the
        records of its hosts the run leaves out. The capacity guard counts the group's servers (V(start)'s
        C(servers) - a serving group once, by its head).
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
    description: The interrupted run to resume (V(start)); refused unless it left a host of this run mid-change.
    type: str
  takeover:
    description: Bring the hosts an interrupted run left mid-change to this run's settings instead of refusing (V(start)).
    type: bool
  break_lease:
    description: Take the hosts even when a live holder leases them (V(start)); its lease records the break.
    type: bool
  lease_seconds:
    description: How long a lease of a host being changed lasts between two renewals (V(start)).
    type: int
  batch_timeouts:
    description:
      - What bounds a batch (V(start)) - C(drain), C(ready), C(settle), C(rejoin) seconds and C(rejoin_retries). With
        O(capacity_wait) they make the longest a batch may take; a host of a later batch is leased for O(lease_seconds)
        plus that, and renewed at each batch's start.
    type: dict
  alive:
    description: The hosts still in the play (V(prepared)) - C(ansible_play_hosts); the others were lost.
    type: list
    elements: str
  outside:
    description:
      - The results of M(gpufleet.inference.sglang_lease) C(state=query) on the group's hosts the run leaves out
        (V(prepared)). Without it, V(prepared) runs that query on each of them itself (an unreachable one is reported).
    type: list
    elements: dict
  run:
    description: The run - the result of V(start) (V(prepared)), then RV(run) of V(prepared) (V(batch), V(finish)).
    type: dict
  task:
    description: The task that failed (V(record)).
    type: str
  failure:
    description: The failed task's result (V(record)).
    type: dict
  router:
    description: Whether the rollout drains hosts through a router (V(record)).
    type: bool
  router_url:
    description: The router (V(prepared), V(batch), V(capacity), V(status)).
    type: str
  router_api_key:
    description: The router's control-plane key.
    type: str
  batch:
    description: The hosts of this batch - C(ansible_play_batch) (V(batch), V(capacity)).
    type: list
    elements: str
  slot:
    description: The result of taking the group's batch slot (V(capacity)); a slot not taken refuses the batch.
    type: dict
  analysis:
    description:
      - The run's canary analysis (V(start); RV(run) of V(prepared) for V(capacity)) - with C(isolate) the baseline
        leaves the router with the canary's batch.
    type: dict
  leaving:
    description: Worker URLs about to leave the router (V(batch), V(capacity)).
    type: list
    elements: str
  poll:
    description: Seconds between two looks of the capacity guard (V(capacity)).
    type: float
    default: 2
notes:
  - What "the fleet" is for a lease - M(gpufleet.inference.sglang_lease) leases one host (one unit). Two runs over
    disjoint hosts behind one router may run at once; each one's capacity guard counts the whole group and probes
    each worker itself, and their batches take turns at the group's batch slot (V(batch)), so each guard sees what
    the other took out. A run that waits for the slot longer than its capacity wait stops before its batch changes
    anything.
"""

EXAMPLES = r"""
- name: Check the rollout's variables
  gpufleet.inference.sglang_rollout:
    state: start
    hosts: "{{ ansible_play_hosts_all }}"
    group: "{{ query('ansible.builtin.inventory_hostnames', 'gpu') }}"
    batches: [1, "25%"]
    results_dir: /srv/rollouts
  register: rollout_run
  run_once: true

- name: Show the fleet's rollout status
  gpufleet.inference.sglang_rollout:
    state: status
    hosts: "{{ ansible_play_hosts_all }}"
    router_url: "{{ sglang_router_url | default('') }}"
  run_once: true
"""

RETURN = r"""
run_id:
  description: The run's id (V(start)).
  returned: state=start
  type: str
  sample: 20261201T101500Z-3fa2c1
holder:
  description: Who runs it - kind, run_id, session, controller, user, job (V(start), V(prepared)).
  returned: state=start or state=prepared
  type: dict
run:
  description: The run as planned (V(prepared)) - its id (the interrupted run's when it resumes), copy directory, digests.
  returned: state=prepared
  type: dict
batches:
  description: The checked batches, for the play's C(serial).
  returned: state=start
  type: list
  elements: raw
pending_lease_seconds:
  description: How long a host of a later batch is leased for between two renewals (V(start)).
  returned: state=start
  type: int
apply:
  description: The hosts that must change, in inventory order; empty when a host failed in the prepare phase (V(prepared)).
  returned: state=prepared
  type: list
  elements: str
plan:
  description: Per host - action (apply, recover, keep, left_out), reason, the worker URL the router has for it (drain_url).
  returned: state=prepared
  type: dict
records:
  description: Per host, the record the lease task writes on it (V(prepared)); every record of the run (V(finish)).
  returned: state=prepared or state=finish
  type: raw
release:
  description: The hosts whose lease to release (V(leased) when not all were leased, V(finish)).
  returned: state=leased or state=finish
  type: list
  elements: str
summary:
  description: The run's summary for C(set_stats) (AWX shows it as the job's artifacts) (V(finish)).
  returned: state=finish
  type: dict
hosts:
  description: One row per host - lease, run, step, status, digest, in the router (V(status)).
  returned: state=status
  type: list
  elements: dict
"""
