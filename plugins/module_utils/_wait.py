# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Wait until the NEW SGLang process of a systemd unit runs the intended settings.

Private to this collection: no compatibility promise.

Everything the waiter touches is injected (clock, sleep, systemd, journal, HTTP, listener
provenance, journald's suppression notices), so every verdict is unit-testable with fakes.
Each poll runs the steps of ``Waiter.STEPS`` in order; a step either returns a final Outcome,
returns WAIT (nothing more to learn this poll) or None (go on with the next step).
"""
from __future__ import annotations

import time

from ansible_collections.gpufleet.inference.plugins.module_utils import _config_line as cfg
from ansible_collections.gpufleet.inference.plugins.module_utils._journal import JournalError
from ansible_collections.gpufleet.inference.plugins.module_utils._probe import generate_verdict
from ansible_collections.gpufleet.inference.plugins.module_utils._systemd import SystemdError, flag_value

PASS = "pass"
MISMATCH = "mismatch"
DIED = "died"
CRASH_LOOP = "crash_loop"
TIMEOUT = "timeout"
FOREIGN_LISTENER = "foreign_listener"
MISSING_CONFIG_LINE = "missing_config_line"
UNAUTHORIZED = "unauthorized"
NOT_ACTIVE = "not_active"
NOT_FOUND = "not_found"
CHECK_MODE = "check_mode"

WAIT = object()
EXCERPT_CHARS = 200


class Outcome(object):
    def __init__(self, verdict, msg, ok=False):
        self.verdict = verdict
        self.msg = msg
        self.ok = ok


def _short(invocation_id):
    return invocation_id or "none"


def _iso(epoch):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


class Waiter(object):
    """One wait; call run() once. Results accumulate in attributes reported by result()."""

    def __init__(self, systemd, journal_factory, http, unit, clock=time.monotonic, sleep=time.sleep,
                 wall=time.time, after_invocation=None, expect=None, timeout=900.0, poll_interval=5.0,
                 request_timeout=60.0, max_new_tokens=8, prompt="The capital of France is",
                 crash_loop_restarts=0, provenance=None, suppressed=None, flags_for_key=None,
                 tail_lines=20, check_mode=False, journal_grace=35.0):
        self.systemd = systemd
        self.journal_factory = journal_factory
        self.http = http
        self.unit = unit
        self.clock = clock
        self.sleep = sleep
        self.wall = wall
        self.after_invocation = after_invocation or None
        self.expect = dict(expect or {})
        self.timeout = float(timeout)
        self.poll_interval = float(poll_interval)
        self.request_timeout = float(request_timeout)
        self.max_new_tokens = max_new_tokens
        self.prompt = prompt
        self.crash_loop_restarts = crash_loop_restarts
        self.provenance = provenance
        self.suppressed = suppressed
        self.flags_for_key = flags_for_key or (lambda key: ())
        self.tail_lines = tail_lines
        self.check_mode = check_mode
        # journald writes "Suppressed N messages" only once its rate-limit interval is over AND
        # the unit logs again: a missing config line is judged that long after /generate answers.
        self.journal_grace = float(journal_grace)
        self.missing_since = None

        self.started = None
        self.state = None
        self.invocation_id = None
        self.baseline_restarts = None
        self.deaths = 0
        self.journal = None
        self.config = None
        self.config_searched = False
        self.source = None
        self.observed = None
        self.generate = None
        self.last_response = None
        self.listener = None
        self.phases = {}
        self.phase = "starting"
        self.journal_tail = None
        self.notes = []
        self.suppression = None
        self.server_info = None
        self._exec_start = None

    # --- the loop ----------------------------------------------------------------------------

    @property
    def STEPS(self):  # pylint: disable=invalid-name
        return (self._step_unit, self._step_journal, self._step_generate, self._step_conclude)

    def elapsed(self):
        return round(self.clock() - self.started, 3) if self.started is not None else 0.0

    def remaining(self):
        return self.timeout - (self.clock() - self.started)

    def run(self):
        self.started = self.clock()
        if self.check_mode and self.after_invocation:
            return Outcome(CHECK_MODE, "check mode: nothing was restarted, so there is no new invocation of %s to wait for"
                           % self.unit, ok=True)
        while True:
            outcome = self._poll()
            if outcome is not None:
                return outcome
            # a millisecond of slack: float clocks may never reach the deadline exactly
            if self.remaining() <= 0.001:
                return self._timeout()
            self.sleep(max(0.0, min(self.poll_interval, self.remaining())))

    def _poll(self):
        for step in self.STEPS:
            try:
                outcome = step()
            except (SystemdError, JournalError) as exc:
                self.phase = "%s (last error: %s)" % (self.phase.split(" (last error")[0], exc)
                return None
            if outcome is WAIT:
                return None
            if outcome is not None:
                return outcome
        return None

    def _mark(self, name, **extra):
        if name not in self.phases:
            entry = {"elapsed": self.elapsed(), "at": _iso(self.wall())}
            entry.update(extra)
            self.phases[name] = entry

    # --- step 1: which invocation, and is it alive? -------------------------------------------

    def _step_unit(self):
        state = self.systemd.state()
        self.state = state
        if not state.exists:
            return Outcome(NOT_FOUND, "unit %s not found (LoadState=%s)" % (self.unit, state.load_state or "?"))
        if self.invocation_id is None:
            return self._find_invocation(state)
        if state.invocation_id != self.invocation_id:
            return self._ended(state, "was replaced by invocation %s (restarted: crash loop)" % _short(state.invocation_id),
                               CRASH_LOOP)
        if state.sub_state.startswith("auto-restart"):
            return self._ended(state, "exited and systemd is restarting it (Restart=, crash loop)", CRASH_LOOP)
        if state.n_restarts > self.baseline_restarts:
            return self._ended(state, "was restarted by systemd (NRestarts %s -> %s, crash loop)" % (
                self.baseline_restarts, state.n_restarts), CRASH_LOOP)
        if state.crashed:
            return self._ended(state, "ended (%s/%s, Result %s)" % (state.active_state, state.sub_state, state.result), DIED)
        return None

    def _find_invocation(self, state):
        if self.after_invocation is None:
            if not state.invocation_id or not state.running:
                if state.crashed and state.invocation_id:
                    self._lock(state)
                    return self._ended(state, "is not running (%s/%s, Result %s)" % (
                        state.active_state, state.sub_state, state.result), DIED)
                return Outcome(NOT_ACTIVE, "%s is not running: %s" % (self.unit, state.describe()))
            self._lock(state)
            return None
        if not state.invocation_id or state.invocation_id == self.after_invocation:
            self.phase = "waiting for a new invocation of %s (still %s, %s/%s)" % (
                self.unit, _short(state.invocation_id), state.active_state, state.sub_state)
            return WAIT
        self._lock(state)
        if state.crashed:
            return self._ended(state, "ended before it could be checked (%s/%s, Result %s)" % (
                state.active_state, state.sub_state, state.result), DIED)
        return None

    def _lock(self, state):
        self.invocation_id = state.invocation_id
        self.baseline_restarts = state.n_restarts
        self.journal = self.journal_factory(state.invocation_id)
        self.config = None
        self.config_searched = False
        self._mark("new_invocation" if self.after_invocation else "invocation",
                   invocation_id=state.invocation_id, process_start=state.start_timestamp or None,
                   main_pid=state.main_pid)
        self.phase = "invocation %s started; reading its journal" % state.invocation_id

    def _ended(self, state, how, verdict):
        """The followed invocation is gone. Follow the next one if restarts are tolerated."""
        dead = self.invocation_id
        if verdict == CRASH_LOOP and self.deaths < self.crash_loop_restarts:
            self.deaths += 1
            self.notes.append("invocation %s %s; following the next one (%s of %s tolerated restarts)" % (
                dead, how, self.deaths, self.crash_loop_restarts))
            self.invocation_id = None
            self.after_invocation = dead
            self.phases.pop("new_invocation", None)
            return WAIT
        self.journal_tail = self._tail()
        lines = "\n".join(self.journal_tail) or "(no journal entries)"
        return Outcome(verdict, "%s: invocation %s %s after %.1fs, while %s. Last %s journal lines of the invocation:\n%s" % (
            self.unit, dead, how, self.elapsed(), self.phase, len(self.journal_tail), lines))

    def _tail(self):
        if self.journal is None:
            return []
        try:
            return self.journal.tail(self.tail_lines)
        except JournalError:
            return list(self.journal.last_lines)

    # --- step 2: the config line, from this invocation's journal only --------------------------

    def _step_journal(self):
        if self.journal.cursor is None:
            entries = self.journal.start(None if self.after_invocation else self.tail_lines)
        else:
            entries = self.journal.read_new()
        if self.config is None:
            found = cfg.find_config_line(entry.message for entry in entries)
            if found is None and self.journal.gaps and not self.config_searched:
                found = self._search_config()
            if found is not None:
                return self._take_config(found, "journal")
        return None

    def _search_config(self):
        """Find the config line of this invocation without reading all of it (journalctl --grep)."""
        self.config_searched = True
        lines = self.journal.grep(cfg.GREP_PATTERN)
        if lines is None:
            self.notes.append("journalctl here cannot --grep; only the last %s entries were searched"
                              % self.journal.batch)
            return None
        return cfg.find_config_line(lines)

    def _take_config(self, found, source):
        self.config = found
        self.source = source
        self.observed = found["values"]
        self._mark("config_line", logged_at=found.get("timestamp"))
        mismatches = cfg.compare(self.expect, self.observed)
        if mismatches:
            return Outcome(MISMATCH, self._mismatch_message(mismatches, "in the config line of invocation %s" % self.invocation_id))
        self.phase = "config line agrees; waiting for /generate"
        return None

    def _mismatch_message(self, mismatches, where):
        parts = []
        for item in mismatches:
            parts.append("%s: expected %s (%s), observed %s %s" % (
                item["key"], cfg.render(item["expected"]), self._flag_in_unit(item["key"]),
                cfg.render(item["observed"]), where))
        return "%s runs other settings than intended: %s" % (self.unit, "; ".join(parts))

    def _flag_in_unit(self, key):
        flags = tuple(self.flags_for_key(key))
        if not flags:
            return "no unit flag known for %s" % key
        if self._exec_start is None:
            try:
                self._exec_start = self.systemd.exec_start()
            except SystemdError:
                self._exec_start = []
        for flag in flags:
            for argv in self._exec_start:
                found, value = flag_value(argv, flag)
                if found:
                    return "%s %s in %s" % (flag, value if value is not None else "", self.unit)
        return "neither %s in %s's ExecStart" % (" nor ".join(flags), self.unit) if len(flags) > 1 else \
            "no %s in %s's ExecStart" % (flags[0], self.unit)

    # --- step 3: /generate, and who answers it -------------------------------------------------

    def _step_generate(self):
        remaining = self.remaining()
        if remaining <= 0:
            return WAIT
        resp = self.http.generate(self.prompt, self.max_new_tokens, min(self.request_timeout, remaining))
        self.last_response = resp
        if not resp.port_open:
            self.phase = "loading: %s, port not open yet (%s)" % (
                "config line seen" if self.config else "no config line yet", resp.describe())
            return WAIT
        self._mark("port_open")
        if self.provenance is not None:
            self.listener = self.provenance(self.state.control_group, self.state.main_pid)
            if self.listener["verdict"] != "inside":
                return Outcome(FOREIGN_LISTENER, self.listener["message"])
        if resp.kind == "http" and resp.status in (401, 403):
            return Outcome(UNAUTHORIZED, "%s answers /generate with HTTP %s: the api_key does not match the server's --api-key"
                           % (self.unit, resp.status))
        ok, text, meta = generate_verdict(resp)
        if not ok:
            self.phase = "port open, /generate not answering yet (%s%s)" % (
                resp.describe(), ": " + resp.body[:EXCERPT_CHARS] if resp.kind == "http" and resp.body else "")
            return WAIT
        self.generate = {"status": resp.status, "text": text[:EXCERPT_CHARS], "meta_info": meta}
        self._mark("generate")
        return None

    # --- step 4: the verdict once /generate answered -------------------------------------------

    def _step_conclude(self):
        if self.config is None and not self.config_searched:
            found = self._search_config()
            if found is not None:
                outcome = self._take_config(found, "journal")
                if outcome is not None:
                    return outcome
        if self.config is None and self.expect:
            return self._without_config_line()
        return Outcome(PASS, self._pass_message(), ok=True)

    def _pass_message(self):
        how = "config line agrees" if self.source == "journal" else (
            "/server_info agrees (config line lost to journald rate limiting)" if self.source == "server_info" else
            "no expectations given")
        return "%s: invocation %s is serving (%s; /generate answered after %.1fs)" % (
            self.unit, self.invocation_id, how, self.elapsed())

    def _without_config_line(self, final=False):
        notices = []
        if self.suppressed is not None:
            try:
                notices = self.suppressed(self.invocation_id, self.state.start_timestamp) or []
            except JournalError as exc:
                self.notes.append("could not look for journald suppression notices: %s" % exc)
        if not notices:
            if self.missing_since is None:
                self.missing_since = self.clock()
            waited = self.clock() - self.missing_since
            if not final and waited < self.journal_grace:
                # Each poll's /generate makes SGLang log a line, which lets journald write its notice.
                self.phase = ("/generate answers but no config line yet: waiting up to %.0fs for journald's "
                              "suppression notice (%.0fs so far)" % (self.journal_grace, waited))
                return WAIT
            return Outcome(MISSING_CONFIG_LINE, (
                "%s: no config line ('Initialized DFLASH draft runner' / 'Initialized DDTree worker', rank 0) in the "
                "journal of invocation %s although /generate answers (SGLang logs it before the port opens); "
                "expected %s" % (self.unit, self.invocation_id, cfg.normalize_expect(self.expect))))
        dropped = sum(notice["count"] or 0 for notice in notices)
        self.suppression = {"messages_dropped": dropped, "notices": [notice["message"] for notice in notices]}
        lost = ("journald rate limiting dropped %s messages of %s during invocation %s (%s), so its config line was lost"
                % (dropped, self.unit, self.invocation_id, notices[-1]["message"]))
        remaining = max(self.remaining(), 1.0)
        resp = self.http.server_info(min(self.request_timeout, remaining))
        info = resp.json() if resp.kind == "http" and resp.status == 200 else None
        if not isinstance(info, dict):
            return Outcome(MISSING_CONFIG_LINE, "%s; /server_info could not stand in (%s)" % (lost, resp.describe()))
        self.server_info = info
        self.source = "server_info"
        self.observed = cfg.config_from_server_info(info)
        self.notes.append(lost + "; compared with /server_info instead")
        mismatches = cfg.compare(self.expect, self.observed)
        if mismatches:
            return Outcome(MISMATCH, "%s (%s)" % (
                self._mismatch_message(mismatches, "in /server_info of invocation %s" % self.invocation_id), lost))
        return Outcome(PASS, self._pass_message(), ok=True)

    # --- timeout ---------------------------------------------------------------------------

    def _timeout(self):
        if self.missing_since is not None and self.config is None:
            # /generate answered: what is missing is the config line, not readiness.
            return self._without_config_line(final=True)
        last_line = None
        if self.journal is not None and self.journal.last_lines:
            last_line = self.journal.last_lines[-1]
        state = self.state.describe() if self.state is not None else "unknown"
        return Outcome(TIMEOUT, "timed out after %.1fs waiting for %s: last phase: %s; unit %s; last journal line: %s" % (
            self.elapsed(), self.unit, self.phase, state,
            repr(last_line) if last_line is not None else "(none seen for this invocation)"))

    # --- what the module returns -------------------------------------------------------------

    def result(self):
        return {
            "invocation_id": self.invocation_id,
            "main_pid": self.state.main_pid if self.state is not None else None,
            "unit_state": self.state.as_dict() if self.state is not None else None,
            "expected": cfg.normalize_expect(self.expect),
            "observed": self.observed,
            "config_line": self.config["line"] if self.config else None,
            "source": self.source,
            "elapsed": self.elapsed(),
            "phases": self.phases,
            "phase": self.phase,
            "generate": self.generate,
            "listener": self.listener,
            "journal_tail": self.journal_tail,
            "suppression": self.suppression,
            "notes": self.notes,
        }
