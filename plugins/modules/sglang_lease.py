#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_lease
short_description: Hold, renew or release a host's lease, and keep its record, on the host itself
version_added: 0.1.0
description:
  - The fleet is the source of truth - every writer of the collection (a rollout, a sweep, the role's C(apply) and
    C(revert)) holds the host's lease while it changes the host, and writes what it did into the host's record, both
    in O(directory) next to the last-known-good copies and the receipts. Any controller (a laptop, a bastion, an AWX
    job that is gone after the job) can see, refuse, resume and report a change from the hosts.
  - A lease names its holder (C(kind), C(run_id), C(controller), C(user), C(job)) and expires after O(seconds) unless
    renewed. Its holder is dead when it expired - never because it runs on another machine.
  - O(state=held) takes the lease (free, released or expired), or renews the caller's own (O(holder.session) and
    O(holder.generation) the ones it took); it fails naming the holder of a live lease, and fails when the caller's
    lease was taken over (even if released since), so a run that lost a host never touches it again.
    O(state=released) releases the caller's lease. O(state=query) reads both and changes nothing.
  - O(record) is merged into the host's record in the same step, only when the lease is held - a step is recorded
    by the writer that holds the host.
author:
  - gpufleet maintainers (@gpufleet)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - gpufleet.inference.attributes
attributes:
  check_mode:
    details:
      - Reports what it would take or release; writes nothing.
  diff_mode:
    support: none
options:
  unit:
    description: The SGLang unit the lease and the record are about.
    type: str
    required: true
  state:
    description: V(held), V(released) or V(query).
    type: str
    default: held
    choices: [held, released, query]
  holder:
    description: Who holds (or asks for) the lease.
    type: dict
    suboptions:
      kind:
        description: V(rollout), V(sweep) or V(role).
        type: str
      run_id:
        description: The run.
        type: str
      session:
        description: One ansible-playbook run of it (a resumed run has a new session).
        type: str
      generation:
        description: The generation of the lease the caller took earlier (it renews); none - it takes one now.
        type: int
      controller:
        description: The machine the playbook runs on.
        type: str
      user:
        description: Who runs it.
        type: str
      job:
        description: The AWX / Automation Controller job id, when there is one.
        type: str
      process:
        description:
          - The holder's ansible-playbook process - C(boot) (the kernel's boot id), C(pid_ns) (its PID namespace),
            C(pid) and C(start) (its start time). A controller in the same boot and PID namespace can tell that the
            holder is gone (a Ctrl-C'd run) and resume at once; any other waits for the lease to expire.
        type: dict
  seconds:
    description: How long the lease lasts from now.
    type: int
    default: 300
  intent_digest:
    description: The digest of the settings the holder brings the host to (kept with the lease).
    type: str
  force:
    description: Take a live lease of another holder (breaking it). The holder it breaks is named in the result.
    type: bool
    default: false
  takeover_runs:
    description:
      - Run ids of interrupted runs whose live leases (of hosts they had not reached yet) this holder takes over; the
        rollout names a run here only after it found the hosts that run left mid-change with their leases expired.
    type: list
    elements: str
    default: []
  record:
    description: Fields of the host's record to merge (C(step), C(status), C(run_id), ...); a step is appended to its
      C(steps).
    type: dict
  directory:
    description: Where the lease and the record live on the host.
    type: path
    default: /var/lib/gpufleet-inference/fleet
"""

EXAMPLES = r"""
- name: Take the host's lease for a sweep, record the step
  gpufleet.inference.sglang_lease:
    unit: sglang.service
    holder: {kind: sweep, run_id: sweep-20261205, session: "{{ session }}", controller: bastion-1, user: ops}
    seconds: 1800
    record: {run_id: sweep-20261205, kind: sweep, step: started, status: in progress}
  register: lease

- name: Release it
  gpufleet.inference.sglang_lease:
    unit: sglang.service
    state: released
    holder: {session: "{{ session }}", generation: "{{ lease.lease.generation }}"}
"""

RETURN = r"""
lease:
  description: The lease after the call (C(holder), C(session), C(generation), C(acquired), C(renewed), C(expires),
    C(intent_digest), C(released)), with C(live), C(expires_in) (seconds) and C(text) (the holder in words); null when
    the host never had one.
  returned: always
  type: dict
record:
  description: The host's record after the call (C(run_id), C(kind), C(step), C(status), C(steps), C(history), ...).
  returned: always
  type: dict
action:
  description: What happened - V(acquire), V(renew), V(take_over) (the previous holder's lease had expired), V(break),
    V(release), V(none).
  returned: always
  type: str
note:
  description: Whose lease was taken over or broken.
  returned: when a lease was taken over or broken
  type: str
"""

import contextlib
import re
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.inference.plugins.module_utils import _lease

_UNIT = re.compile(r"^[A-Za-z0-9@_:.-]+$")


def run(module, now=None):
    params = module.params
    now = time.time() if now is None else now
    directory, unit = params["directory"], params["unit"]
    files = _lease.paths(directory, unit)
    holder = params["holder"] or {}
    if params["state"] == "query":
        lease, record = _lease.read(files["lease"]), _lease.read(files["record"])
        return dict(changed=False, action="none", lease=_lease.view(lease, now), record=record)
    if params["state"] == "held":
        try:
            return _lease.hold(directory, unit, holder, params["seconds"], now, record=params["record"],
                               check_mode=module.check_mode, intent_digest=params["intent_digest"],
                               force=params["force"], takeover_runs=params["takeover_runs"])
        except _lease.Refused as exc:
            module.fail_json(msg=str(exc), lease=exc.lease, record=exc.record, action="refused")
    # check mode reads without the lock (taking it would create the lock file)
    with _lease.locked(directory, unit) if not module.check_mode else contextlib.nullcontext():
        lease, record = _lease.read(files["lease"]), _lease.read(files["record"])
        new, released = _lease.release(lease, holder, now)
        action = "release" if released else "none"
        if params["record"] and released:
            record = _lease.merge_record(record, params["record"], now)
        changed = new != lease or bool(params["record"])
        if changed and not module.check_mode:
            if new != lease:
                _lease.write(files["lease"], new)
            if params["record"]:
                _lease.write(files["record"], record)
    return dict(changed=changed, action=action, lease=_lease.view(new, now), record=record)


ARGUMENT_SPEC = dict(
    unit=dict(type="str", required=True),
    state=dict(type="str", default="held", choices=["held", "released", "query"]),
    holder=dict(type="dict", options=_lease.HOLDER_SPEC),
    seconds=dict(type="int", default=300),
    intent_digest=dict(type="str"),
    force=dict(type="bool", default=False),
    takeover_runs=dict(type="list", elements="str", default=[]),
    record=dict(type="dict"),
    directory=dict(type="path", default="/var/lib/gpufleet-inference/fleet"),
)
REQUIRED_IF = [("state", "held", ("holder",)), ("state", "released", ("holder",))]


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True, required_if=REQUIRED_IF)
    if module.params["seconds"] <= 0:
        module.fail_json(msg="seconds must be greater than 0, got %s" % module.params["seconds"])
    if not _UNIT.match(module.params["unit"]):
        # it names the lease's files: a unit name, never a path
        module.fail_json(msg="unit must be a unit name (letters, digits, '@', '_', '.', ':', '-'), got %r"
                         % module.params["unit"])
    module.exit_json(**run(module))


if __name__ == "__main__":
    main()
