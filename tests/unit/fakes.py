# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Fakes shared by the unit tests (one place): run_command tables, journal entries, a scripted
host for the wait and the drift check, and AnsibleModule exits.

``FakeHost`` is a small deterministic simulation on a fake clock: systemd states, journal entries
and HTTP answers are scripted as (time, value) and the code under test sees what is due at the
clock's current time. A journal read advances the clock by its timeout, like the real follower.
"""
from __future__ import annotations

import json

from ansible_collections.gpufleet.inference.plugins.module_utils import _evidence as ev
from ansible_collections.gpufleet.inference.plugins.module_utils._flags import flags_for_key
from ansible_collections.gpufleet.inference.plugins.module_utils._http import HTTP, REFUSED, Response
from ansible_collections.gpufleet.inference.plugins.module_utils._journal import Entry, JournalError
from ansible_collections.gpufleet.inference.plugins.module_utils._systemd import EffectiveUnit, UnitState

OLD, NEW, NEWER = "aaaa0000", "bbbb1111", "cccc2222"
WALL0 = 1764410400.0


# ------------------------------------------------------------------ run_command and journald

class RunTable(object):
    """Answers argv from a table (exact tuples); records every call; unknown argv fails the test."""

    def __init__(self, table=None):
        self.table = dict((tuple(argv), result) for argv, result in (table or {}).items())
        self.calls = []

    def add(self, argv, rc=0, out="", err=""):
        self.table[tuple(argv)] = (rc, out, err)

    def __call__(self, argv):
        self.calls.append(list(argv))
        try:
            result = self.table[tuple(argv)]
        except KeyError:
            raise AssertionError("unexpected command: %r" % (argv,))
        return result(argv) if callable(result) else result


JOURNAL_INV = "0b5a3c2d9e4f4c7a8b1d2e3f4a5b6c7d"


def make_entries(*entries):
    """journalctl -o json output from (message, cursor[, extra fields]) tuples, written by a process of
    invocation JOURNAL_INV unless the extra fields say otherwise."""
    lines = []
    for index, item in enumerate(entries):
        message, cursor = item[0], item[1]
        fields = {"MESSAGE": message, "__CURSOR": cursor, "__REALTIME_TIMESTAMP": str(1764410400000000 + index),
                  "_PID": "4242", "_SYSTEMD_INVOCATION_ID": JOURNAL_INV}
        if len(item) > 2:
            fields.update(item[2])
        lines.append(json.dumps(fields))
    return "\n".join(lines) + ("\n" if lines else "")


def entry(message, invocation=NEW, systemd=False, **fields):
    """One journal entry of `invocation`: its own line, or systemd's message about it."""
    data = {"MESSAGE": message, "_PID": "1" if systemd else "4242"}
    data["INVOCATION_ID" if systemd else "_SYSTEMD_INVOCATION_ID"] = invocation
    data.update(fields)
    return Entry(data)


def unit_state(invocation, active="active", sub="running", restarts=0, pid=4242, result="success", code="0",
               status="0", load="loaded"):
    return UnitState({"LoadState": load, "InvocationID": invocation or "", "ActiveState": active, "SubState": sub,
                      "MainPID": str(pid), "NRestarts": str(restarts), "ControlGroup": "/system.slice/sglang.service",
                      "ExecMainStartTimestamp": "Sun 2026-11-29 10:00:00 UTC", "Result": result,
                      "ExecMainCode": code, "ExecMainStatus": status})


# ------------------------------------------------------------------ HTTP answers

def http_json(status, body):
    return Response(HTTP, status, json.dumps(body))


REFUSED_RESP = Response(REFUSED, error="[Errno 111] Connection refused")
GOOD_BODY = {"text": " Paris. The capital", "meta_info": {"completion_tokens": 8, "spec_accept_length": 3.2}}
GOOD = http_json(200, GOOD_BODY)
STARTING = http_json(503, {"error": "starting"})
INSIDE = {"verdict": "inside", "message": "127.0.1.11:30000 is served by pid 4242", "owners": []}

