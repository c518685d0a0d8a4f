#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_last_good
short_description: Keep, read or restore the last-known-good files of an SGLang unit
version_added: 0.1.0
description:
  - The last-known-good copy of a unit is what a failed rollout reverts to. It is kept in O(directory)/C(<unit>)/ with
    a C(record.json) saying which invocation was verified with these files and what it logged.
  - V(saved) copies the installed files there (atomically, modes kept; a file that no longer exists is dropped from
    the copy) and writes the record. Only a verified, settled and rejoined host should be saved.
  - V(restored) copies them back to their paths (atomically). It restarts nothing - the caller reloads systemd, restarts
    the unit and verifies it against the returned RV(record).
  - V(query) only reads.
author:
  - gpufleet maintainers (@gpufleet)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - gpufleet.inference.attributes
  - gpufleet.inference.lease
options:
  unit:
    description: The systemd unit.
    type: str
    default: sglang.service
  directory:
    description: Where last-known-good copies live (one sub-directory per unit, mode 0700).
    type: path
    default: /var/lib/gpufleet-inference/last-good
  files:
    description: Paths of the unit's files (the unit, the SGLang config file). Needed for V(saved).
    type: list
    elements: path
    default: []
  record:
    description: What to keep about the verified process (for V(saved)), for example its InvocationID, the intent it was
      verified against (C(expect), C(config_line), C(command), C(environment)) and what it logged.
    type: dict
    default: {}
  from_process:
    description:
      - For V(saved) after a lost restart handler (the installed unit is newer than what runs), keep, instead of the
        installed unit file (the file named O(unit)), that file with its C(ExecStart=) set to the command line of the
        unit's running main process and its C(Environment=) to that process's environment (C(EnvironmentFile=) lines
        dropped; what systemd sets by itself, such as C(INVOCATION_ID), C(PATH), C(HOME) or C(LANG), left out).
        The record's C(intent.environment) then holds the process's values. Other files (the SGLang config file)
        are kept as they are on disk.
      - Fails, saving nothing, when the unit has no running main process or its command line cannot be read.
    type: bool
    default: false
  state:
    description: What to do.
    type: str
    choices: [saved, restored, query]
    default: query
attributes:
  check_mode:
    details:
      - Reports what V(saved) or V(restored) would change, changes nothing.
  diff_mode:
    support: none
"""

EXAMPLES = r"""
- name: Keep the verified unit as last-known-good
  gpufleet.inference.sglang_last_good:
    unit: sglang.service
    files: [/etc/systemd/system/sglang.service, /etc/sglang/sglang.yaml]
    record: {invocation_id: "{{ verified.invocation_id }}", expect: "{{ verified.expected }}"}
    state: saved

- name: Put the last-known-good files back (then restart and verify)
  gpufleet.inference.sglang_last_good:
    unit: sglang.service
    state: restored
  register: last_good
"""

RETURN = r"""
exists:
  description: Whether a last-known-good copy exists (after the action).
  returned: always
  type: bool
record:
  description: The record kept with the copy (null when there is none).
  returned: always
  type: dict
files:
  description: The paths of the kept files.
  returned: always
  type: list
  elements: str
changed_files:
  description: The files V(saved) or V(restored) changed.
  returned: always
  type: list
  elements: str
lease:
  description: The host's lease after O(lease) renewed it, as M(gpufleet.inference.sglang_lease) returns it.
  returned: when O(lease) is given (not with V(query), which changes nothing)
  type: dict
"""

import json
import os
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.inference.plugins.module_utils import _lease
from ansible_collections.gpufleet.inference.plugins.module_utils._files import read_bytes, write_atomic
from ansible_collections.gpufleet.inference.plugins.module_utils._unit_file import parse_environ, rebuild_from_process

RECORD = "record.json"


def _copy_name(path):
    """Where a file is kept inside the unit's last-good directory (its path, flattened)."""
    return "file" + path.replace("/", "__")


