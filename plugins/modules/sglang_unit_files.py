#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_unit_files
short_description: Install an SGLang unit's files in one call (the unit checked by systemd before it lands)
version_added: 0.2.0
description:
  - Writes each file whose content, mode, owner or group differs, atomically (a temporary file in the same directory,
    mode and owner set, then renamed over the old one), creating missing parent directories (mode 0755).
  - A file with O(files[].verify_unit) is checked with C(systemd-analyze verify) on a copy named like the unit before
    anything is written; when systemd rejects it, the module fails and writes no file at all, so the old unit and
    the process that runs it stay as they were.
  - One module call instead of a C(template)/C(copy) task per file (each of those is a stat, a transfer and a copy);
    on a rollout's critical path every round trip to the host is time out of service.
  - Reloads and restarts nothing unless O(restart) is given; the role's handlers do, when RV(changed_files) names a
    file they care about.
  - With O(restart), when a file was written (or always, with O(restart.force)), then reloads systemd, enables the
    unit and restarts it in the same call, as M(ansible.builtin.systemd_service) with C(daemon_reload=true),
    C(enabled=true) and C(state=restarted) would; a rollout's critical path saves a module run on the host.
author:
  - gpufleet maintainers (@gpufleet)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - gpufleet.inference.attributes
  - gpufleet.inference.lease
options:
  files:
    description: Files whose content may be shown (in C(--diff) and in error messages).
    type: list
    elements: dict
    default: []
    suboptions: &file_suboptions
      path:
        description: Absolute path of the file.
        type: path
        required: true
      content:
        description: The whole content (never shown for O(secret_files)).
        type: str
        required: true
      mode:
        description: Octal mode, as a string.
        type: str
        default: "0644"
      owner:
        description: User name or numeric uid.
        type: str
        default: root
      group:
        description: Group name or numeric gid.
        type: str
        default: root
      verify_unit:
        description: Check the content with C(systemd-analyze verify) (on a copy named like the file) before writing.
        type: bool
        default: false
  secret_files:
    description: Files holding secrets (the SGLang config file with the API key). Their content is never returned,
      shown in a diff or logged.
    type: list
    elements: dict
    default: []
    # The same keys as O(files).
    suboptions: *file_suboptions
  restart:
    description: Restart this unit after the files are written (see the description).
    type: dict
    suboptions:
      unit:
        description: The unit to reload, enable and restart.
        type: str
        required: true
      force:
        description: Restart even when no file was written (a restart already pending).
        type: bool
        default: false
attributes:
  check_mode:
    support: full
    details:
      - Reports which files would change and whether O(restart) would restart; writes, verifies and restarts
        nothing.
  diff_mode:
    support: full
    details:
      - Before and after of each changed file of O(files); for O(secret_files) only that it changed.
"""

EXAMPLES = r"""
- name: Install the SGLang unit and its config file
  gpufleet.inference.sglang_unit_files:
    files:
      - path: /etc/systemd/system/sglang.service
        content: "{{ lookup('ansible.builtin.template', 'sglang.service.j2') }}"
        verify_unit: true
    secret_files:
      - path: /etc/sglang/sglang.yaml
        content: "api_key: {{ vault_sglang_api_key }}\n"
        mode: "0640"
        group: sglang
  register: installed
  notify: restart sglang
"""

RETURN = r"""
changed_files:
  description: Paths of the files written (or that would be, in check mode), in the order given.
  returned: always
  type: list
  elements: str
  sample: [/etc/systemd/system/sglang.service]
created_dirs:
  description: Directories created for them.
  returned: always
  type: list
  elements: str
restarted:
  description: Whether O(restart.unit) was restarted (or would be, in check mode).
  returned: always
  type: bool
status:
  description: The unit's properties before the restart (C(InvocationID) is the process the restart replaced).
  returned: when the unit was restarted
  type: dict
lease:
  description: The host's lease after O(lease) renewed it, as M(gpufleet.inference.sglang_lease) returns it.
  returned: when O(lease) is given
  type: dict
failed_at:
  description: V(restart) when the files were written but reloading, enabling or restarting the unit failed.
  returned: on that failure
  type: str
