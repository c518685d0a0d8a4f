# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment(object):

    # The lease option of a module a writer's step runs (the host's lease, M(gpufleet.inference.sglang_lease)).
    # Argument spec: plugins/module_utils/_lease.py RIDER_SPEC.
    DOCUMENTATION = r"""
options:
  lease:
    description:
      - For a writer that holds the host's lease (a rollout, a sweep, the role's C(apply) and C(revert)). Before the
        module changes anything, it renews that lease and merges O(lease.record) into the host's record, as
        M(gpufleet.inference.sglang_lease) with O(gpufleet.inference.sglang_lease#module:state=held) would, in the
        same module run.
      - When the lease is not the caller's any more (taken over, even if released since), the module fails with
        C(action=refused) and changes nothing.
      - Only renews a lease the caller took; taking one is M(gpufleet.inference.sglang_lease)'s. Without
        C(generation) in O(lease.holder) the module fails and changes nothing.
    type: dict
    suboptions:
      unit:
        description: The SGLang unit the lease is about.
        type: str
        required: true
      directory:
        description: Where the host keeps its leases and records (the role's C(sglang_fleet_dir)).
        type: path
        required: true
      holder:
        description:
          - The holder, as M(gpufleet.inference.sglang_lease) takes it (C(kind), C(run_id), C(session), C(generation),
            C(controller), C(user), C(job), C(process)).
        type: dict
        required: true
      seconds:
        description: How long the lease lasts from now.
        type: int
        default: 300
      record:
        description: The step merged into the host's record.
        type: dict
"""
