# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Read a unit's state with ``systemctl show`` over an injected ``run(argv) -> (rc, out, err)``.

Private to this collection: no compatibility promise.
"""
from __future__ import annotations

import re
import signal

from ansible_collections.gpufleet.inference.plugins.module_utils._process import redact

STATE_PROPERTIES = (
    "Id", "LoadState", "InvocationID", "ActiveState", "SubState", "MainPID", "NRestarts",
    "ControlGroup", "ExecMainStartTimestamp", "ExecMainStartTimestampMonotonic", "Result",
    "UnitFileState", "ExecMainCode", "ExecMainStatus",
)
# What systemd would run, drop-ins included (read once per check, not every poll).
EFFECTIVE_PROPERTIES = (
    "FragmentPath", "DropInPaths", "NeedDaemonReload", "ExecStart", "Environment", "EnvironmentFiles",
)

_ARGV_RE = re.compile(r"argv\[\]=(.*?) ;")
# siginfo's si_code as systemd prints ExecMainCode (CLD_EXITED, CLD_KILLED, CLD_DUMPED).
EXIT_CODES = {"1": "exited", "2": "killed", "3": "dumped"}
EXIT_STATUS_NAMES = {0: "SUCCESS", 1: "FAILURE", 2: "INVALIDARGUMENT", 3: "NOTIMPLEMENTED",
                     4: "NOPERMISSION", 5: "NOTINSTALLED", 6: "NOTCONFIGURED", 7: "NOTRUNNING"}


class SystemdError(Exception):
    pass


def show_argv(unit, properties, systemctl="systemctl"):
    return [systemctl, "show", unit, "--no-pager", "-p", ",".join(properties)]


def parse_show(text):
    """``Key=Value`` lines -> dict (values kept as text; first '=' splits).

    A property printed on several lines (one ``EnvironmentFiles=`` per file) keeps them all,
    joined by newlines.
    """
    props = {}
    for line in (text or "").splitlines():
        if "=" in line:
            key, value = line.split("=", 1)
            key = key.strip()
            props[key] = props[key] + "\n" + value if key in props else value
    return props


def _int(value, default=0):
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def describe_exit(code, status):
    """systemd's way of naming how a main process ended: 'code=exited, status=1/FAILURE'."""
    how = EXIT_CODES.get(str(code), str(code) if code not in (None, "", "0") else None)
    if how is None:
        return None
    number = _int(status, None)
    if how == "exited":
        name = EXIT_STATUS_NAMES.get(number)
        return "code=exited, status=%s%s" % (status, "/" + name if name else "")
    try:
        name = signal.Signals(number).name[3:]
    except (TypeError, ValueError):
        name = None
    return "code=%s, status=%s%s" % (how, status, "/" + name if name else "")


class UnitState(object):
    """One snapshot of a unit (the fields the waiter and the facts modules use)."""

    def __init__(self, props):
        self.props = props
        self.load_state = props.get("LoadState", "")
        self.invocation_id = props.get("InvocationID", "") or ""
        self.active_state = props.get("ActiveState", "")
        self.sub_state = props.get("SubState", "")
        self.main_pid = _int(props.get("MainPID"))
        self.n_restarts = _int(props.get("NRestarts"))
        self.control_group = props.get("ControlGroup", "") or ""
        self.start_timestamp = props.get("ExecMainStartTimestamp", "") or ""
        self.start_monotonic_usec = _int(props.get("ExecMainStartTimestampMonotonic"))
        self.result = props.get("Result", "")
        self.unit_file_state = props.get("UnitFileState", "")
        self.exit = describe_exit(props.get("ExecMainCode"), props.get("ExecMainStatus"))

    @property
    def exists(self):
        return self.load_state not in ("not-found", "")

    @property
    def running(self):
        """Active or on its way there (not an automatic restart after a crash)."""
        return self.active_state in ("active", "activating", "reloading") and not self.crashed

    @property
    def crashed(self):
        """The main process ended: failed, inactive, or waiting for Restart= (auto-restart)."""
        return self.active_state in ("failed", "inactive") or self.sub_state.startswith("auto-restart")

    @property
    def stopped(self):
        """Inactive after a clean end (Result success): stopped on purpose, or exited 0 - not a crash."""
        return self.active_state == "inactive" and self.result == "success"

    def how_it_ended(self):
        """'code=killed, status=9/KILL, Result signal' (what systemd knows about the end)."""
        parts = [self.exit] if self.exit else []
        parts.append("Result %s" % (self.result or "?"))
        return ", ".join(parts)

    def describe(self):
        return "%s/%s (InvocationID %s, MainPID %s, NRestarts %s, Result %s)" % (
            self.active_state or "?", self.sub_state or "?", self.invocation_id or "none",
            self.main_pid, self.n_restarts, self.result or "?")

    def as_dict(self):
        return {
            "invocation_id": self.invocation_id or None,
            "active_state": self.active_state,
            "sub_state": self.sub_state,
            "main_pid": self.main_pid,
            "n_restarts": self.n_restarts,
            "control_group": self.control_group or None,
            "result": self.result,
            "exit": self.exit,
        }