"""

import grp
import os
import pwd
import shutil
import stat
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.text.converters import to_bytes, to_text
from ansible_collections.gpufleet.inference.plugins.module_utils import _lease
from ansible_collections.gpufleet.inference.plugins.module_utils._files import read_bytes, write_atomic
from ansible_collections.gpufleet.inference.plugins.module_utils._systemd import parse_show, show_argv

FILE_SPEC = dict(
    path=dict(type="path", required=True),
    content=dict(type="str", required=True, no_log=False),
    mode=dict(type="str", default="0644"),
    owner=dict(type="str", default="root"),
    group=dict(type="str", default="root"),
    verify_unit=dict(type="bool", default=False),
)
SECRET_FILE_SPEC = dict(FILE_SPEC, content=dict(type="str", required=True, no_log=True))
ARGUMENT_SPEC = dict(
    files=dict(type="list", elements="dict", default=[], options=FILE_SPEC),
    secret_files=dict(type="list", elements="dict", default=[], options=SECRET_FILE_SPEC, no_log=True),
    restart=dict(type="dict", options=dict(unit=dict(type="str", required=True),
                                           force=dict(type="bool", default=False))),
    lease=dict(type="dict", options=_lease.RIDER_SPEC),
)
# What systemd_service returns as `status` and what the caller reads (the replaced InvocationID).
STATUS_PROPERTIES = ("Id", "InvocationID", "ActiveState", "SubState", "MainPID", "UnitFileState")


class InstallError(Exception):
    pass


class RestartError(Exception):
    pass


def _uid(owner):
    try:
        return int(owner) if owner.isdigit() else pwd.getpwnam(owner).pw_uid
    except KeyError:
        raise InstallError("user %s does not exist" % owner)


def _gid(group):
    try:
        return int(group) if group.isdigit() else grp.getgrnam(group).gr_gid
    except KeyError:
        raise InstallError("group %s does not exist" % group)


def _mode(text, path):
    try:
        return int(text, 8)
    except ValueError:
        raise InstallError("%s: mode %r is not an octal mode such as '0644'" % (path, text))


def plan(files, secret):
    """Each file with what it needs: {path, data, mode, uid, gid, verify_unit, secret, before, reasons}."""
    items = []
    for spec, is_secret in [(f, False) for f in files] + [(f, True) for f in secret]:
        path = spec["path"]
        if not os.path.isabs(path):
            raise InstallError("%s is not an absolute path" % path)
        item = dict(path=path, data=to_bytes(spec["content"]), mode=_mode(spec["mode"], path),
                    uid=_uid(spec["owner"]), gid=_gid(spec["group"]), verify_unit=spec["verify_unit"],
                    secret=is_secret, before=read_bytes(path), reasons=[])
        if item["before"] is None:
            item["reasons"].append("missing")
        else:
            if item["before"] != item["data"]:
                item["reasons"].append("content")
            st = os.stat(path)
            if stat.S_IMODE(st.st_mode) != item["mode"]:
                item["reasons"].append("mode")
            if (st.st_uid, st.st_gid) != (item["uid"], item["gid"]):
                item["reasons"].append("owner")
        items.append(item)
    return items


def verify_unit(module, item):
    """systemd-analyze verify on a copy named like the unit (it only accepts unit names)."""
    analyze = module.get_bin_path("systemd-analyze", required=True)
    directory = tempfile.mkdtemp(prefix="gpufleet-verify-")
    try:
        copy = os.path.join(directory, os.path.basename(item["path"]))
        with open(copy, "wb") as handle:
            handle.write(item["data"])
        rc, out, err = module.run_command([analyze, "verify", copy])
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    if rc != 0:
        said = (to_text(err).strip() or to_text(out).strip() or "no output").replace(directory + "/", "")
        raise InstallError("systemd-analyze verify rejected %s (exit %s): %s. Nothing was written: the old unit and "
                           "its process stay as they were." % (item["path"], rc, said))


def install(module, items):
    """Verify every unit that changes, then write what differs. Returns (changed_files, created_dirs)."""
    changing = [item for item in items if item["reasons"]]
    if module.check_mode:
        return [item["path"] for item in changing], []
    for item in changing:
        if item["verify_unit"] and set(item["reasons"]) & {"content", "missing"}:
            verify_unit(module, item)
    created = []
    for item in changing:
        directory = os.path.dirname(item["path"])
        if not os.path.isdir(directory):
            os.makedirs(directory, 0o755)
            created.append(directory)
        write_atomic(item["path"], item["data"], item["mode"], (item["uid"], item["gid"]))
    return [item["path"] for item in changing], created


def restart(module, spec, changed_files):
    """daemon-reload, enable (when not enabled) and restart the unit, after a file was written or with
    force. Returns {restarted, status}: the unit's properties read before the restart."""
    if not spec or not (changed_files or spec["force"]):
        return {"restarted": False}
    if module.check_mode:
        return {"restarted": True}
    systemctl = module.get_bin_path("systemctl", required=True)

    def run(argv):
        rc, out, err = module.run_command(argv)
        if rc != 0:
            said = to_text(err).strip() or to_text(out).strip() or "no output"
            raise RestartError("%s failed (exit %s): %s" % (" ".join(argv[1:]), rc, said))
        return to_text(out)

    unit = spec["unit"]
    run([systemctl, "daemon-reload"])
    status = parse_show(run(show_argv(unit, STATUS_PROPERTIES, systemctl)))
    if status.get("UnitFileState") != "enabled":
        run([systemctl, "enable", unit])
    run([systemctl, "restart", unit])
    return {"restarted": True, "status": status}


def diff_of(items):
    diffs = []
    for item in items:
        if not item["reasons"]:
            continue
        if item["secret"]:
            diffs.append({"before_header": item["path"], "after_header": item["path"],
                          "before": "", "after": "(secret file changed: %s)\n" % ", ".join(item["reasons"])})
        else:
            diffs.append({"before_header": item["path"], "after_header": item["path"],
                          "before": to_text(item["before"] or b""), "after": to_text(item["data"])})
    return diffs


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    try:
        items = plan(module.params["files"], module.params["secret_files"])
    except (InstallError, OSError) as exc:
        module.fail_json(msg=str(exc), changed_files=[], created_dirs=[], restarted=False)
    held = _lease.ride(module)  # the writer's step recorded (or refused) before anything is written
    try:
        changed_files, created_dirs = install(module, items)
    except (InstallError, OSError) as exc:
        module.fail_json(msg=str(exc), changed_files=[], created_dirs=[], restarted=False, **held)
    try:
        restarted = restart(module, module.params["restart"], changed_files)
    except RestartError as exc:
        said = "%s written, but %s" % (", ".join(changed_files), exc) if changed_files else str(exc)
        module.fail_json(msg=said, changed=True,  # the unit may have been stopped: never "nothing changed"
                         changed_files=changed_files, created_dirs=created_dirs, restarted=False, failed_at="restart",
                         **held)
    result = dict(changed=bool(changed_files) or restarted["restarted"], changed_files=changed_files,
                  created_dirs=created_dirs, **dict(restarted, **held))
    if module._diff:
        result["diff"] = diff_of(items)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
