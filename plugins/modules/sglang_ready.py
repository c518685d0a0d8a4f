#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_ready
short_description: Wait until the new process of an SGLang systemd unit serves the intended settings
version_added: 0.1.0
description:
  - Blocks until the B(new) process of an SGLang systemd unit has logged its config line and answers C(/generate),
    and fails as soon as that process disagrees with the intended settings.
  - The new process is identified by systemd's C(InvocationID) only, never by time or by grepping the unit's log.
  - Only journal entries of that invocation (C(_SYSTEMD_INVOCATION_ID=)) are read, incrementally with a cursor, so
    the cost of a poll never grows with the journal.
  - Fails fast when the invocation dies or systemd restarts it (crash loop), when a process outside the unit
    answers on the port, when the config line is missing once C(/generate) answers, and on timeout with the
    last phase and the last journal line seen.
  - When journald's rate limiting dropped the config line (C(Suppressed N messages from UNIT)), the settings are
    compared with C(/server_info) instead and RV(source) says so.
  - Only observes; never changes anything (C(changed) is always false).
author:
  - gpufleet maintainers (@gpufleet)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - gpufleet.inference.server
  - gpufleet.inference.wait
attributes:
  check_mode:
    support: full
    details:
      - With O(after_invocation) nothing was restarted in check mode, so the module returns at once without waiting.
      - Without O(after_invocation) it verifies the running invocation, which is read-only anyway.
  diff_mode:
    support: none
  platform:
    platforms: posix
