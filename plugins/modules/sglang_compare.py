#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_compare
short_description: Compare one host with the role's intended SGLang settings in one task (changes nothing)
version_added: 0.1.0
description:
  - The role P(gpufleet.inference.sglang#role)'s entry point C(drift) (so also C(main), the rollout's prepare phase,
    C(gpufleet.inference.verify) and C(gpufleet.inference.sweep)). An action plugin - it runs on the controller and
    sends the role's read-only modules to the host.
  - It reads the role's variables by their own names; Ansible has checked them against the entry point's argument
    specification before.
  - "In order: check what a specification cannot (a flag the role manages given again in C(sglang_extra_args), a
    setting this SGLang version would refuse), before anything is asked of the host; detect the host's SGLang version
    from package metadata (M(gpufleet.inference.sglang_preflight); skipped when C(sglang_version) is set); build the
    intent for that version and render the unit and journald's drop-in; compare the host with them
    (M(gpufleet.inference.sglang_drift)); and only when the host must change, check the intended arguments with the
    host's own SGLang (M(gpufleet.inference.sglang_preflight) with C(args): parses, starts nothing)."
  - A node of a multi-node serving group (C(sglang_serving_groups) or C(sglang_serving_group), with C(sglang_node_rank))
    gets its node's flags (C(--nnodes), C(--node-rank), C(--dist-init-addr), C(--dist-timeout)) in its unit. The group
    is judged whole first, from the variables of its other nodes (ranks, the same settings on every node); a problem
    fails the task naming the host and the variable, before anything is asked of the host. A follower (rank 1 and up)
    serves no HTTP and logs no config line - it is compared by its files, command line and environment only.
  - Through a connection with pipelining, the version detection and the check run M(gpufleet.inference.sglang_preflight)'s
    two scripts as commands, their arguments and the server's environment on standard input (never on a command line),
    instead of sending the module. Without pipelining the module runs. The checks and messages are the same.
  - The result is M(gpufleet.inference.sglang_drift)'s, plus RV(prepared) (what the host's later steps use); it sets
    the fact C(sglang_endpoint).
author:
  - gpufleet maintainers (@gpufleet)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
  - gpufleet.inference.attributes.controller_to_host
notes:
  - Read-only; the role runs it with C(check_mode=false), so a check run compares too.
options:
  preflight:
    description: Check the intended arguments with the host's own SGLang when the host must change.
    type: bool
    default: true
"""

EXAMPLES = r"""
# Through the role (entry point drift): the role passes its own values.
- name: Compare every host with its intent
  ansible.builtin.import_role:
    name: gpufleet.inference.sglang
    tasks_from: drift
"""

RETURN = r"""
verdict:
  description: M(gpufleet.inference.sglang_drift)'s verdict (all of its return values are returned).
  returned: when the comparison ran
  type: str
  sample: drifted
prepared:
  description:
    - C(version), C(version_source), C(endpoint) (C(url), C(worker_url)), C(intent) (C(expect), C(config_line),
      C(command), C(environment)), C(unit_text) and C(journald_text) (the rendered files), C(paths) (where C(unit)
      and C(journald) are installed),
      C(config_file) (the SGLang config file's C(path), C(mode), C(owner) and C(group), never its content; null
      without an API key) and C(unit_files) (the paths a last-known-good copy keeps).
    - C(group) for a node of a serving group - C(name), C(nnodes), C(head), C(followers), C(ranks), C(dist_init_addr),
      C(dist_timeout), C(defined_by) and this node's C(rank); the intent of a follower has C(follower=true).
  returned: when the comparison ran
  type: dict
preflight:
  description: What the host's own SGLang checked (C(checked), C(unchecked)), when the host must change.
  returned: when the arguments were checked
  type: dict
step:
  description: Where it failed - V(validate), V(version), V(intent), V(drift) or V(preflight).
  returned: failure
  type: str
ansible_facts:
  description: C(sglang_endpoint) - C(url) (where the modules probe the server on its host) and C(worker_url) (how a
    router reaches it).
  returned: when the comparison ran
  type: dict
"""
