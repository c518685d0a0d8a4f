# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Drive gpufleet.inference.sglang_ready in slices: live progress, and a wait that survives SSH drops.

Controller-side helper of the action plugins (sglang_ready, sglang_host, sglang_rollout_host); private
to this collection: no compatibility promise.

Each slice is one run of the module on the host (at most ``slice_seconds``, or until the
startup moves to a new phase); it returns ``verdict: waiting`` and its state, which the next
slice continues from (followed InvocationID, journal cursor, phases seen, time spent). Between
slices this plugin prints what happened. A slice lost to the connection is run again from the
same state, so the verdict is never lost and never wrong; after ``connection_retry_seconds``
without a connection the task fails with ``connection_lost``, naming what is known.
"""
from __future__ import annotations

import time

from ansible.errors import AnsibleConnectionFailure
from ansible.module_utils.parsing.convert_bool import boolean
from ansible.utils.display import Display

display = Display()

MODULE = "gpufleet.inference.sglang_ready"
# Each slice is a module run: long slices keep a minutes-long load cheap for the controller
# (docs/docsite/rst/performance.rst); a phase change still ends a slice early, so progress shows at once.
DEFAULT_SLICE_SECONDS = 30.0
# Progress lines name the module: with display_skipped_hosts off, Ansible prints a task's banner
# only with its first result, after these lines.
PREFIX = "sglang_ready | "
PROGRESS_INTERVAL = 5.0   # at most one line per host this often, unless the phase changes
HEARTBEAT_SECONDS = 30.0  # a line at least this often, even when nothing moves
RETRY_PAUSE_SECONDS = 2.0

_LOST_MARKERS = ("Module result deserialization failed", "Failed to connect to the host",
                 "Shared connection to", "Connection reset", "Connection timed out", "Broken pipe",
                 "Connection closed", "kex_exchange_identification", "Connection refused")


def connection_lost(result):
    """Why a slice's result means the connection broke (not the module), or None."""
    if result.get("unreachable"):
        return str(result.get("msg") or "host unreachable")
    if not result.get("failed") or result.get("verdict"):
        return None
    stderr = str(result.get("module_stderr") or "")
    if "Traceback (most recent call last)" in stderr:
        return None  # the module itself crashed: retrying would not help
    text = "%s %s" % (result.get("msg") or "", stderr)
    if result.get("rc") == 255 or any(marker in text for marker in _LOST_MARKERS):
        return (str(result.get("msg") or "connection error").splitlines() or ["connection error"])[0]
    return None


def final_line(host, answer, elapsed):
    """The wait's last progress line: its verdict and the first sentence of its message."""
    text = str(answer.get("msg") or "").strip().splitlines()
    first = text[0] if text else ""
    if len(first) > 200:
        first = first[:197] + "..."
    verdict = answer.get("verdict") or ("failed" if answer.get("failed") else "done")
    return PREFIX + "%s: [%6.1fs] %s%s" % (host, elapsed, verdict, ": " + first if first else "")


class Progress(object):
    """Which progress events become lines: every phase change, else one line per interval."""

    def __init__(self, host, interval=PROGRESS_INTERVAL, heartbeat=HEARTBEAT_SECONDS, start=None):
        self.host = host
        self.interval = interval
        self.heartbeat = heartbeat
        self.last_phase = None
        self.last_line_at = start  # a heartbeat is due `heartbeat` seconds after the start too
        self.held = None  # the newest event of the current phase not printed yet

    def _line(self, event):
        return PREFIX + "%s: [%6.1fs] %s" % (self.host, event.get("elapsed") or 0.0, event.get("text") or event.get("phase"))

    def lines(self, events, now, phase_text=None, elapsed=None):
        out = []
        for event in events or []:
            if event.get("phase") != self.last_phase:
                self.last_phase = event.get("phase")
                self.held = None
                out.append(self._line(event))
                self.last_line_at = now
            else:
                self.held = event
        if self.held is not None and (self.last_line_at is None or now - self.last_line_at >= self.interval):
            out.append(self._line(self.held))
            self.held = None
            self.last_line_at = now
        if not out and phase_text and self.last_line_at is not None and now - self.last_line_at >= self.heartbeat:
            out.append(PREFIX + "%s: [%6.1fs] still %s" % (self.host, elapsed or 0.0, phase_text))
            self.last_line_at = now
        return out


