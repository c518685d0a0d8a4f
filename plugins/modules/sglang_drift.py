#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_drift
short_description: Compare an SGLang unit and its running process with the intended settings (read-only)
version_added: 0.1.0
description:
  - One read-only look at a host - does it run what the role would make of its variables?
  - Compares the installed files (the unit, the SGLang config file that holds the API key) with their intended
    content, mode and owner; the content of the O(secret_files) is never shown.
  - Compares what systemd would run (effective C(ExecStart=) and C(Environment=), drop-ins included) with the
    intent, naming drop-ins that change them (RV(blocking) - restarting cannot fix those).
  - Compares what runs - the main process's command line and environment, and the config lines of the running
    invocation (from the receipt of its verification, else its journal) through the collection's one comparator.
  - Compares C(/server_info) with the intended settings; it echoes the parsed arguments, so a difference means
    other arguments were launched, and agreement is never evidence.
  - Sends one C(/generate) (O(probe)) to see that the process serves.
  - Never changes anything.
author:
  - gpufleet maintainers (@gpufleet)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - gpufleet.inference.attributes
  - gpufleet.inference.server
  - gpufleet.inference.unit
  - gpufleet.inference.intent
  - gpufleet.inference.probe
options:
  files:
    description:
      - The files of the unit as the role renders them.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: Absolute path of the file.
        type: path
        required: true
      content:
        description: Its intended content.
        type: str
        required: true
      mode:
        description: Its intended mode, for example C("0644") (an unquoted YAML C(0644) works too).
        type: raw
      owner:
        description: Its intended owner.
        type: str
      group:
        description: Its intended group.
        type: str
      restart_on_change:
        description: Whether SGLang must restart when this file changes (V(false) for a journald drop-in).
        type: bool
        default: true
  secret_files:
    description:
      - Like O(files), for files whose content is secret (the SGLang config file with the API key). Their content is
        masked in every output.
    type: list
    elements: dict
    default: []
    suboptions:
      path:
        description: Absolute path of the file.
        type: path
        required: true
      content:
        description: Its intended content (masked in every output).
        type: str
        required: true
      mode:
        description: Its intended mode.
        type: raw
      owner:
        description: Its intended owner.
        type: str
      group:
        description: Its intended group.
        type: str
  server_info:
    description:
      - The intended C(/server_info) keys and values (as M(gpufleet.inference.sglang_compare) builds them). Omit to
        skip the comparison.
    type: dict
  last_good_dir:
    description: Where M(gpufleet.inference.sglang_last_good) keeps copies; RV(last_good) says whether one exists.
    type: path
    default: /var/lib/gpufleet-inference/last-good
  fleet_dir:
    description:
      - Where M(gpufleet.inference.sglang_lease) keeps the host's lease and record; RV(lease) and RV(record) are read
        from there (read-only), so a rollout's prepare phase sees who holds the host without another module run.
    type: path
    default: /var/lib/gpufleet-inference/fleet
  accounts:
    description:
      - The user and group the unit runs as (C(user), C(group)); RV(missing_accounts) names those that do not exist
        on the host, so the role creates them only then (not at every change).
    type: dict
    default: {}
  probe:
    description: Send one C(/generate) to check that the process serves.
    type: bool
    default: true
  request_timeout:
    description: Seconds each HTTP request may take.
    type: float
    default: 30
seealso:
  - module: gpufleet.inference.sglang_ready
  - module: gpufleet.inference.sglang_info
"""

EXAMPLES = r"""
- name: Compare the host with its intended settings (changes nothing)
  gpufleet.inference.sglang_drift:
    unit: sglang.service
    url: http://127.0.0.1:30000
    files:
      - path: /etc/systemd/system/sglang.service
        content: "{{ lookup('ansible.builtin.template', 'sglang.service.j2') }}"
        mode: "0644"
    expect: {draft_window_size: 2048, compact_cache: true, block_size: 16}
    config_line: required
  register: drift

- name: Fail on drift
  ansible.builtin.assert:
    that: drift.in_sync
    fail_msg: "{{ drift.differences }}"
"""

RETURN = r"""
verdict:
  description: V(in_sync), V(drifted), V(unverified) (nothing differs, but there is no evidence of the runtime
    settings - journal lost and no receipt), V(not_running) or V(not_installed).
  returned: always
  type: str
  sample: in_sync
in_sync:
  description: Whether nothing differs and the settings are verified.
  returned: always
  type: bool
differences:
  description: Each difference - C(what) (file, file mode, effective unit, command line, process environment,
    config line, server_info, process), C(key), C(expected), C(observed).
  returned: always
  type: list
  elements: dict
  sample: [{"what": "config line", "key": "draft_window_size", "expected": 2048, "observed": 4096}]
changed_files:
  description: The paths of O(files) and O(secret_files) that differ from their intended state (or are missing).
  returned: always
  type: list
  elements: str
missing_files:
  description: The paths of those that do not exist.
  returned: always
  type: list
  elements: str
missing_accounts:
  description: Of O(accounts), those that do not exist on the host, as C(user NAME) or C(group NAME).
  returned: always
  type: list
  elements: str
  sample: [group sglang, user sglang]
enabled:
  description: Whether the unit is enabled (C(UnitFileState)).
  returned: when the unit exists
  type: bool
