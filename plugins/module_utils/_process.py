# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a running process really is: its command line and environment, read from /proc.

Private to this collection: no compatibility promise. Pure except for the /proc reads, whose
root is injectable. Secrets never leave this module: values of flags that look like secrets are
masked, and only the environment variables asked for are returned.
"""
from __future__ import annotations

import os
import re
import time

from ansible_collections.gpufleet.inference.plugins.module_utils._files import read_bytes

MASK = "********"
# Flags whose values are secrets (SGLang's --api-key, --admin-api-key, tokens of extra args).
_SECRET_FLAG = re.compile(r"^--[\w-]*(key|token|secret|password)$", re.IGNORECASE)


def process_state(pid, root="/"):
    """The state letter of /proc/PID/stat (R, S, D, Z, ...), or None when there is no such process."""
    if not pid:
        return None
    raw = read_bytes(os.path.join(root, "proc", str(pid), "stat"))
    if not raw:
        return None
    fields = raw.decode("utf-8", "replace").rsplit(")", 1)[-1].split()
    return fields[0] if fields else None


def process_alive(pid, root="/"):
    """The process exists and is not a zombie (judged by /proc/PID/stat, never by its command line)."""
    state = process_state(pid, root)
    return state is not None and state not in ("Z", "X")


def boot_epoch(root="/"):
    """When the machine booted, in epoch seconds, to a hundredth of a second, or None.

    /proc/stat's btime is that instant truncated to whole seconds: with it alone a process's start
    reads up to a second early, and a restart within that second of a file's write looks like a file
    changed after the process started. Now minus /proc/uptime gives the fraction; it is used only when
    it agrees with btime (a container whose /proc/uptime is its own, e.g. under LXCFS, keeps btime)."""
    boot = read_bytes(os.path.join(root, "proc", "stat"))
    try:
        btime = float(next(line.split()[1] for line in (boot or b"").decode("utf-8", "replace").splitlines()
                           if line.startswith("btime ")))
    except (IndexError, ValueError, StopIteration):
        return None
    uptime = read_bytes(os.path.join(root, "proc", "uptime"))
    try:
        precise = time.time() - float(uptime.split()[0]) if uptime else None
    except (IndexError, ValueError):
        precise = None
    if precise is not None and btime - 0.5 <= precise < btime + 1.5:
        return precise
    return btime


def process_start_time(pid, root="/"):
    """When the process started (epoch seconds): boot time (boot_epoch) + its start in clock ticks."""
    stat = read_bytes(os.path.join(root, "proc", str(pid), "stat"))
    if not stat:
        return None
    try:
        ticks = int(stat.decode("utf-8", "replace").rsplit(")", 1)[-1].split()[19])
    except (IndexError, ValueError):
        return None
    booted = boot_epoch(root)
    if booted is None:
        return None
    return booted + ticks / float(os.sysconf("SC_CLK_TCK"))


def read_cmdline(pid, root="/"):
    """argv of the process, or None (gone, or still inside exec: the kernel shows it empty)."""
    raw = read_bytes(os.path.join(root, "proc", str(pid), "cmdline"))
    if not raw:
        return None
    return [part.decode("utf-8", "replace") for part in raw.rstrip(b"\0").split(b"\0")]


def read_environ(pid, keys, root="/"):
    """The process's initial environment, restricted to `keys` (others are never returned)."""
    raw = read_bytes(os.path.join(root, "proc", str(pid), "environ"))
    if raw is None:
        return None
    wanted = set(keys)
    env = {}
    for item in raw.split(b"\0"):
        if b"=" not in item:
            continue
        name, value = item.split(b"=", 1)
        name = name.decode("utf-8", "replace")
        if name in wanted:
            env[name] = value.decode("utf-8", "replace")
    return env


def redact(argv):
    """argv with the values of secret-looking flags masked (``--api-key KEY``, ``--api-key=KEY``)."""
    out = []
    mask_next = False
    for arg in argv or []:
        if mask_next:
            out.append(MASK)
            mask_next = False
            continue
        if arg.startswith("--") and "=" in arg and _SECRET_FLAG.match(arg.split("=", 1)[0]):
            out.append(arg.split("=", 1)[0] + "=" + MASK)
            continue
        out.append(arg)
        mask_next = bool(arg.startswith("--") and _SECRET_FLAG.match(arg))
    return out