def wait_in_slices(execute, reset, args, host, check_mode=False, between=None):
    """The whole wait, one module slice at a time: ``execute(module_args)`` runs one slice on the host
    (and returns ``{"unreachable": True, ...}`` when the connection fails), ``reset()`` drops a dead
    connection, ``between()`` (optional) runs after each slice that left the wait going (a writer renews
    its lease of the host there). Returns the wait's result (the module's verdict, or ``connection_lost``)."""
    args = dict(args)
    try:
        slice_seconds = float(args.get("slice_seconds", DEFAULT_SLICE_SECONDS) or 0)
        timeout = float(args.get("timeout", 900))
        retry_budget = float(args.get("connection_retry_seconds", 120))
        show = boolean(args.get("progress", True), strict=True) and not check_mode
    except (TypeError, ValueError):
        # Let the module's argument check say what is wrong, in one call.
        slice_seconds, timeout, retry_budget, show = 0.0, 900.0, 0.0, False
    args.pop("resume", None)
    args["slice_seconds"] = slice_seconds
    started = time.monotonic()
    progress = Progress(host, start=started)
    state = None
    events = []
    lost_since = None
    losses = []
    runs = 0
    while True:
        call = dict(args)
        if state is not None or losses:
            # the deadline is the whole wait's, slices and lost connections included
            state = state or {}
            state["elapsed"] = round(time.monotonic() - started, 3)
            call["resume"] = state
        answer = execute(call)
        runs += 1
        now = time.monotonic()
        reason = connection_lost(answer)
        if reason is not None:
            if lost_since is None:
                lost_since = now
                losses.append(reason)
                if show:
                    display.display(PREFIX + "%s: [%6.1fs] connection lost (%s); retrying the wait from its state" % (
                        host, now - started, reason))
            if now - lost_since >= retry_budget or now - started >= timeout:
                return dict(lost_result(host, reason, now - lost_since, now - started, state, events, losses),
                            module_runs=runs)
            reset()
            time.sleep(RETRY_PAUSE_SECONDS)
            continue
        if lost_since is not None and show:
            display.display(PREFIX + "%s: [%6.1fs] connection back after %.1fs; the wait goes on" % (
                host, now - started, now - lost_since))
        lost_since = None
        events.extend(answer.get("events") or [])
        if show:
            for line in progress.lines(answer.get("events"), now, answer.get("phase"), answer.get("elapsed")):
                display.display(line)
        if answer.get("verdict") == "waiting":
            state = answer.get("state") or {}
            if between is not None:
                between()
            continue
        answer.pop("state", None)
        answer["events"] = events
        answer["module_runs"] = runs
        if show:
            display.display(final_line(host, answer, now - started))
        if losses:
            answer.setdefault("notes", []).append("the connection broke %s time(s) during the wait (%s); each lost "
                                                  "slice was run again from its state" % (len(losses), losses[0]))
        return answer


def lost_result(host, reason, lost_for, elapsed, state, events, losses):
    """The wait's result when the connection stayed lost past its budget: no verdict, what is known."""
    state = state or {}
    tracker = state.get("tracker") or {}
    return dict(
        failed=True, changed=False, verdict="connection_lost", events=events, elapsed=round(elapsed, 3),
        invocation_id=tracker.get("invocation_id"), phase=state.get("phase"), phases=state.get("phases") or {},
        msg="connection to %s lost during the wait for %.0fs (%s): no verdict. Last known: %s%s after %.1fs. "
            "The host was not checked since; it may be serving, loading or down." % (
                host, lost_for, reason,
                "invocation %s, " % tracker["invocation_id"] if tracker.get("invocation_id") else "",
                state.get("phase") or "the wait had not reported yet", elapsed),
        notes=["connection lost %s time(s): %s" % (len(losses), "; ".join(losses))])


def execute_slice(action, task_vars):
    """``execute`` for wait_in_slices from an action plugin: one run of the module on its host."""
    def execute(module_args):
        try:
            return action._execute_module(module_name=MODULE, module_args=module_args, task_vars=task_vars)
        except AnsibleConnectionFailure as exc:
            return {"unreachable": True, "msg": str(exc)}
    return execute


def reset_connection(action):
    """``reset`` for wait_in_slices: drop the action's connection (a dead master cannot be stopped)."""
    def reset():
        try:
            action._connection.reset()
        except Exception:  # pylint: disable=broad-except  # a dead master cannot be stopped; a new one comes next
            pass
    return reset


class ActionRunner(object):
    """What module_utils._hostpath.HostPath needs, from an action plugin: one module on the action's host
    (a broken connection is a result, ``unreachable``), the sliced wait, and progress lines."""

    def __init__(self, action, task_vars, host, progress=True, prefix="sglang | "):
        self.action = action
        self.task_vars = task_vars
        self.host = host
        self.progress = progress
        self.prefix = prefix
        self.started = time.monotonic()

    def run(self, name, module_args):
        try:
            result = self.action._execute_module(module_name=name, module_args=module_args, task_vars=self.task_vars)
        except AnsibleConnectionFailure as exc:
            return {"unreachable": True, "failed": True, "msg": str(exc)}
        if result.get("unreachable"):
            result["failed"] = True
        return result

    def wait(self, module_args, between=None):
        return wait_in_slices(execute_slice(self.action, self.task_vars), reset_connection(self.action), module_args,
                              self.host, self.action._task.check_mode, between=between)

    def say(self, text):
        if self.progress:
            display.display(self.prefix + "%s: [%6.1fs] %s" % (self.host, time.monotonic() - self.started, text))