CONFIG_2048 = ("[2026-11-29 10:04:49 TP0] Initialized DFLASH draft runner. attention_backend=flashinfer, "
               "model=DFlashDraftModel, block_size=16, draft_window_size=2048, compact_cache=True")
CONFIG_NONE = CONFIG_2048.replace("draft_window_size=2048, compact_cache=True",
                                  "draft_window_size=None, compact_cache=False")
CONFIG_512 = CONFIG_2048.replace("draft_window_size=2048", "draft_window_size=512")
EXPECT_2048 = {"draft_window_size": "2048", "compact_cache": "true", "block_size": 16}
COMMAND = ["/opt/sglang/venv/bin/python", "-m", "sglang.launch_server", "--model-path", "/m",
           "--speculative-algorithm", "DFLASH", "--speculative-num-draft-tokens", "16",
           "--speculative-dflash-draft-window-size", "2048"]
# A healthy startup, as the simulator and SGLang log it.
STARTUP = ["[2026-11-29 10:00:00] server_args=ServerArgs(model_path='/m', api_key='sekret')",
           "[2026-11-29 10:00:01 TP0] Load weight begin. avail mem=78.50 GB",
           "Loading safetensors checkpoint shards:  50% Completed | 8/16 [00:01<00:01, 3.0it/s]",
           "[2026-11-29 10:00:02 TP0] Load weight end. elapsed=1.24 s",
           "[2026-11-29 10:00:02 TP0] KV Cache is allocated. #tokens: 352000",
           "[2026-11-29 10:00:02 TP0] Capture cuda graph begin. This can take up to several minutes.",
           CONFIG_2048,
           "INFO:     Uvicorn running on http://127.0.1.11:30000 (Press CTRL+C to quit)",
           '[2026-11-29 10:00:03] The server is fired up and ready to roll!']


def timed(start, messages, step=0.1, invocation=NEW):
    """[(t, entry)] for messages logged every `step` seconds from `start`."""
    return [(start + index * step, entry(message, invocation)) for index, message in enumerate(messages)]


# ------------------------------------------------------------------ the scripted host

def _due(script, now, default=None):
    """The value of a [(t, value)] script at time `now` (the latest entry with t <= now)."""
    value = default
    for at, item in script:
        if at <= now + 1e-9:
            value = item
    return value


class FakeFollower(object):
    def __init__(self, host, invocation_id, cursor=None, from_start=True):
        self.host = host
        self.invocation_id = invocation_id
        self.from_start = from_start
        self.cursor = cursor
        host.followers.append(self)
        entries = host.journal.get(invocation_id, [])
        if cursor is not None:
            self.position = int(cursor.split(":")[1]) + 1
        elif from_start:
            self.position = 0
        else:  # from now: what is already logged is skipped
            self.position = len([1 for at, dummy in entries if at <= host.now])
        self.closed = False

    def read(self, timeout):
        host = self.host
        if host.follow_errors:
            host.follow_errors -= 1
            host.now += timeout
            raise JournalError("journalctl --follow ended (rc=1): scripted")
        host.now += timeout
        entries = host.journal.get(self.invocation_id, [])
        out = []
        while self.position < len(entries) and entries[self.position][0] <= host.now + 1e-9:
            item = entries[self.position][1]
            item.cursor = self.cursor = "%s:%s" % (self.invocation_id, self.position)
            if item.belongs_to(self.invocation_id):  # as the real follower: trusted fields only
                out.append(item)
            self.position += 1
        return out

    def close(self):
        self.closed = True


