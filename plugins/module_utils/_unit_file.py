# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A unit file that starts what a running process runs.

After a lost restart handler the installed unit is already the NEW one while the process still
runs the OLD settings. The last-known-good copy of such a host must be what RUNS, so it is rebuilt
from the installed file: its ExecStart= becomes the process's command line and its Environment=
lines the process's environment (EnvironmentFile= lines go: their values are in that environment).
"""

from __future__ import annotations

from ansible_collections.gpufleet.inference.plugins.module_utils._systemd import systemd_quote, systemd_quote_env

# Set by systemd (or the kernel) for each invocation; a unit must not pin them.
PER_INVOCATION = frozenset((
    "INVOCATION_ID", "JOURNAL_STREAM", "SYSTEMD_EXEC_PID", "MANAGERPID", "MAINPID", "NOTIFY_SOCKET",
    "LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES", "WATCHDOG_PID", "WATCHDOG_USEC", "MONOTONIC_USEC",
    "TRIGGER_UNIT", "TRIGGER_PATH", "TRIGGER_TIMER_REALTIME_USEC", "TRIGGER_TIMER_MONOTONIC_USEC",
    "SERVICE_RESULT", "EXIT_CODE", "EXIT_STATUS", "PIDFILE", "CREDENTIALS_DIRECTORY", "MEMORY_PRESSURE_WATCH",
    "MEMORY_PRESSURE_WRITE",
))
# Set by systemd for every service from the system and the unit's User=/…Directory= settings: the
# rebuilt unit does not pin them (they come back by themselves, and a unit pinning them would not
# be what the role installs).
SYSTEMD_PROVIDED = frozenset((
    "PATH", "LANG", "LANGUAGE", "USER", "LOGNAME", "HOME", "SHELL", "TERM", "RUNTIME_DIRECTORY", "STATE_DIRECTORY",
    "CACHE_DIRECTORY", "LOGS_DIRECTORY", "CONFIGURATION_DIRECTORY",
))
REPLACED = ("ExecStart", "Environment", "EnvironmentFile")


def parse_environ(raw):
    """The bytes of /proc/PID/environ -> {name: value}, without what systemd sets by itself."""
    env = {}
    for item in (raw or b"").split(b"\0"):
        if b"=" not in item:
            continue
        name, value = item.split(b"=", 1)
        name = name.decode("utf-8", "replace")
        if name not in PER_INVOCATION and name not in SYSTEMD_PROVIDED and not name.startswith("LC_"):
            env[name] = value.decode("utf-8", "replace")
    return env


def _key(line):
    stripped = line.strip()
    if "=" not in stripped or stripped.startswith(("#", ";", "[")):
        return None
    return stripped.split("=", 1)[0].strip()


def rebuild_from_process(text, argv, environ):
    """`text` of a unit file with its [Service] ExecStart=/Environment=/EnvironmentFile= replaced by
    `argv` and `environ`. Raises ValueError when there is nothing to rebuild or a value cannot be
    written into a unit file (control characters)."""
    if not argv:
        raise ValueError("the running process has no command line to keep")
    new_lines = ["Environment=%s" % systemd_quote_env(name, value) for name, value in sorted(environ.items())]
    # one quoted argument per line, as the role writes it
    new_lines.append("ExecStart=" + " \\\n    ".join(systemd_quote(arg) for arg in argv))
    out = []
    section = None
    inserted = False
    continued = False
    for line in text.splitlines():
        if continued:  # a continuation line of a replaced setting
            continued = line.rstrip().endswith("\\")
            continue
        stripped = line.strip()
        if stripped.startswith("[") and stripped.endswith("]"):
            if section == "[Service]" and not inserted:
                out.extend(new_lines)
                inserted = True
            section = stripped
        elif section == "[Service]" and _key(line) in REPLACED:
            if not inserted:
                out.extend(new_lines)
                inserted = True
            continued = line.rstrip().endswith("\\")
            continue
        out.append(line)
    if not inserted:
        if section != "[Service]":
            out.append("[Service]")
        out.extend(new_lines)
    return "\n".join(out) + "\n"