options:
  unit:
    description:
      - The systemd unit running SGLang.
    type: str
    default: sglang.service
  after_invocation:
    description:
      - The unit's C(InvocationID) snapshotted before the restart (for example RV(gpufleet.inference.sglang_info#module:invocation_id)).
      - When given, only a B(different) invocation counts; the old process is never probed.
      - When omitted, the current invocation is verified (drift check).
    type: str
  expect:
    description:
      - "Intended values of keys of the config line, for example C({draft_window_size: 2048, compact_cache: true, block_size: 16})."
      - Values are compared with coercion, since Jinja renders them as strings; C("2048") equals C(2048),
        C("None") and C(null) equal C(None), C("true") equals C(True).
      - Every key is compared; when empty, only readiness is checked.
    type: dict
    default: {}
  prompt:
    description:
      - Prompt of the C(/generate) probe (greedy decoding).
    type: str
    default: The capital of France is
  max_new_tokens:
    description:
      - C(max_new_tokens) of the C(/generate) probe.
    type: int
    default: 8
  crash_loop_restarts:
    description:
      - How many restarts by systemd (C(Restart=)) of the new process to tolerate before failing.
      - The default V(0) fails at the first one.
    type: int
    default: 0
  journal_grace:
    description:
      - When C(/generate) answers but the journal of the invocation has no config line, how many
        seconds to keep looking for journald's C(Suppressed N messages) notice before failing.
      - journald writes that notice only after its rate-limit interval (C(RateLimitIntervalSec=),
        30 seconds by default) has passed and the unit logs again (the module's C(/generate) probe
        makes it log); set this a few seconds above that interval. With a notice, C(/server_info)
        stands in for the lost config line. V(0) fails at once.
    type: float
    default: 35
  verify_listener:
    description:
      - Check that the process listening on the host and port of O(url) belongs to the unit's cgroup
        (and is the invocation's main process or one of its children).
      - Reads C(/proc/net/tcp), C(/proc/net/tcp6) and C(/proc/*/fd), so it needs root to see the unit's processes.
      - A listener whose owner is not visible in this host's C(/proc) (another container sharing the network
        namespace, or the machine) counts as outside the unit.
    type: bool
    default: true
notes:
  - Needs C(systemctl) and C(journalctl) on the managed host; no Python libraries beyond Ansible's own.
  - Reading other units' journal entries and C(/proc/*/fd) needs privileges; run the task with C(become=true).
seealso:
  - module: gpufleet.inference.sglang_info
"""

EXAMPLES = r"""
- name: Snapshot the running invocation before changing the unit
  gpufleet.inference.sglang_info:
    unit: sglang.service
  register: before

- name: Restart SGLang
  ansible.builtin.systemd_service:
    name: sglang.service
    state: restarted
    daemon_reload: true

- name: Wait for the NEW process and check it runs the new settings
  gpufleet.inference.sglang_ready:
    unit: sglang.service
    after_invocation: "{{ before.invocation_id }}"
    url: http://127.0.0.1:30000
    expect:
      draft_window_size: 2048
      compact_cache: true
      block_size: 16
    timeout: 1200

- name: Drift check of the running process (no restart)
  gpufleet.inference.sglang_ready:
    unit: sglang.service
    expect: "{{ sglang_expect }}"
    timeout: 60
"""

RETURN = r"""
verdict:
  description:
    - How the wait ended; V(pass) on success, V(check_mode) when skipped in check mode, otherwise one of
      V(mismatch), V(died), V(crash_loop), V(timeout), V(foreign_listener), V(missing_config_line),
      V(unauthorized), V(not_active), V(not_found).
  returned: always
  type: str
  sample: pass
invocation_id:
  description: The InvocationID of the process that was checked.
  returned: always
  type: str
  sample: 0b5a3c2d9e4f4c7a8b1d2e3f4a5b6c7d
main_pid:
  description: The unit's MainPID at the last poll.
  returned: always
  type: int
  sample: 4242
unit_state:
  description: The unit's state at the last poll.
  returned: always
  type: dict
  sample: {"invocation_id": "0b5a3c2d9e4f4c7a8b1d2e3f4a5b6c7d", "active_state": "active", "sub_state": "running",
           "main_pid": 4242, "n_restarts": 0, "control_group": "/system.slice/sglang.service", "result": "success"}
expected:
  description: O(expect) with its values coerced (what was compared).
  returned: always
  type: dict
  sample: {"draft_window_size": 2048, "compact_cache": true, "block_size": 16}
observed:
  description: The key/value pairs of the config line (or those derived from C(/server_info), see RV(source)).
  returned: always
  type: dict
  sample: {"attention_backend": "flashinfer", "model": "DFlashDraftModel", "block_size": 16,
           "draft_window_size": 2048, "compact_cache": true}
config_line:
  description: The config line as logged by the checked invocation.
  returned: always
  type: str
  sample: "[2026-11-29 10:00:00 TP0] Initialized DFLASH draft runner. attention_backend=flashinfer, model=DFlashDraftModel,
    block_size=16, draft_window_size=2048, compact_cache=True"
source:
  description: Where RV(observed) comes from; V(journal), or V(server_info) when journald dropped the config line.
  returned: always
  type: str
  sample: journal
elapsed:
  description: Seconds spent waiting (monotonic clock).
  returned: always
  type: float
  sample: 312.4
phases:
  description:
    - When each phase was reached, as C(elapsed) seconds since the module started and C(at) (UTC).
    - Keys are V(new_invocation) (or V(invocation) without O(after_invocation)), V(config_line), V(port_open) and
      V(generate) (the first good C(/generate)).
  returned: always
  type: dict
  sample: {"new_invocation": {"elapsed": 0.01, "at": "2026-11-29T10:00:00Z", "invocation_id": "0b5a3c2d",
           "process_start": "Sun 2026-11-29 09:59:58 UTC", "main_pid": 4242},
           "config_line": {"elapsed": 290.2, "at": "2026-11-29T10:04:50Z", "logged_at": "2026-11-29 10:04:49"},
           "port_open": {"elapsed": 305.0, "at": "2026-11-29T10:05:05Z"},
           "generate": {"elapsed": 305.3, "at": "2026-11-29T10:05:05Z"}}
phase:
  description: The last phase reached, in words.
  returned: always
  type: str
  sample: "config line agrees; waiting for /generate"
generate:
  description: The first good C(/generate) answer, with a text excerpt and its C(meta_info).
  returned: when /generate answered
  type: dict
  sample: {"status": 200, "text": " Paris. The capital of Germany is",
           "meta_info": {"completion_tokens": 8, "spec_accept_length": 3.2}}
listener:
  description: Who owns the socket listening on the host and port of O(url) (O(verify_listener)).
  returned: when the port was open
  type: dict
  sample: {"verdict": "inside", "message": "127.0.0.1:30000 is served by pid 4242 in /system.slice/sglang.service",
           "owners": [{"pid": 4242, "comm": "python3", "cgroup": "/system.slice/sglang.service", "inode": "123456"}]}
journal_tail:
  description: The last journal lines of the invocation that died.
  returned: when the invocation died or crash-looped
  type: list
  elements: str
suppression:
  description: journald's rate-limit notices for the invocation, when the config line was missing.
  returned: when journald suppressed messages of the invocation
  type: dict
  sample: {"messages_dropped": 12345, "notices": ["Suppressed 12345 messages from sglang.service"]}
notes:
  description: Things worth knowing about how the result was reached (fallbacks, tolerated restarts).
  returned: always
  type: list
  elements: str
"""

import shutil

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.inference.plugins.module_utils._args import flags_for_key
from ansible_collections.gpufleet.inference.plugins.module_utils._journal import InvocationJournal, suppressed_notices
from ansible_collections.gpufleet.inference.plugins.module_utils._probe import HttpClient, listener_provenance, url_host_port
from ansible_collections.gpufleet.inference.plugins.module_utils._systemd import Systemd
from ansible_collections.gpufleet.inference.plugins.module_utils._wait import CHECK_MODE, Waiter

COMMAND_ENV = {"LC_ALL": "C", "SYSTEMD_COLORS": "0", "SYSTEMD_PAGER": "", "SYSTEMD_LESS": ""}


def command_runner(module):
    """run(argv) -> (rc, out, err) with a stable locale and no pager or colours."""
    def run(argv):
        return module.run_command(argv, environ_update=COMMAND_ENV)
    return run


def binary(module, name):
    return module.get_bin_path(name) or shutil.which(name) or name


class SGLangReady(object):

    def __init__(self, module):
        self.module = module
        self.params = module.params

    def waiter(self):
        params = self.params
        run = command_runner(self.module)
        unit = params["unit"]
        journalctl = binary(self.module, "journalctl")
        host, port = url_host_port(params["url"])
        provenance = None
        if params["verify_listener"]:
            def provenance(control_group, main_pid):
                return listener_provenance(host, port, control_group, unit, main_pid=main_pid)
        return Waiter(
            systemd=Systemd(run, unit, binary(self.module, "systemctl")),
            journal_factory=lambda invocation_id: InvocationJournal(run, invocation_id, journalctl=journalctl),
            http=HttpClient(params["url"], params["api_key"], params["validate_certs"]),
            unit=unit,
            after_invocation=params["after_invocation"],
            expect=params["expect"],
            timeout=params["timeout"],
            poll_interval=params["poll_interval"],
            request_timeout=params["request_timeout"],
            max_new_tokens=params["max_new_tokens"],
            prompt=params["prompt"],
            crash_loop_restarts=params["crash_loop_restarts"],
            journal_grace=params["journal_grace"],
            provenance=provenance,
            suppressed=lambda invocation_id, since: suppressed_notices(run, unit, invocation_id, since, journalctl),
            flags_for_key=flags_for_key,
            check_mode=self.module.check_mode,
        )

    def run(self):
        for name in ("timeout", "poll_interval", "request_timeout"):
            if self.params[name] <= 0:
                self.module.fail_json(msg="%s must be greater than 0, got %s" % (name, self.params[name]))
        waiter = self.waiter()
        outcome = waiter.run()
        result = waiter.result()
        result.update(changed=False, verdict=outcome.verdict, msg=outcome.msg)
        if outcome.verdict == CHECK_MODE:
            result["skipped"] = True
        for note in waiter.notes:
            if "server_info" in note:
                self.module.warn(note)
        if not outcome.ok:
            self.module.fail_json(**result)
        self.module.exit_json(**result)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            unit=dict(type="str", default="sglang.service"),
            after_invocation=dict(type="str"),
            expect=dict(type="dict", default={}),
            url=dict(type="str", default="http://127.0.0.1:30000"),
            api_key=dict(type="str", no_log=True),
            validate_certs=dict(type="bool", default=True),
            timeout=dict(type="float", default=900),
            poll_interval=dict(type="float", default=5),
            request_timeout=dict(type="float", default=60),
            prompt=dict(type="str", default="The capital of France is"),
            max_new_tokens=dict(type="int", default=8, no_log=False),
            crash_loop_restarts=dict(type="int", default=0),
            journal_grace=dict(type="float", default=35),
            verify_listener=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    SGLangReady(module).run()


if __name__ == "__main__":
    main()