class FakeHost(object):
    """Scripts: states [(t, UnitState)], journal {inv: [(t, Entry)]}, port [(t, bool)],
    generate [(t, Response)], alive [(t, bool)], and plain values for the rest."""

    unit = "sglang.service"
    receipt_dir = "/var/lib/gpufleet-inference/receipts"
    receipt_path = receipt_dir + "/sglang.service.json"

    def __init__(self, states, journal=None, port=None, generate=None, alive=None, cmdline=None, environ=None,
                 effective=None, notices=None, listener="inside", receipt=None, server_info=None, grep=True,
                 restarts=None, storage="auto"):
        self.now = 0.0
        self.states = states
        self.journal = journal or {}
        self.port = port if port is not None else [(0.0, True)]
        self.generate_script = generate if generate is not None else [(0.0, GOOD)]
        self.alive_script = alive or [(0.0, True)]
        self.cmdline_value = cmdline
        self.environ_value = environ or {}
        self.effective_value = effective or EffectiveUnit({})
        self.notices = notices or []
        self.listener_value = dict(INSIDE) if listener == "inside" else listener  # "inside": the unit's own
        self.receipt = receipt
        self.server_info_value = server_info
        self.grep_supported = grep
        self.storage = storage  # journald's Storage=
        self.restarts = restarts or []  # [(t, {invocation_id, n_restarts, message})]: systemd's scheduled restarts
        self.followers = []
        self.follow_errors = 0
        self.written = []
        self.calls = []

    # clocks
    def clock(self):
        return self.now

    def wall(self):
        return WALL0 + self.now

    def wall_iso(self):
        return "2026-11-29T10:00:%06.3fZ" % self.now

    def sleep(self, seconds):
        assert seconds >= 0
        self.now += seconds

    # systemd
    def state(self):
        self.calls.append("state")
        return _due(self.states, self.now)

    def effective(self):
        self.calls.append("effective")
        return self.effective_value

    # journal
    def follower(self, invocation_id, cursor=None, from_start=True):
        self.calls.append("follow:%s" % invocation_id)
        return FakeFollower(self, invocation_id, cursor, from_start)

    def grep(self, invocation_id, after_cursor=None):
        self.calls.append("grep:%s%s" % (invocation_id, " after %s" % after_cursor if after_cursor else ""))
        if not self.grep_supported:
            return None
        from ansible_collections.gpufleet.inference.plugins.module_utils._startup import GREP_PATTERN
        import re
        first = int(after_cursor.split(":")[1]) + 1 if after_cursor else 0
        found = []
        for index, (at, item) in enumerate(self.journal.get(invocation_id, [])):
            if index >= first and at <= self.now and re.search(GREP_PATTERN, item.message) and \
                    item.belongs_to(invocation_id):
                item.cursor = "%s:%s" % (invocation_id, index)
                found.append(item)
        return found

    def last_cursor(self, invocation_id):
        self.calls.append("last_cursor:%s" % invocation_id)
        logged = [index for index, (at, item) in enumerate(self.journal.get(invocation_id, []))
                  if at <= self.now and not item.from_systemd]
        return "%s:%s" % (invocation_id, logged[-1]) if logged else None

    def tail(self, invocation_id, lines):
        return [item.message for at, item in self.journal.get(invocation_id, []) if at <= self.now
                and not item.from_systemd][-lines:]

    def systemd_notes(self, invocation_id):
        self.calls.append("systemd_notes:%s" % invocation_id)
        return [item for at, item in self.journal.get(invocation_id, []) if at <= self.now and item.from_systemd][-10:]

    def journal_storage(self):
        self.calls.append("journal_storage")
        return self.storage

    def restarts_since(self, invocation_id):
        self.calls.append("restarts_since:%s" % invocation_id)
        return [item for at, item in self.restarts if at <= self.now]

    def suppressed(self, invocation_id, since):
        self.calls.append("suppressed")
        return self.notices

    # /proc
    def alive(self, pid):
        return _due(self.alive_script, self.now, True)

    def cmdline(self, pid):
        value = self.cmdline_value
        return value(self.now) if callable(value) else value

    def environ(self, pid, keys):
        return dict((key, value) for key, value in self.environ_value.items() if key in keys)

    def process_started(self, state):
        return WALL0

    def listener(self, control_group, main_pid):
        return self.listener_value

    # HTTP
    def port_open(self, timeout):
        return _due(self.port, self.now, False)

    def generate(self, timeout):
        self.calls.append("generate")
        return _due(self.generate_script, self.now, REFUSED_RESP)

    def server_info(self, timeout):
        if self.server_info_value is None:
            return REFUSED_RESP
        return http_json(200, self.server_info_value)

    # receipts
    def receipt_for(self, invocation_id):
        return ev.receipt_of(self.receipt, self.unit, invocation_id)

    def write_receipt(self, receipt):
        self.written.append(receipt)
        self.receipt = receipt

    @staticmethod
    def flags_for_key(key):
        return flags_for_key(key)


