# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Does a host run what the role would make of its variables? One read-only look.

Private to this collection: no compatibility promise.

Compares, without changing anything:
- the installed files (unit, SGLang config file) with what the role renders (a secret file's
  content is never shown);
- what systemd would run (effective ExecStart= and Environment=, drop-ins included) with the
  intent; a drop-in that changes them is named, and blocks (the role cannot fix it by
  restarting);
- what runs: the main process's command line and environment, and the evidence of its settings
  (its config lines through _config_line's one comparator, from the receipt of its verification
  or its journal);
- /server_info with the intended settings (from _args, not by parsing argv back): it echoes the
  parsed arguments, so a difference means other arguments were launched; agreement proves
  nothing about the runtime and never counts as evidence.

``restart_pending`` says the files are as intended but the process predates them (a play that
installed a unit and died before its restart handler ran, a config file changed since).
"""
from __future__ import annotations

import difflib
import grp
import json
import os
import pwd

from ansible_collections.gpufleet.inference.plugins.module_utils import _config_line as cfg
from ansible_collections.gpufleet.inference.plugins.module_utils import _evidence as ev
from ansible_collections.gpufleet.inference.plugins.module_utils._journal import JournalError
from ansible_collections.gpufleet.inference.plugins.module_utils._messages import completeness_reason
from ansible_collections.gpufleet.inference.plugins.module_utils._probe import generate_verdict, server_info_subset
from ansible_collections.gpufleet.inference.plugins.module_utils._process import (
    command_differences,
    compare_command,
    compare_environment,
    redact,
    redact_text,
)
from ansible_collections.gpufleet.inference.plugins.module_utils._startup import look_back
from ansible_collections.gpufleet.inference.plugins.module_utils._systemd import SystemdError

IN_SYNC = "in_sync"
DRIFTED = "drifted"
UNVERIFIED = "unverified"
NOT_RUNNING = "not_running"
NOT_INSTALLED = "not_installed"

# A process's start time is known to a hundredth of a second (clock ticks, /proc/uptime's two decimals; _process.boot_epoch):
# a file written within that of the start is not taken as written after it.
START_TIME_PRECISION = 0.05


def _difference(what, key, expected, observed, **extra):
    item = {"what": what, "key": key, "expected": expected, "observed": observed}
    item.update(extra)
    return item


def file_state(spec):
    """The installed file against its intended content/mode/owner: (differences, unit diff lines, mtime)."""
    path = spec["path"]
    try:
        with open(path, "rb") as handle:
            data = handle.read()
        info = os.stat(path)
    except (IOError, OSError):
        return [_difference("file", path, "installed", "missing")], [], None
    differences, diff = [], []
    intended = (spec.get("content") or "").encode("utf-8")
    if data != intended:
        if spec.get("secret"):
            differences.append(_difference("file", path, "as rendered by the role", "differs (content not shown)"))
        else:
            diff = [line.rstrip("\n") for line in difflib.unified_diff(
                data.decode("utf-8", "replace").splitlines(True), intended.decode("utf-8").splitlines(True),
                fromfile="%s (installed)" % path, tofile="%s (intended)" % path, n=0)]
            changed = [line for line in diff if line[:1] in "+-" and line[:3] not in ("+++", "---")]
            differences.append(_difference("file", path, "as rendered by the role", "; ".join(changed) or "differs"))
    mode = mode_text(spec.get("mode"))
    if mode and "%04o" % (info.st_mode & 0o7777) != mode:
        differences.append(_difference("file mode", path, mode, "%04o" % (info.st_mode & 0o7777)))
    for key, wanted, actual in (("owner", spec.get("owner"), _user(info.st_uid)),
                                ("group", spec.get("group"), _group(info.st_gid))):
        if wanted and wanted != actual:
            differences.append(_difference("file %s" % key, path, wanted, actual))
    return differences, diff, info.st_mtime


def mode_text(mode):
    """A file mode as '0644': from '0644'/'644' (octal text) or an int (YAML's unquoted 0644 is 420)."""
    if mode in (None, ""):
        return None
    if isinstance(mode, int) and not isinstance(mode, bool):
        return "%04o" % mode
    return "%04o" % int(str(mode), 8)


def _user(uid):
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _group(gid):
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def server_info_differences(intended, info):
    """Intended settings the server echoes otherwise (only keys it reports)."""
    differences = []
    for key in sorted(intended or {}):
        if isinstance(info, dict) and key in info and not cfg.values_equal(intended[key], info[key]):
            differences.append(_difference("server_info", key, intended[key], info[key]))
    return differences


def last_good_summary(directory, unit):
    """Is there a last-known-good copy of the unit (sglang_last_good), and of which invocation?"""
    if not directory:
        return {"exists": False}
    try:
        with open(os.path.join(directory, unit, "record.json")) as handle:
            record = json.load(handle)
    except (IOError, OSError, ValueError):
        return {"exists": False}
    return {"exists": True, "invocation_id": record.get("invocation_id"), "saved_at": record.get("saved_at"),
            "adopted": bool(record.get("adopted"))}


class DriftCheck(object):
    """One read-only comparison of a host with the intent (see the module docstring)."""

    def __init__(self, host, intent, files=None, server_info=None, probe=True, request_timeout=30.0,
                 last_good_dir=None):
        self.host = host
        self.last_good_dir = last_good_dir
        self.intent = intent
        self.files = files or []
        self.intended_server_info = server_info
        self.probe = probe
        self.request_timeout = request_timeout
        self.result = {}

    def run(self):
        differences, blocking, reasons, notes = [], [], [], []
        result = self.result
        result.update(unit_diff=[], notes=notes, restart_reasons=reasons, blocking=blocking,
                      last_good=last_good_summary(self.last_good_dir, self.host.unit))

        newest_file = None
        files_ok = True
        result.update(changed_files=[], missing_files=[])
        for spec in self.files:
            found, diff, mtime = file_state(spec)
            differences.extend(found)
            result["unit_diff"].extend(diff)
            if found:
                result["changed_files"].append(spec["path"])
                if mtime is None:
                    result["missing_files"].append(spec["path"])
            restarts = spec.get("restart_on_change", True) is not False
            files_ok = files_ok and not (found and restarts)
            if mtime is not None and restarts:
                newest_file = max(newest_file or mtime, mtime)

        try:
            state = self.host.state()
        except SystemdError as exc:
            return self._finish(DRIFTED, differences + [_difference("unit", self.host.unit, "readable", str(exc))])
        result["unit_state"] = state.as_dict()
        result["invocation_id"] = state.invocation_id or None
        result["main_pid"] = state.main_pid
        result["active_state"] = state.active_state
        result["sub_state"] = state.sub_state
        result["enabled"] = state.unit_file_state in ("enabled", "enabled-runtime", "static", "alias")
        if not state.exists:
            return self._finish(NOT_INSTALLED, differences + [
                _difference("unit", self.host.unit, "installed and active", "not installed")])

        effective = None
        try:
            effective = self.host.effective()
            result["effective"] = effective.as_dict()
        except SystemdError as exc:
            notes.append("could not read the effective unit: %s" % exc)
        if effective is not None:
            self._effective(effective, files_ok, differences, blocking, reasons)

        if state.active_state != "active" or not state.running:
            reasons.append("the unit is %s/%s" % (state.active_state, state.sub_state))
            return self._finish(NOT_RUNNING, differences + [
                _difference("process", "active_state", "active", "%s/%s (%s)" % (
                    state.active_state, state.sub_state, state.how_it_ended()))])

        process = self._process(state, newest_file, files_ok, reasons)
        # /generate first: its access-log line is what makes journald write a pending "Suppressed N
        # messages" notice (journald writes it only when the unit logs again after the interval).
        serving = self._serving()
        evidence = self._evidence(state)
        info = self._server_info()
        verdict = IN_SYNC
        all_differences = differences + process + evidence["differences"] + serving + info
        if all_differences:
            verdict = DRIFTED
        elif evidence["unverified"]:
            verdict = UNVERIFIED
        return self._finish(verdict, all_differences)

    # --- what systemd would run -----------------------------------------------------------

    def _effective(self, effective, files_ok, differences, blocking, reasons):
        intent = self.intent
        found = []
        if intent.command is not None and effective.exec_start:
            # systemctl prints argv space-joined: an argument with spaces reads as several here
            for item in compare_command(intent.command, effective.exec_start[0]):
                found.append(_difference("effective unit", "ExecStart %s" % item["key"], item["expected"],
                                         item["observed"]))
        if intent.environment is not None:
            for item in compare_environment(intent.environment, effective.environment):
                found.append(_difference("effective unit", "Environment %s" % item["key"], item["expected"],
                                         item["observed"]))
        if not found:
            return
        if effective.drop_in_paths and files_ok and not effective.need_daemon_reload:
            for item in found:
                item["drop_ins"] = effective.drop_in_paths
            blocking.extend("%s %s set by drop-in(s) %s" % (item["what"], item["key"], ", ".join(
                effective.drop_in_paths)) for item in found)
        elif effective.need_daemon_reload:
            reasons.append("systemd has not reloaded the changed unit file (NeedDaemonReload=yes)")
        differences.extend(found)

    # --- what runs ------------------------------------------------------------------------

    def _process(self, state, newest_file, files_ok, reasons):
        intent = self.intent
        found = []
        self.result["drop_in_paths"] = self.result.get("effective", {}).get("drop_in_paths", [])
        if intent.command is not None:
            argv = self.host.cmdline(state.main_pid)
            self.result["command"] = redact(argv) if argv else None
            if argv is None:
                found.append(_difference("command line", "main process %s" % state.main_pid, "readable", "gone"))
            else:
                items, notes = command_differences(intent.command, argv)
                for item in items:
                    found.append(_difference("command line", item["key"], item["expected"], item["observed"]))
                self.result["notes"].extend(notes)
        if intent.environment is not None:
            running = self.host.environ(state.main_pid, list(intent.environment))
            if running is None:
                self.result["notes"].append("could not read the environment of main process %s (run with become)"
                                            % state.main_pid)
            for item in compare_environment(intent.environment, running or {}) if running is not None else []:
                found.append(_difference("process environment", item["key"], item["expected"], item["observed"]))
        if found and files_ok:
            reasons.append("the running process (main PID %s) does not run the installed unit: %s" % (
                state.main_pid, "; ".join("%s %s" % (item["what"], item["key"]) for item in found)))
        started = self.host.process_started(state)
        if newest_file is not None and started is not None and newest_file > started + START_TIME_PRECISION and files_ok:
            reasons.append("a file of the unit changed after its process started")
        return found

    def _evidence(self, state):
        intent = self.intent
        out = {"differences": [], "unverified": False}
        found = look_back(self.host, state.invocation_id)
        if found.note:
            self.result["notes"].append(found.note)
        lines = found.lines
        self.result["receipt"] = found.receipt is not None
        self.result["config_lines"] = [redact_text(line.get("line") or "") for line in lines]
        self.result["observed"] = lines[-1]["values"] if lines else None
        self.result["config_line"] = self.result["config_lines"][-1] if lines else None
        for item in ev.mismatches(intent.expect, intent.mode, lines):
            out["differences"].append(_difference("config line", item["key"], item["expected"], item["observed"]))
        if lines or intent.mode == ev.OPTIONAL:
            self.result["source"] = found.source
            return out
        if found.receipt is not None:
            # A receipt without lines recorded a check that no draft-runner line was logged (mode absent),
            # and the journal holds none after it.
            self.result["source"] = "receipt"
            if intent.mode == ev.REQUIRED:
                out["differences"].append(_difference(
                    "config line", "draft runner", "logged",
                    "none (its receipt records a verification that it logged none, and its journal has none since)"))
            return out
        log = found.log
        notices = []
        try:
            notices = self.host.suppressed(state.invocation_id, state.start_timestamp) or []
        except JournalError as exc:
            self.result["notes"].append("could not look for journald suppression notices: %s" % exc)
        completeness = ev.journal_completeness(log.start_seen, log.after_config_seen, notices)
        if completeness == ev.CONCLUSIVE:
            self.result["source"] = "journal"
            if intent.mode == ev.REQUIRED:
                out["differences"].append(_difference("config line", "draft runner", "logged",
                                                      "not logged (its journal is complete)"))
            return out
        self.result["source"] = None
        out["unverified"] = True
        storage = self.host.journal_storage() if completeness == ev.NO_START else None
        self.result["unverified_reason"] = completeness_reason(completeness, notices, self.host.unit,
                                                               state.invocation_id, self.host.receipt_dir, storage)
        return out

    def _serving(self):
        if not self.probe:
            return []
        resp = self.host.generate(self.request_timeout)
        ok, text, meta = generate_verdict(resp)
        self.result["serving"] = ok
        self.result["generate"] = {"status": resp.status, "text": (text or "")[:200], "meta_info": meta} if ok \
            else {"error": resp.describe()}
        return [] if ok else [_difference("process", "/generate", "answers", resp.describe())]

    def _server_info(self):
        if self.intended_server_info is None:
            return []
        resp = self.host.server_info(self.request_timeout)
        data = resp.json() if resp.kind == "http" and resp.status == 200 else None
        self.result["server_info"] = server_info_subset(data)
        if not isinstance(data, dict):
            return []
        return server_info_differences(self.intended_server_info, data)

    def _finish(self, verdict, differences):
        self.result.update(verdict=verdict, in_sync=verdict == IN_SYNC, differences=differences,
                           restart_pending=bool(self.result["restart_reasons"]) and verdict != NOT_INSTALLED)
        return self.result
