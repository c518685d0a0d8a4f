#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_drift_report
short_description: Report the drift check of every host of a play, and fail on drift
version_added: 0.1.0
description:
  - Runs on the controller (an action plugin), once for the play (C(run_once)).
  - Reads each host's C(sglang_drift) fact, set by the role's C(drift) entry point; a host without one could not be
    checked (unreachable, invalid settings).
  - Shows one line per host - in sync, DRIFTED (what, expected vs observed), UNVERIFIED (why - journal retention or
    rate limit, no receipt), NOT RUNNING, NOT INSTALLED, NOT CHECKED - writes C(<results_dir>/<run id>/summary.json)
    and one C(<host>.json) each, and fails when a host is not in sync.
  - A multi-node serving group is one line with its nodes - in sync when every node is and every follower runs its
    head's arguments (its own C(--node-rank) and C(--host) aside, compared on the running command lines); a follower
    that runs other arguments than its head makes every node of its group drifted, naming the flags.
  - Changes nothing on the hosts and always reports C(changed=false) (the report is the controller's bookkeeping).
author:
  - gpufleet maintainers (@gpufleet)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
  - gpufleet.inference.attributes.controller
options:
  results_dir:
    description: Where reports are written.
    type: path
    default: results/verify
  hosts:
    description: The hosts to report (default - every host of the play).
    type: list
    elements: str
  accept_unverified:
    description: Count V(unverified) hosts as in sync (no evidence of their runtime settings, nothing differs).
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Report and fail on drift
  gpufleet.inference.sglang_drift_report:
    results_dir: /srv/drift
  run_once: true
"""

RETURN = r"""
run_dir:
  description: Where this report was written.
  returned: always
  type: str
records:
  description: Every host's drift record.
  returned: always
  type: list
  elements: dict
in_sync:
  description: Hosts in sync.
  returned: always
  type: list
  elements: str
drifted:
  description: Hosts not in sync (drifted, unverified unless accepted, not running, not checked).
  returned: always
  type: list
  elements: str
groups:
  description: Each serving group of the hosts - C(name), C(nodes) (head first), C(in_sync), C(differences) (what a
    follower runs other than its head - C(host), C(key), C(expected) the head's, C(observed) the follower's).
  returned: always
  type: list
  elements: dict
"""