# ------------------------------------------------------------------ AnsibleModule exits

class ModuleExit(Exception):
    """exit_json/fail_json, raised so a test can read the result."""

    def __init__(self, result, failed):
        super(ModuleExit, self).__init__(result.get("msg"))
        self.result = result
        self.failed = failed


def patch_module_exits(monkeypatch):
    from ansible.module_utils import basic

    def exit_json(self, **kwargs):
        raise ModuleExit(kwargs, False)

    def fail_json(self, **kwargs):
        kwargs["failed"] = True
        raise ModuleExit(kwargs, True)
    monkeypatch.setattr(basic.AnsibleModule, "exit_json", exit_json)
    monkeypatch.setattr(basic.AnsibleModule, "fail_json", fail_json)


def module_with_args(monkeypatch, argument_spec, args, check_mode=False, **kwargs):
    """An AnsibleModule built from `args` as Ansible would pass them."""
    from ansible.module_utils import basic
    from ansible.module_utils.testing import patch_module_args
    patch_module_exits(monkeypatch)
    with patch_module_args(dict(args, _ansible_check_mode=check_mode)):
        return basic.AnsibleModule(argument_spec=argument_spec, supports_check_mode=True, **kwargs)


# ------------------------------------------------------------------ a /proc tree under tmp_path

def tcp_hex(address):
    """An IPv4 address as /proc/net/tcp prints it (host-order integer of the network bytes)."""
    import socket
    import struct
    return "%08X" % struct.unpack("=I", socket.inet_aton(address))[0]


def tcp_line(address_hex, port, inode, state="0A"):
    """One /proc/net/tcp(6) row; state 0A is LISTEN."""
    return "   0: %s:%04X 00000000:0000 %s 00000000:00000000 00:00000000 00000000     0        0 %s 1 0 0 10 0" % (
        address_hex, port, state, inode)


class FakeProc(object):
    """A /proc tree under a temporary directory: ``root`` is what the code takes as proc root."""

    HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"

    def __init__(self, tmp_path, btime=1764410000):
        self.root = str(tmp_path)
        self.proc = tmp_path / "proc"
        self.proc.mkdir(parents=True, exist_ok=True)
        (self.proc / "stat").write_text("cpu  1 2 3 4\nbtime %d\nprocesses 9\n" % btime)

    def sockets(self, tcp=(), tcp6=()):
        net = self.proc / "net"
        net.mkdir(exist_ok=True)
        (net / "tcp").write_text(self.HEADER + "".join(line + "\n" for line in tcp))
        (net / "tcp6").write_text(self.HEADER + "".join(line + "\n" for line in tcp6))
        return self

    def process(self, pid, comm="python3", cgroup=None, ppid=1, state="S", start_ticks=0, cmdline=None,
                environ=None, inodes=(), cgroup_text=None):
        """One process; `cmdline` a list (b"" for a process inside exec), `environ` a dict."""
        base = self.proc / str(pid)
        (base / "fd").mkdir(parents=True, exist_ok=True)
        (base / "comm").write_text(comm + "\n")
        if cgroup_text is not None or cgroup is not None:
            (base / "cgroup").write_text(cgroup_text if cgroup_text is not None else "0::%s\n" % cgroup)
        # fields after "(comm)": state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime
        # stime cutime cstime priority nice threads itrealvalue starttime (the 20th) ...
        rest = [state, str(ppid)] + ["0"] * 17 + [str(start_ticks), "0", "0"]
        (base / "stat").write_text("%s (%s) %s\n" % (pid, comm, " ".join(rest)))
        if cmdline is not None:
            (base / "cmdline").write_bytes(cmdline if isinstance(cmdline, bytes)
                                           else b"".join(arg.encode() + b"\0" for arg in cmdline))
        if environ is not None:
            (base / "environ").write_bytes(b"".join(("%s=%s" % item).encode() + b"\0" for item in environ.items()))
        for number, inode in enumerate(inodes):
            (base / "fd" / str(number + 3)).symlink_to("socket:[%s]" % inode)
        return self


