#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_compare
short_description: Compare one host with the role's intended SGLang settings in one task (changes nothing)
version_added: 0.2.0
description:
  - Used by the role C(gpufleet.inference.sglang) (entry point C(drift), so also C(main), the rollout's prepare
    phase, C(gpufleet.inference.verify) and C(gpufleet.inference.sweep)). An action plugin - it runs on the
    controller and sends the role's read-only modules to the host.
  - "In order: validate O(settings) (a setting SGLang or systemd would refuse fails here, naming the variable, before
    anything is asked of the host); detect the host's SGLang version from package metadata
    (M(gpufleet.inference.sglang_preflight); skipped when O(version) is given); build the intent for that version and
    render the role's unit and journald templates (O(templates), with C(__sglang_version) set); compare the host with
    them (M(gpufleet.inference.sglang_drift)); and only when the host must change, check the intended arguments with
    the host's own SGLang (M(gpufleet.inference.sglang_preflight) with C(args): parses, starts nothing)."
  - Through a connection with pipelining (Ansible's C(pipelining), a become without a tty), the version detection and
    the check run M(gpufleet.inference.sglang_preflight)'s two scripts as commands, their arguments and the server's
    environment on standard input (never on a command line), instead of sending the module - each module run ships
    about 0.2 MB to the host and starts Ansible's module wrapper there. Without pipelining the module runs. The checks
    and messages are the same.
  - The result is M(gpufleet.inference.sglang_drift)'s, plus RV(prepared) (what the role keeps for later steps).
  - Why one task - the five tasks it replaces each cost a controller fork and a templating of the role's settings,
    for every host of a fleet.
author:
  - gpufleet maintainers (@gpufleet)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.flow
  - gpufleet.inference.attributes.controller_to_host
notes:
  - Read-only; the role runs it with C(check_mode=false), so a check run compares too.
options:
  settings:
    description:
      - The role's settings (its internal C(__sglang_settings) - keys are the role's variable names, as
        documented in the role's argument specification).
    type: dict
    required: true
  version:
    description: The host's SGLang version; empty - detected on the host.
    type: str
    default: ""
  address:
    description: How other machines reach the host (C(ansible_host)); the router's worker URL of a wildcard bind.
    type: str
  worker_url:
    description: The worker URL a router uses for this host, when set (C(sglang_router_worker_url)).
    type: str
    default: ""
  templates:
    description: The role's templates to render (C(unit), C(journald)), found as the role's own templates are.
    type: dict
    required: true
  paths:
    description: Where the unit (C(unit)) and the journald drop-in (C(journald)) are installed.
    type: dict
    required: true
  secret_files:
    description:
      - Files holding secrets (M(gpufleet.inference.sglang_drift) O(gpufleet.inference.sglang_drift#module:secret_files)).
      - When not given, the SGLang config file that holds C(sglang_api_key), derived from O(settings) (path
        C(sglang_config_file), mode C(0640), owner C(root), group C(sglang_group)); none without an API key. This is
        the role's C(__sglang_secret_files).
    type: list
    elements: dict
  receipt_dir:
    description: M(gpufleet.inference.sglang_drift) O(gpufleet.inference.sglang_drift#module:receipt_dir).
    type: str
    required: true
  last_good_dir:
    description: M(gpufleet.inference.sglang_drift) O(gpufleet.inference.sglang_drift#module:last_good_dir).
    type: str
    required: true
  prompt:
    description: The C(/generate) probe's prompt.
    type: str
    required: true
  max_new_tokens:
    description: The C(/generate) probe's token budget.
    type: int
    required: true
  preflight:
    description: Check the intended arguments with the host's own SGLang when the host must change.
    type: bool
    default: true
  role_argument_spec:
    description:
      - Before anything else, check the role's variables against this entry point of the role's
        C(meta/argument_specs.yml), as the task Ansible puts in front of that entry point does (the task must be in
        the role). For a tasks file of the role that is not an entry point (the role's C(compare), which the
        rollout's prepare phase runs), that makes one task per host instead of two.
      - Invalid variables fail the task with C(step=validate) and C(argument_errors) before the host is asked
        anything.
    type: str
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
      C(command), C(environment)), C(unit_text) and C(journald_text) (the rendered files), C(paths) (O(paths)),
      C(config_file) (the SGLang config file's C(path), C(mode), C(owner) and C(group), never its content; null
      without an API key) and C(unit_files) (the paths a last-known-good copy keeps).
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
argument_errors:
  description: What is wrong with the role's variables (O(role_argument_spec)), one message per error.
  returned: when O(role_argument_spec) found errors
  type: list
  elements: str
"""