def split_command(argv):
    """argv -> (prefix before the first --flag, [(flag, [values])]) in order; --f=v split."""
    prefix, flags = [], []
    for arg in argv or []:
        if arg.startswith("--") and len(arg) > 2:
            if "=" in arg:
                name, value = arg.split("=", 1)
                flags.append((name, [value]))
            else:
                flags.append((arg, []))
        elif flags:
            flags[-1][1].append(arg)
        else:
            prefix.append(arg)
    return prefix, flags


def _flag_map(flags):
    found = {}
    for name, values in flags:
        found.setdefault(name, []).append(" ".join(values))
    return found


def compare_command(intended, running):
    """Differences between the intended argv and the running one, flag by flag (values masked).

    Returns a list of {key, expected, observed}; ``None`` observed means the flag is absent.
    The order of flags does not matter (argparse), the values and their repetition do.
    """
    intended, running = redact(intended), redact(running)
    if intended == running:
        return []
    want_prefix, want_flags = split_command(intended)
    have_prefix, have_flags = split_command(running)
    differences = []
    if want_prefix != have_prefix:
        differences.append({"key": "program", "expected": " ".join(want_prefix),
                            "observed": " ".join(have_prefix)})
    want, have = _flag_map(want_flags), _flag_map(have_flags)
    for name in sorted(set(want) | set(have)):
        if want.get(name) != have.get(name):
            differences.append({"key": name, "expected": _flag_text(want.get(name)),
                                "observed": _flag_text(have.get(name))})
    return differences


def _sglang_start(argv):
    """Where SGLang's own part of a command line starts: ``-m MODULE`` (``python -m sglang.launch_server``),
    else right after the program (``sglang serve``)."""
    for index, arg in enumerate(argv[:-1]):
        if arg == "-m":
            return index
    return 1 if argv else 0


def command_differences(intended, running):
    """What differs between the intended command line and a RUNNING process's: (differences, notes).

    What matters is what SGLang runs - the module and every flag. The program in front of it may
    differ without changing anything: a launcher (a pyenv shim, a wrapper doing numactl or conda
    activation) that execs the interpreter leaves the interpreter's path in /proc/PID/cmdline. So a
    program difference is a note when the rest agrees, and named with the differences otherwise.
    """
    intended, running = redact(intended), redact(running)
    if intended == running:
        return [], []
    want_at, have_at = _sglang_start(intended), _sglang_start(running)
    differences = compare_command(intended[want_at:], running[have_at:])
    for item in differences:
        if item["key"] == "program":
            item["key"] = "module"
    program = {"key": "program", "expected": " ".join(intended[:want_at]), "observed": " ".join(running[:have_at])}
    if program["expected"] == program["observed"]:
        return differences, []
    if differences:
        return [program] + differences, []
    return [], ["its program is %s where the unit says %s (a launcher in front of the interpreter that execs it); "
                "the module and every argument agree" % (program["observed"], program["expected"])]


def _flag_text(values):
    if values is None:
        return None
    texts = [value if value else "(set)" for value in values]
    return texts[0] if len(texts) == 1 else texts


def compare_environment(intended, effective):
    """Differences between two NAME -> value mappings: {key, expected, observed} (None = unset)."""
    intended, effective = intended or {}, effective or {}
    return [{"key": name, "expected": intended.get(name), "observed": effective.get(name)}
            for name in sorted(set(intended) | set(effective))
            if intended.get(name) != effective.get(name)]


# api_key='K' (ServerArgs repr), "api_key": "K" (dict form, /server_info), --api-key K / --api-key=K.
# A quoted value ends at its first UNESCAPED quote (repr writes 'a\'b"c' for a key with both quotes).
_SECRET_IN_TEXT = (
    re.compile(r"""(?P<head>\b[\w-]*(?:key|token|secret|password)['"]?\s*[:=]\s*)(?P<q>['"])"""
               r"""(?P<value>(?:\\.|[^\\])*?)(?P=q)""", re.IGNORECASE),
    re.compile(r"""(?P<head>--[\w-]*(?:key|token|secret|password)(?:=|\s+))(?P<q>)(?P<value>[^\s'"]+)""",
               re.IGNORECASE),
)


def redact_text(text):
    """A log line with secret values masked (SGLang's server_args line prints api_key in clear)."""
    if not text:
        return text
    for pattern in _SECRET_IN_TEXT:
        text = pattern.sub(lambda m: m.group("head") + m.group("q") + MASK + m.group("q")
                           if m.group("value") not in ("None", "") else m.group(0), text)
    return text
