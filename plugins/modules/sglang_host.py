#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_host
short_description: One step of the role's host path - install, restart and verify, keep or revert the last-known-good unit
version_added: 0.1.0
description:
  - The steps of the role P(gpufleet.inference.sglang#role) on its host, as its entry points and its restart handler
    run them. An action plugin - it runs on the controller and sends the collection's modules to the host.
  - The steps are the collection's one host path, the same the rollout's per-host task
    (M(gpufleet.inference.sglang_rollout_host)) runs; use the role rather than this plugin.
  - It reads the role's variables by their own names (C(sglang_unit_name), C(sglang_api_key),
    C(sglang_ready_timeout), C(sglang_min_ready_seconds), C(sglang_verify), ...) and the result of the role's C(drift)
    entry point (C(sglang_drift), with C(sglang_drift.prepared)).
author:
  - gpufleet maintainers (@gpufleet)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
  - gpufleet.inference.attributes.controller_to_host
notes:
  - In check mode V(installed) runs its modules in check mode (with C(--diff), the unit's diff), V(verified) reports
    and starts nothing; the others say what they would do.
options:
  state:
    description:
      - V(installed) - create missing accounts, raise journald's rate limit, install the unit and its config file where
        they differ; before the first change of a host without a last-known-good copy, keep what runs as
        last-known-good. Changed (so its restart handler is notified) when a restart is due.
      - V(restarted) - reload systemd, restart the unit, wait for the NEW process (M(gpufleet.inference.sglang_ready) in
        slices, with progress) and, once verified and settled, keep the unit as last-known-good (O(keep_last_good)).
      - V(verified) - after the handlers, start a unit that is not running and wait for it, or verify the running
        process; the restart handler's verification when it ran. Sets the fact C(sglang_verified).
      - V(adopted) - keep what runs as last-known-good when there is no copy yet.
      - V(last_good_saved) - keep the unit as last-known-good with C(sglang_verified) (fails when that is not a pass).
      - V(reverted) - restore the last-known-good files, restart and verify the reverted process; sets the fact
        C(sglang_revert) and does not fail.
      - V(leased) - take the host's lease (M(gpufleet.inference.sglang_lease)) for a writer of O(kind) that changes it
        over several tasks - the playbook C(gpufleet.inference.sweep) - and set the fact C(sglang_lease_holder); the
        role's steps then renew that lease instead of taking their own. Fails, naming the holder, when a live run
        holds the host.
      - V(released) - release that lease.
      - V(reset) - forget the fact C(sglang_verified) of an earlier apply in the play (nothing on the host).
      - Every step that changes the host holds its lease - the caller's (C(sglang_lease_holder)), else the role's own,
        released when the step is done - so a rollout, a sweep and the role never change one host at once.
    type: str
    required: true
    choices: [installed, restarted, verified, adopted, last_good_saved, reverted, leased, released, reset]
  kind:
    description: With V(leased), the writer that holds the host (C(sweep), ...), named in the lease and the host's record.
    type: str
    default: sweep
  keep_last_good:
    description: With V(restarted) and V(verified), keep a verified new unit as last-known-good.
    type: bool
    default: true
seealso:
  - module: gpufleet.inference.sglang_ready
  - module: gpufleet.inference.sglang_rollout_host
"""

EXAMPLES = r"""
# The role's entry point `apply` (roles/sglang/tasks/apply.yml) and its handler:
- name: Install what differs (accounts, journald's rate limit, the unit and its config file)
  gpufleet.inference.sglang_host:
    state: installed
  notify: "gpufleet.inference.sglang : restart"

- name: Start SGLang when it is not running, else verify the running process
  gpufleet.inference.sglang_host:
    state: verified
"""

RETURN = r"""
changed_files:
  description: The files written (V(installed)).
  returned: state=installed
  type: list
  elements: str
restart_due:
  description: Whether the unit must restart (a file was written, or its process does not run the installed unit).
  returned: state=installed
  type: bool
verdict:
  description:
    - With V(restarted) and V(verified), the verification - the keys of M(gpufleet.inference.sglang_ready)'s result
      (C(verdict), C(invocation_id), C(observed), C(source), C(phases), C(msg), ...), or the drift check's when it found
      the running invocation verified already; also set as the fact C(sglang_verified).
    - V(not_verified) when the role's C(sglang_verify) is off.
  returned: state=restarted or state=verified
  type: str
  sample: pass
replaced_invocation:
  description: The InvocationID the restart replaced (the process before it).
  returned: state=restarted
  type: str
last_good_saved:
  description: Whether the unit was kept as last-known-good.
  returned: state=restarted, or state=verified after a start
  type: bool
revert:
  description: The revert's outcome (C(healthy), C(verdict), C(msg), C(invocation_id), C(observed), C(restored)).
  returned: state=reverted
  type: dict
lease:
  description: The host's lease after the step (V(leased), V(released)).
  returned: state=leased or state=released
  type: dict
failed_step:
  description: The step that failed.
  returned: failure
  type: str
  sample: Wait until the new SGLang process runs the intended settings
"""