class EffectiveUnit(object):
    """What systemd would run for the unit now: its fragment, drop-ins, ExecStart and environment."""

    def __init__(self, props):
        self.props = props
        self.fragment_path = props.get("FragmentPath", "") or None
        self.drop_in_paths = (props.get("DropInPaths", "") or "").split()
        self.need_daemon_reload = props.get("NeedDaemonReload", "no") == "yes"
        self.exec_start = parse_exec_start(props.get("ExecStart", ""))
        self.environment = parse_environment(props.get("Environment", ""))
        self.environment_files = parse_environment_files(props.get("EnvironmentFiles", ""))

    def as_dict(self):
        return {
            "fragment_path": self.fragment_path,
            "drop_in_paths": self.drop_in_paths,
            "need_daemon_reload": self.need_daemon_reload,
            # what is reported never carries a secret of the command line (--api-key K)
            "exec_start": redact(self.exec_start[0]) if self.exec_start else [],
            "environment": self.environment,
            "environment_files": self.environment_files,
        }


class Systemd(object):
    """systemctl queries for one unit."""

    def __init__(self, run, unit, systemctl="systemctl"):
        self.run = run
        self.unit = unit
        self.systemctl = systemctl

    def _show(self, properties):
        argv = show_argv(self.unit, properties, self.systemctl)
        rc, out, err = self.run(argv)
        if rc != 0:
            raise SystemdError("%s failed (rc=%s): %s" % (" ".join(argv), rc, (err or out).strip()))
        return parse_show(out)

    def state(self):
        return UnitState(self._show(STATE_PROPERTIES))

    def effective(self):
        return EffectiveUnit(self._show(EFFECTIVE_PROPERTIES))

    def exec_start(self):
        """The ExecStart= command lines of the unit, each an argv list."""
        return self.effective().exec_start


def parse_exec_start(value):
    """``{ path=... ; argv[]=a b c ; ... }`` (one block per ExecStart=) -> list of argv lists.

    systemctl prints argv space-joined, so arguments containing spaces cannot be told apart;
    flag names and numbers never contain spaces.
    """
    return [match.split() for match in _ARGV_RE.findall(value or "")]


def _unquote_words(text):
    """systemctl's space-separated list, where a word with spaces is double-quoted C-style."""
    words, current, quoted, escaped, started = [], [], False, False, False
    for char in text or "":
        if escaped:
            current.append({"n": "\n", "t": "\t"}.get(char, char))
            escaped = False
        elif char == "\\":
            escaped = started = True
        elif char == '"':
            quoted = not quoted
            started = True
        elif char.isspace() and not quoted:
            if started:
                words.append("".join(current))
            current, started = [], False
        else:
            current.append(char)
            started = True
    if started:
        words.append("".join(current))
    return words


def parse_environment(value):
    """``Environment=A=1 "B=two words"`` -> {"A": "1", "B": "two words"} (later wins)."""
    env = {}
    for word in _unquote_words(value):
        if "=" in word:
            key, val = word.split("=", 1)
            env[key] = val
    return env


def parse_environment_files(value):
    """``EnvironmentFiles=/etc/x.env (ignore_errors=no)`` (one per line or space-run) -> paths."""
    return [word for word in _unquote_words(value) if word.startswith("/")]


def flag_value(argv, flag):
    """Value of `flag` in argv (``--flag V`` or ``--flag=V``); (found, value)."""
    for index, arg in enumerate(argv):
        if arg == flag:
            return True, argv[index + 1] if index + 1 < len(argv) else None
        if arg.startswith(flag + "="):
            return True, arg[len(flag) + 1:]
    return False, None


def journald_storage(text):
    """journald's Storage= from ``systemd-analyze cat-config systemd/journald.conf`` (the main file and
    its drop-ins in the order systemd reads them; the last setting wins), lower-case; ``auto`` when
    unset, None when `text` is empty."""
    if not (text or "").strip():
        return None
    storage, section = "auto", None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
        elif section == "Journal" and line.startswith("Storage="):
            storage = line.split("=", 1)[1].strip().lower() or "auto"
    return storage


# ------------------------------------------------------------------------------ unit file text

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class QuotingError(ValueError):
    """A value a unit file cannot carry."""


def _reject_control(text):
    if _CONTROL.search(text):
        raise QuotingError("%r contains a newline or control character, which a unit file cannot carry" % text)


def systemd_quote(arg):
    """One ExecStart argument: double-quoted, `\\` `\"` escaped, `%`->`%%`, `$`->`$$`."""
    text = str(arg)
    _reject_control(text)
    text = text.replace("\\", "\\\\").replace('"', '\\"')
    text = text.replace("%", "%%").replace("$", "$$")
    return '"%s"' % text


def systemd_quote_env(name, value):
    """One `Environment=` assignment, quoted. systemd expands no `$` there, only `%`."""
    text = "%s=%s" % (name, value)
    _reject_control(text)
    text = text.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")
    return '"%s"' % text
