# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Everything the modules read on a managed host, behind one object.

Private to this collection: no compatibility promise.

``CommandRunner`` is the one way the modules run commands (stable locale, no pager, no colours,
binaries found once). ``Host`` gathers the reads of one SGLang unit: systemd, its invocation's
journal, /proc, the HTTP server, receipts. The wait (_wait.Waiter) and the drift check take a
Host, and unit tests give them a fake one.
"""
from __future__ import annotations

import ctypes
import datetime
import os
import shutil
import signal
import subprocess
import time

from ansible_collections.gpufleet.inference.plugins.module_utils import _evidence as ev
from ansible_collections.gpufleet.inference.plugins.module_utils._flags import flags_for_key
from ansible_collections.gpufleet.inference.plugins.module_utils._http import HttpClient
from ansible_collections.gpufleet.inference.plugins.module_utils._journal import (
    InvocationJournal,
    JournalFollower,
    restarts_since,
    suppressed_notices,
)
from ansible_collections.gpufleet.inference.plugins.module_utils._probe import (
    generate,
    listener_provenance,
    port_accepts,
    server_info,
    url_host_port,
)
from ansible_collections.gpufleet.inference.plugins.module_utils._process import (
    process_alive,
    process_start_time,
    read_cmdline,
    read_environ,
)
from ansible_collections.gpufleet.inference.plugins.module_utils._startup import GREP_PATTERN
from ansible_collections.gpufleet.inference.plugins.module_utils._systemd import Systemd, journald_storage

COMMAND_ENV = {"LC_ALL": "C", "SYSTEMD_COLORS": "0", "SYSTEMD_PAGER": "", "SYSTEMD_LESS": ""}
DEFAULT_RECEIPT_DIR = "/var/lib/gpufleet-inference/receipts"
_PR_SET_PDEATHSIG = 1


class CommandRunner(object):
    """run(argv) -> (rc, out, err) through module.run_command; bin(name) -> path (found once)."""

    def __init__(self, module):
        self.module = module
        self._bins = {}

    def run(self, argv):
        return self.module.run_command(argv, environ_update=COMMAND_ENV)

    def bin(self, name):
        if name not in self._bins:
            self._bins[name] = self.module.get_bin_path(name) or shutil.which(name) or name
        return self._bins[name]


def _die_with_parent():
    """In the child before exec: get SIGTERM when the module process ends, however it ends."""
    try:
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def spawn_follower(argv):
    """A long-running reader (journalctl --follow) that cannot outlive the module."""
    env = dict(os.environ)
    env.update(COMMAND_ENV)
    # module.run_command cannot stream; this process is killed by the follower's close(),
    # and by PDEATHSIG should the module die first.
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,  # pylint: disable=consider-using-with
                            stdin=subprocess.DEVNULL, env=env, preexec_fn=_die_with_parent, close_fds=True)


class Host(object):
    """The reads of one SGLang unit on this host."""

    def __init__(self, runner, unit, url, api_key=None, validate_certs=True, prompt="The capital of France is",
                 max_new_tokens=8, verify_listener=True, receipt_dir=DEFAULT_RECEIPT_DIR, proc_root="/",
                 http=None, spawn=spawn_follower):
        self.runner = runner
        self.unit = unit
        self.url = url
        self.prompt = prompt
        self.max_new_tokens = max_new_tokens
        self.verify_listener = verify_listener
        self.receipt_dir = receipt_dir
        self.receipt_path = ev.receipt_path(receipt_dir, unit)
        self.proc_root = proc_root
        self.http = http or HttpClient(url, api_key, validate_certs)
        self.address, self.port = url_host_port(url)
        self.spawn = spawn
        self.systemd = Systemd(runner.run, unit, runner.bin("systemctl"))
        self.journalctl = runner.bin("journalctl")

    # clocks
    @staticmethod
    def clock():
        return time.monotonic()

    @staticmethod
    def wall():
        return time.time()

    @staticmethod
    def wall_iso():
        return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")[:-4] + "Z"

    @staticmethod
    def sleep(seconds):
        time.sleep(seconds)

    # systemd
    def state(self):
        return self.systemd.state()

    def effective(self):
        return self.systemd.effective()

    # journal
    def _journal(self, invocation_id):
        return InvocationJournal(self.runner.run, invocation_id, journalctl=self.journalctl)

    def follower(self, invocation_id, cursor=None, from_start=True):
        return JournalFollower(self.spawn, invocation_id, cursor=cursor, from_start=from_start,
                               journalctl=self.journalctl)

    def grep(self, invocation_id, after_cursor=None):
        """The invocation's startup landmarks (first line, config lines, a later line), as entries:
        all of them, or those after `after_cursor`."""
        return self._journal(invocation_id).grep_entries(GREP_PATTERN, after_cursor=after_cursor)

    def last_cursor(self, invocation_id):
        return self._journal(invocation_id).last_cursor()

    def tail(self, invocation_id, lines):
        return self._journal(invocation_id).tail(lines)

    def systemd_notes(self, invocation_id):
        return self._journal(invocation_id).systemd_notes()

    def journal_storage(self):
        """journald's Storage= setting (none, volatile, persistent, auto), or None when it cannot be read."""
        rc, out, dummy = self.runner.run([self.runner.bin("systemd-analyze"), "cat-config", "systemd/journald.conf"])
        return journald_storage(out) if rc == 0 else None

    def restarts_since(self, invocation_id):
        return restarts_since(self.runner.run, self.unit, invocation_id, self.journalctl)

    def suppressed(self, invocation_id, since):
        return suppressed_notices(self.runner.run, self.unit, invocation_id, since, self.journalctl)

    # /proc
    def alive(self, pid):
        return process_alive(pid, self.proc_root)

    def cmdline(self, pid):
        return read_cmdline(pid, self.proc_root)

    def environ(self, pid, keys):
        return read_environ(pid, keys, self.proc_root)

    def process_started(self, state):
        return process_start_time(state.main_pid, self.proc_root) if state.main_pid else None

    def listener(self, control_group, main_pid):
        if not self.verify_listener:
            return None
        return listener_provenance(self.address, self.port, control_group, self.unit, main_pid=main_pid,
                                   root=self.proc_root)

    # HTTP
    def port_open(self, timeout):
        return port_accepts(self.address, self.port, timeout)

    def generate(self, timeout):
        return generate(self.http, self.prompt, self.max_new_tokens, timeout)

    def server_info(self, timeout):
        return server_info(self.http, timeout)

    # receipts
    def receipt_for(self, invocation_id):
        return ev.receipt_of(ev.read_receipt(self.receipt_path), self.unit, invocation_id)

    def write_receipt(self, receipt):
        ev.write_receipt(self.receipt_path, receipt)

    @staticmethod
    def flags_for_key(key):
        return flags_for_key(key)
