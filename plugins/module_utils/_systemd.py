# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Read a unit's state with ``systemctl show`` over an injected ``run(argv) -> (rc, out, err)``.

Private to this collection: no compatibility promise.
"""
from __future__ import annotations

import re

STATE_PROPERTIES = (
    "Id", "LoadState", "InvocationID", "ActiveState", "SubState", "MainPID", "NRestarts",
    "ControlGroup", "ExecMainStartTimestamp", "Result", "UnitFileState",
)

_ARGV_RE = re.compile(r"argv\[\]=(.*?) ;")


class SystemdError(Exception):
    pass


def show_argv(unit, properties, systemctl="systemctl"):
    return [systemctl, "show", unit, "--no-pager", "-p", ",".join(properties)]


def parse_show(text):
    """``Key=Value`` lines -> dict (values kept as text; first '=' splits)."""
    props = {}
    for line in (text or "").splitlines():
        if "=" in line:
            key, value = line.split("=", 1)
            props[key.strip()] = value
    return props


def _int(value, default=0):
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


class UnitState(object):
    """One snapshot of a unit (the fields the waiter and the facts module use)."""

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
        self.result = props.get("Result", "")
        self.unit_file_state = props.get("UnitFileState", "")

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

    def exec_start(self):
        """The ExecStart= command lines of the unit, each an argv list."""
        return parse_exec_start(self._show(("ExecStart",)).get("ExecStart", ""))


def parse_exec_start(value):
    """``{ path=... ; argv[]=a b c ; ... }`` (one block per ExecStart=) -> list of argv lists.

    systemctl prints argv space-joined, so arguments containing spaces cannot be told apart;
    flag names and numbers never contain spaces.
    """
    return [match.split() for match in _ARGV_RE.findall(value or "")]


def flag_value(argv, flag):
    """Value of `flag` in argv (``--flag V`` or ``--flag=V``); (found, value)."""
    for index, arg in enumerate(argv):
        if arg == flag:
            return True, argv[index + 1] if index + 1 < len(argv) else None
        if arg.startswith(flag + "="):
            return True, arg[len(flag) + 1:]
    return False, None