restart_pending:
  description: The files are as intended but the process does not run them (RV(restart_reasons)).
  returned: always
  type: bool
restart_reasons:
  description: Why a restart is pending.
  returned: always
  type: list
  elements: str
blocking:
  description: Differences a restart cannot fix (drop-ins overriding C(ExecStart=) or C(Environment=)).
  returned: always
  type: list
  elements: str
unit_diff:
  description: Unified diff of the installed unit against the intended one.
  returned: always
  type: list
  elements: str
invocation_id:
  description: The running invocation.
  returned: always
  type: str
main_pid:
  description: Its main PID.
  returned: always
  type: int
unit_state:
  description: The unit's state.
  returned: when the unit exists
  type: dict
effective:
  description: What systemd would run (fragment, drop-ins, ExecStart argv, Environment, EnvironmentFiles).
  returned: when the unit exists
  type: dict
observed:
  description: The values of the (last) config line of the running invocation.
  returned: when running
  type: dict
config_lines:
  description: Its config lines (secrets masked).
  returned: when running
  type: list
  elements: str
source:
  description: Where the config lines come from - V(journal), V(receipt), V(receipt+journal) (the receipt and later journal lines), or null.
  returned: when running
  type: str
receipt:
  description: Whether a receipt of the running invocation exists.
  returned: when running
  type: bool
serving:
  description: Whether C(/generate) answered (O(probe)).
  returned: when running and probed
  type: bool
server_info:
  description: A subset of C(/server_info) (never the API key).
  returned: when running and O(server_info) is given
  type: dict
last_good:
  description: Whether a last-known-good copy of the unit exists (C(exists), C(invocation_id), C(saved_at), C(adopted)).
  returned: always
  type: dict
lease:
  description: The host's lease (M(gpufleet.inference.sglang_lease)'s RV(gpufleet.inference.sglang_lease#module:lease)),
    or null.
  returned: always
  type: dict
record:
  description: The host's record (what the last writer of the collection did to it), or null.
  returned: always
  type: dict
unverified_reason:
  description: Why the settings could not be verified.
  returned: when RV(verdict=unverified)
  type: str
"""

import grp
import pwd
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.inference.plugins.module_utils import _argspec
from ansible_collections.gpufleet.inference.plugins.module_utils import _lease
from ansible_collections.gpufleet.inference.plugins.module_utils._http import server_api_key
from ansible_collections.gpufleet.inference.plugins.module_utils._drift import DriftCheck
from ansible_collections.gpufleet.inference.plugins.module_utils._host import CommandRunner, Host
from ansible_collections.gpufleet.inference.plugins.module_utils._evidence import Intent

FILE_SPEC = dict(path=dict(type="path", required=True), content=dict(type="str", required=True),
                 mode=dict(type="raw"), owner=dict(type="str"), group=dict(type="str"),
                 restart_on_change=dict(type="bool", default=True))
SECRET_FILE_SPEC = dict(path=dict(type="path", required=True), content=dict(type="str", required=True, no_log=True),
                        mode=dict(type="raw"), owner=dict(type="str"), group=dict(type="str"))

ARGUMENT_SPEC = _argspec.merged(
    _argspec.SERVER, _argspec.UNIT, _argspec.INTENT, _argspec.PROBE,
    files=dict(type="list", elements="dict", default=[], options=FILE_SPEC),
    # the list is not a secret itself; the content of each file is (no_log in SECRET_FILE_SPEC)
    secret_files=dict(type="list", elements="dict", default=[], options=SECRET_FILE_SPEC, no_log=False),
    server_info=dict(type="dict"),
    last_good_dir=dict(type="path", default="/var/lib/gpufleet-inference/last-good"),
    fleet_dir=dict(type="path", default="/var/lib/gpufleet-inference/fleet"),
    accounts=dict(type="dict", default={}),
    probe=dict(type="bool", default=True),
    request_timeout=dict(type="float", default=30),
)


def missing_accounts(accounts):
    """`user NAME` / `group NAME` for each of accounts' user and group that does not exist here."""
    missing = []
    for kind, lookup in (("group", grp.getgrnam), ("user", pwd.getpwnam)):
        name = accounts.get(kind)
        if not name or str(name).isdigit():
            continue
        try:
            lookup(str(name))
        except KeyError:
            missing.append("%s %s" % (kind, name))
    return missing


def run(module, host=None):
    params = module.params
    host = host or Host(CommandRunner(module), params["unit"], params["url"], server_api_key(module),
                        params["validate_certs"], params["prompt"], params["max_new_tokens"],
                        params["verify_listener"], params["receipt_dir"])
    files = list(params["files"]) + [dict(spec, secret=True) for spec in params["secret_files"]]
    intent = Intent(params["expect"], params["config_line"], params["command"], params["environment"])
    result = DriftCheck(host, intent, files, params["server_info"], params["probe"], params["request_timeout"],
                        params["last_good_dir"]).run()
    result["missing_accounts"] = missing_accounts(params["accounts"])
    files_of = _lease.paths(params["fleet_dir"], params["unit"])
    result["lease"] = _lease.view(_lease.read(files_of["lease"]), time.time())
    result["record"] = _lease.read(files_of["record"])
    module.exit_json(changed=False, **result)


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    run(module)


if __name__ == "__main__":
    main()