# ------------------------------------------------------------------ run_command of AnsibleModule

def patch_run_command(monkeypatch, table):
    """AnsibleModule.run_command answers from `table` (a RunTable); the keyword arguments of each call
    are kept in ``table.kwargs``."""
    from ansible.module_utils import basic
    table.kwargs = []

    def run_command(self, args, **kwargs):
        table.kwargs.append(kwargs)
        return table(args)
    monkeypatch.setattr(basic.AnsibleModule, "run_command", run_command)
    monkeypatch.setattr(basic.AnsibleModule, "get_bin_path", lambda self, name, *a, **k: "/usr/bin/" + name)
    return table


def record_warnings(monkeypatch):
    """AnsibleModule.warn records into the returned list (instead of Ansible's global warnings)."""
    from ansible.module_utils import basic
    seen = []
    monkeypatch.setattr(basic.AnsibleModule, "warn", lambda self, warning, **kwargs: seen.append(warning))
    return seen


# ------------------------------------------------------------------ scripted hosts for the modules

RESTARTED = [(0.0, unit_state(OLD)), (1.0, unit_state(NEW, "activating", "start")), (2.0, unit_state(NEW))]


def restarted_host(lines=None, port_at=4.0, **kwargs):
    """The unit restarted at 1 s: its new invocation logs `lines` (default STARTUP) from 2 s and its
    port opens (and /generate answers) at `port_at`."""
    lines = STARTUP if lines is None else lines
    kwargs.setdefault("states", RESTARTED)
    kwargs.setdefault("journal", {NEW: timed(2.0, lines[:-2], 0.2) + timed(port_at or 4.0, lines[-2:], 0.1)})
    kwargs.setdefault("port", [(port_at, True)] if port_at is not None else [])
    kwargs.setdefault("generate", [(port_at, GOOD)] if port_at is not None else [])
    kwargs.setdefault("cmdline", COMMAND)
    return FakeHost(**kwargs)


# ------------------------------------------------------------------ action plugins

def make_action(action_module, args, check_mode=False, action="gpufleet.inference.x", diff=False):
    """An action plugin built as ansible's own unit tests build them: mocks for task, connection, play context."""
    from unittest.mock import MagicMock
    task = MagicMock()
    task.args = args
    task.check_mode = check_mode
    task.diff = diff
    task.async_val = 0
    task.action = action
    connection = MagicMock()
    connection._shell.tmpdir = "/tmp/remote"
    return action_module.ActionModule(task, connection, MagicMock(), loader=None, templar=PlainTemplar(),
                                      shared_loader_obj=None)


class PlainTemplar(object):
    """A templar for action plugin tests whose variables are plain values already."""

    @staticmethod
    def template(value, **kwargs):
        return value


class Display(object):
    """ansible's display for action plugin tests: keeps every line shown."""

    def __init__(self):
        self.lines = []

    def display(self, text, *args, **kwargs):
        self.lines.append(text)