class LastGood(object):
    def __init__(self, module):
        self.module = module
        params = module.params
        self.unit_dir = os.path.join(params["directory"], params["unit"])
        self.record_path = os.path.join(self.unit_dir, RECORD)

    def record(self):
        data = read_bytes(self.record_path)
        try:
            return json.loads(data) if data else None
        except ValueError:
            return None

    def running_process(self):
        """(main PID, argv, environment) of the unit's running main process; fails the module when none."""
        unit = self.module.params["unit"]
        rc, out, err = self.module.run_command(["systemctl", "show", "-p", "MainPID", "--value", unit])
        pid = out.strip() if rc == 0 else ""
        if not pid.isdigit() or pid == "0":
            self.module.fail_json(msg="from_process: %s has no running main process (%s); nothing saved" % (
                unit, (err or out).strip() or "MainPID=0"), exists=self.record() is not None, record=None,
                files=[], changed_files=[])
        raw_argv = read_bytes("/proc/%s/cmdline" % pid)
        raw_env = read_bytes("/proc/%s/environ" % pid)
        if not raw_argv or raw_env is None:
            self.module.fail_json(msg="from_process: cannot read the command line and environment of %s's main "
                                  "process %s (gone, or not root); nothing saved" % (unit, pid),
                                  exists=self.record() is not None, record=None, files=[], changed_files=[])
        argv = [part.decode("utf-8", "replace") for part in raw_argv.rstrip(b"\0").split(b"\0")]
        return int(pid), argv, parse_environ(raw_env)

    def save(self, files, record):
        changed = []
        kept = []
        wanted = {}
        process = self.running_process() if self.module.params["from_process"] else None
        record = dict(record)
        for path in files:
            data = read_bytes(path)
            if data is None:
                continue
            if process is not None and os.path.basename(path) == self.module.params["unit"]:
                pid, argv, environ = process
                try:
                    data = rebuild_from_process(data.decode("utf-8"), argv, environ).encode("utf-8")
                except ValueError as exc:
                    self.module.fail_json(msg="from_process: cannot rebuild %s from main process %s: %s; nothing "
                                          "saved" % (path, pid, exc), exists=self.record() is not None, record=None,
                                          files=[], changed_files=[])
                intent = dict(record.get("intent") or {})
                keys = set(intent.get("environment") or {})
                intent["environment"] = dict((key, environ[key]) for key in sorted(keys) if key in environ)
                record["intent"] = intent
                record["rebuilt_from_process"] = {"path": path, "main_pid": pid}
            info = os.stat(path)
            wanted[_copy_name(path)] = (path, data, info.st_mode & 0o7777, info.st_uid, info.st_gid)
        old = self.record() or {}
        for name, (path, data, mode, uid, gid) in sorted(wanted.items()):
            kept.append({"path": path, "copy": name, "mode": "%04o" % mode, "uid": uid, "gid": gid})
            if read_bytes(os.path.join(self.unit_dir, name)) != data:
                changed.append(path)
        dropped = [item["path"] for item in old.get("files", []) if item.get("copy") not in wanted]
        changed.extend(dropped)
        new_record = dict(record, files=kept)
        old_compare = dict(old)
        old_compare.pop("saved_at", None)
        record_changed = old_compare != new_record
        if not (changed or record_changed):
            return changed, old
        if self.module.check_mode:
            return changed or [self.record_path], dict(new_record, saved_at=None)
        if not os.path.isdir(self.unit_dir):
            os.makedirs(self.unit_dir, 0o700)
        os.chmod(self.unit_dir, 0o700)
        for name, (path, data, mode, dummy, dummy) in wanted.items():
            write_atomic(os.path.join(self.unit_dir, name), data, mode)
        for item in old.get("files", []):
            if item.get("copy") not in wanted and os.path.exists(os.path.join(self.unit_dir, item["copy"])):
                os.unlink(os.path.join(self.unit_dir, item["copy"]))
        new_record["saved_at"] = time.time()
        write_atomic(self.record_path, (json.dumps(new_record, indent=2, sort_keys=True) + "\n").encode(), 0o600)
        return changed or [self.record_path], new_record

    def restore(self):
        record = self.record()
        if record is None:
            self.module.fail_json(msg="no last-known-good copy of %s in %s to restore" % (
                self.module.params["unit"], self.unit_dir), exists=False, record=None, files=[], changed_files=[])
        changed = []
        for item in record.get("files", []):
            data = read_bytes(os.path.join(self.unit_dir, item["copy"]))
            if data is None:
                self.module.fail_json(msg="the last-known-good copy of %s lacks %s (%s)" % (
                    self.module.params["unit"], item["path"], item["copy"]), exists=True, record=record,
                    files=[], changed_files=[])
            owner = (item["uid"], item["gid"]) if "uid" in item and "gid" in item else None
            if read_bytes(item["path"]) != data:
                changed.append(item["path"])
                if not self.module.check_mode:
                    write_atomic(item["path"], data, int(item.get("mode", "0644"), 8), owner)
        return changed, record


def main():
    module = AnsibleModule(
        argument_spec=dict(
            unit=dict(type="str", default="sglang.service"),
            directory=dict(type="path", default="/var/lib/gpufleet-inference/last-good"),
            files=dict(type="list", elements="path", default=[]),
            record=dict(type="dict", default={}),
            from_process=dict(type="bool", default=False),
            state=dict(type="str", choices=["saved", "restored", "query"], default="query"),
            lease=dict(type="dict", options=_lease.RIDER_SPEC),
        ),
        supports_check_mode=True,
    )
    last_good = LastGood(module)
    state = module.params["state"]
    if state == "saved" and not module.params["files"]:
        module.fail_json(msg="state=saved needs files (the unit's paths)", exists=False, record=None, files=[],
                         changed_files=[])
    # the writer's step recorded (or refused) before anything is written; a query changes nothing
    held = _lease.ride(module) if state != "query" else {}
    if state == "saved":
        changed, record = last_good.save(module.params["files"], module.params["record"])
    elif state == "restored":
        changed, record = last_good.restore()
    else:
        changed, record = [], last_good.record()
    module.exit_json(changed=bool(changed), exists=record is not None, record=record,
                     files=[item["path"] for item in (record or {}).get("files", [])], changed_files=changed, **held)


if __name__ == "__main__":
    main()
