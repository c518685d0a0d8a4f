# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Wait until the NEW SGLang process of a systemd unit runs the intended settings, and prove it.

Private to this collection: no compatibility promise.

The pieces:
- ``Tracker``: which invocation is followed and whether systemd still runs it;
- ``_startup.StartupLog``: what that invocation's journal says (phase, config lines);
- ``_evidence``: which lines count and when a missing line may be judged;
- ``_messages``: the wording;
- ``Waiter``: the loop. Once the invocation is known, each tick blocks in the journal follower
  (a new line is seen at once, a quiet process costs nothing), checks that the main process is
  alive, and tries a TCP connect to the port; ``/generate`` is sent as soon as the port accepts.
  After the first good answer it keeps watching for ``min_ready_seconds`` (settle) before it
  passes. A wait runs whole, or in slices that return their state for the next slice (the
  action plugin drives those and shows progress).

All I/O goes through one ``host`` object (see ``sglang_ready.Host``), so every verdict is
unit-testable with a fake.
"""
from __future__ import annotations

import collections

from ansible_collections.gpufleet.inference.plugins.module_utils import _config_line as cfg
from ansible_collections.gpufleet.inference.plugins.module_utils import _evidence as ev
from ansible_collections.gpufleet.inference.plugins.module_utils import _messages as msgs
from ansible_collections.gpufleet.inference.plugins.module_utils._journal import JournalError
from ansible_collections.gpufleet.inference.plugins.module_utils._probe import generate_verdict
from ansible_collections.gpufleet.inference.plugins.module_utils._process import (
    command_differences,
    compare_environment,
    redact,
    redact_text,
)
from ansible_collections.gpufleet.inference.plugins.module_utils._startup import StartupLog, describe_phase, look_back
from ansible_collections.gpufleet.inference.plugins.module_utils._systemd import SystemdError

PASS = "pass"
MISMATCH = "mismatch"
DIED = "died"
CRASH_LOOP = "crash_loop"
REPLACED = "replaced"
UNSTABLE = "unstable"
TIMEOUT = "timeout"
FOREIGN_LISTENER = "foreign_listener"
MISSING_CONFIG_LINE = "missing_config_line"
UNVERIFIED = "unverified"
UNAUTHORIZED = "unauthorized"
NOT_ACTIVE = "not_active"
NOT_FOUND = "not_found"
CHECK_MODE = "check_mode"
WAITING = "waiting"  # a slice ended before a verdict; the state carries the wait on

EXCERPT_CHARS = 200
# A slice returns early on a phase change, but not sooner than this: each slice is one module run (a
# controller worker's ssh call, ~15 ms of controller CPU, and a Python start on the host). Phases a few
# seconds apart are shown together, at most this much later; a real load's phases are minutes apart.
MIN_SLICE_SECONDS = 5.0
# Phase changes that end a slice early (progress shows at once): the long stretches of a start.
# From the config line on, readiness is seconds away: a slice then runs on, so the relaunch of
# the next slice never sits between the port opening and the wait noticing it.
EARLY_RETURN_PHASES = ("waiting", "new_invocation", "invocation", "loading_weights", "weights_loaded", "kv_cache",
                       "cuda_graph")
FLUSH_SECONDS = 2.0      # after a death: how long to wait for the last lines and systemd's notes
POKE_SECONDS = 2.0       # journal_grace: how often a /generate makes the idle server log a line


class Outcome(object):
    def __init__(self, verdict, msg, ok=False):
        self.verdict = verdict
        self.msg = msg
        self.ok = ok


def environment_text(environment):
    """NAME -> value as systemd sets it: text (None -> '', booleans -> 1/0, as the role renders)."""
    out = {}
    for key, value in (environment or {}).items():
        if value is None:
            value = ""
        elif isinstance(value, bool):
            value = "1" if value else "0"
        out[str(key)] = str(value)
    return out


class Intent(object):
    """What the process must run: config-line values (and whether a line may appear at all),
    its command line, and its environment (each optional)."""

    def __init__(self, expect=None, config_line=None, command=None, environment=None):
        self.expect = cfg.normalize_expect(expect)
        self.mode = ev.config_line_mode(config_line, self.expect)
        self.command = list(command) if command else None
        self.environment = environment_text(environment) if environment is not None else None


class Policy(object):
    """How long and how closely to watch."""

    def __init__(self, timeout=900.0, min_ready_seconds=0.0, tick=0.25, state_interval=1.0, request_timeout=60.0,
                 crash_loop_restarts=0, journal_grace=35.0, accept_unverified=False, write_receipt=True,
                 tail_lines=20):
        self.timeout = float(timeout)
        self.min_ready_seconds = float(min_ready_seconds)
        self.tick = float(tick)
        self.state_interval = float(state_interval)
        self.request_timeout = float(request_timeout)
        self.crash_loop_restarts = int(crash_loop_restarts)
        self.journal_grace = float(journal_grace)
        self.accept_unverified = bool(accept_unverified)
        self.write_receipt = bool(write_receipt)
        self.tail_lines = int(tail_lines)


def _death(state):
    """A main process that ended: systemd restarting it (Restart=) is a crash loop, else it died."""
    return CRASH_LOOP if state.sub_state.startswith("auto-restart") else DIED


class Tracker(object):
    """Which invocation of the unit is followed, and what systemd says about it."""

    def __init__(self, unit, after_invocation=None, crash_loop_restarts=0, state=None):
        state = state or {}
        self.unit = unit
        self.crash_loop_restarts = crash_loop_restarts
        self.verify_only = state.get("verify_only", not after_invocation)
        self.after = state.get("after", after_invocation or None)
        self.invocation_id = state.get("invocation_id")
        self.baseline_restarts = state.get("baseline_restarts")
        self.main_pid = state.get("main_pid")
        self.deaths = state.get("deaths", 0)

    def to_state(self):
        return {"verify_only": self.verify_only, "after": self.after, "invocation_id": self.invocation_id,
                "baseline_restarts": self.baseline_restarts, "main_pid": self.main_pid, "deaths": self.deaths}

    def _lock(self, state):
        self.invocation_id = state.invocation_id
        self.baseline_restarts = state.n_restarts
        self.main_pid = state.main_pid

    def observe(self, state):
        """One of ("not_found",), ("not_active",), ("waiting",), ("locked",), ("alive",),
        ("ended", verdict, how)."""
        if not state.exists:
            return ("not_found",)
        if self.invocation_id is None:
            if self.verify_only:
                if state.invocation_id and state.running:
                    self._lock(state)
                    return ("locked",)
                if state.invocation_id and state.crashed:
                    self._lock(state)
                    return ("ended", _death(state), "is not running (%s/%s, %s)" % (
                        state.active_state, state.sub_state, state.how_it_ended()))
                return ("not_active",)
            if not state.invocation_id or state.invocation_id == self.after:
                return ("waiting",)
            self._lock(state)
            if state.crashed:
                return ("ended", _death(state), "ended before it could be checked (%s/%s, %s)" % (
                    state.active_state, state.sub_state, state.how_it_ended()))
            return ("locked",)
        if state.main_pid:
            self.main_pid = state.main_pid
        if state.invocation_id != self.invocation_id:
            if state.n_restarts > self.baseline_restarts or state.crashed:
                return ("ended", CRASH_LOOP, "was replaced by invocation %s (restarted by systemd: crash loop)"
                        % (state.invocation_id or "none"))
            return ("ended", REPLACED, "was replaced by invocation %s although systemd did not restart it "
                    "(NRestarts %s): someone or something else restarted %s" % (
                        state.invocation_id or "none", state.n_restarts, self.unit))
        if state.sub_state.startswith("auto-restart"):
            return ("ended", CRASH_LOOP, "exited (%s) and systemd is restarting it (Restart=, crash loop)"
                    % state.how_it_ended())
        if state.n_restarts > self.baseline_restarts:
            return ("ended", CRASH_LOOP, "was restarted by systemd (NRestarts %s -> %s, crash loop)" % (
                self.baseline_restarts, state.n_restarts))
        if state.crashed:
            return ("ended", DIED, "ended (%s/%s, %s)" % (state.active_state, state.sub_state, state.how_it_ended()))
        return ("alive",)

    def tolerate(self, verdict):
        """Follow the next invocation instead of failing, while crash-loop restarts are tolerated."""
        if verdict != CRASH_LOOP or self.deaths >= self.crash_loop_restarts:
            return False
        self.deaths += 1
        self.after, self.invocation_id, self.baseline_restarts, self.main_pid = self.invocation_id, None, None, None
        self.verify_only = False
        return True


class Waiter(object):
    """One wait (or one slice of it): ``run()`` returns an Outcome; ``result()`` the module's return."""

    def __init__(self, host, unit, intent, policy, after_invocation=None, resume=None):
        resume = resume or {}
        self.host = host
        self.unit = unit
        self.intent = intent
        self.policy = policy
        self.tracker = Tracker(unit, after_invocation, policy.crash_loop_restarts, resume.get("tracker"))
        self.log = StartupLog(resume.get("log"))
        self.cursor = resume.get("cursor")
        # the last of the process's own entries read: where a receipt says a later check reads on from
        self.own_cursor = resume.get("own_cursor")
        self.tail = collections.deque(resume.get("tail", []), maxlen=policy.tail_lines)
        self.phases = resume.get("phases", {})
        self.phase = resume.get("phase", "starting")
        self.generate = resume.get("generate")
        self.settle_since = resume.get("settle_since")
        self.settled = resume.get("settled", False)
        self.missing_since = resume.get("missing_since")
        self.poked_at = resume.get("poked_at")
        self.notes = list(resume.get("notes", []))
        self.listener = resume.get("listener")
        self.launched = resume.get("launched")
        self.evidence = resume.get("evidence")
        self.receipt = resume.get("receipt")
        self.verified = resume.get("verified", True)
        self.elapsed_before = float(resume.get("elapsed", 0.0))
        self.state = None
        self.follower = None
        self.started = None
        self.events = []
        self.journal_tail = None
        self.suppression = None
        self.receipt_written = None
        self._last_state_check = None
        self._force_state = True
        self._phase_changed = False

    # --- clock ---------------------------------------------------------------------------

    def elapsed(self):
        if self.started is None:
            return round(self.elapsed_before, 3)
        return round(self.elapsed_before + self.host.clock() - self.started, 3)

    def remaining(self):
        return self.policy.timeout - self.elapsed()

    def _event(self, phase, text, phase_change=True):
        self.events.append({"elapsed": self.elapsed(), "phase": phase, "text": text})
        if phase_change and phase in EARLY_RETURN_PHASES:
            self._phase_changed = True

    def _mark(self, name, **extra):
        if name not in self.phases:
            entry = {"elapsed": self.elapsed(), "at": self.host.wall_iso()}
            entry.update(extra)
            self.phases[name] = entry

    # --- the loop ------------------------------------------------------------------------

    def run(self, slice_seconds=None):
        self.started = self.host.clock()
        slice_end = self.started + slice_seconds if slice_seconds else None
        try:
            while True:
                outcome = self._poll()
                if outcome is not None:
                    return self._finish(outcome)
                if self.remaining() <= 0.001:  # float clocks may never reach the deadline exactly
                    return self._finish(self._timeout())
                now = self.host.clock()
                if slice_end is not None and (now >= slice_end or (
                        self._phase_changed and now - self.started >= MIN_SLICE_SECONDS)):
                    return Outcome(WAITING, "%s: still waiting after %.1fs: %s" % (self.unit, self.elapsed(), self.phase),
                                   ok=True)
        finally:
            if self.follower is not None:
                self.follower.close()
                self.follower = None

    def _poll(self):
        if self._state_due():
            outcome = self._check_unit()
            if outcome is not None:
                return outcome
        if self.tracker.invocation_id is None:
            self.host.sleep(max(0.0, min(self.policy.tick * 2, self.remaining())))
            return None
        outcome = self._read_journal(max(0.0, min(self.policy.tick, self.remaining())))
        if outcome is not None:
            return outcome
        if self._force_state:
            return None  # systemd has something to say first (next poll)
        if self.generate is None:
            return self._probe_generate()
        return self._conclude()

    def _state_due(self):
        if self._force_state or self._last_state_check is None:
            return True
        if self.tracker.invocation_id is None:
            return True
        if self.tracker.main_pid and not self.host.alive(self.tracker.main_pid):
            return True
        return self.host.clock() - self._last_state_check >= self.policy.state_interval

    # --- systemd's view ----------------------------------------------------------------------

    def _check_unit(self):
        try:
            state = self.host.state()
        except SystemdError as exc:
            self.phase = "%s (last error: %s)" % (self.phase.split(" (last error")[0], exc)
            return None
        self.state = state
        self._last_state_check = self.host.clock()
        self._force_state = False
        seen = self.tracker.observe(state)
        kind = seen[0]
        if kind == "not_found":
            return Outcome(NOT_FOUND, "unit %s not found (LoadState=%s)" % (self.unit, state.load_state or "?"))
        if kind == "not_active":
            return Outcome(NOT_ACTIVE, "%s is not running: %s" % (self.unit, state.describe()))
        if kind == "waiting":
            text = "waiting for a new invocation of %s (still %s, %s/%s)" % (
                self.unit, state.invocation_id or "none", state.active_state, state.sub_state)
            if not self.phase.startswith("waiting for a new invocation"):
                self._event("waiting", "old invocation %s still %s/%s (draining)" % (
                    state.invocation_id or "none", state.active_state, state.sub_state))
            self.phase = text
            return None
        if kind == "locked":
            return self._on_lock(state)
        if kind == "ended":
            verdict, how = seen[1], seen[2]
            self._read_to_the_end()
            if self.tracker.tolerate(verdict):
                self.notes.append("invocation %s %s; following the next one (%s of %s tolerated restarts)" % (
                    self.tracker.after, how, self.tracker.deaths, self.tracker.crash_loop_restarts))
                self._reset_invocation()
                return None
            return self._ended(verdict, how)
        return None

    def _on_lock(self, state):
        name = "invocation" if self.tracker.verify_only else "new_invocation"
        self._mark(name, invocation_id=state.invocation_id, process_start=state.start_timestamp or None,
                   main_pid=state.main_pid)
        self._event(name, "%s %s, main PID %s" % ("running invocation" if self.tracker.verify_only
                                                  else "new invocation", state.invocation_id, state.main_pid))
        self.phase = "invocation %s started; reading its journal" % state.invocation_id
        if self.tracker.verify_only:
            self._look_back()
            return None
        outcome = self._restarts_before_first_look()
        if outcome is None:
            self._open_follower(from_start=True)
        return outcome

    def _restarts_before_first_look(self):
        """Every restart systemd made since the invocation this wait was told to wait past ended counts,
        however late the wait first looked: a new process that crashed and was restarted (Restart=)
        before then is a crash loop, not a fresh start to lock onto."""
        if not self.tracker.after:
            return None  # a first start: no earlier invocation to count restarts from
        try:
            restarts = self.host.restarts_since(self.tracker.after)
        except JournalError as exc:
            self.notes.append("could not read systemd's restarts of %s: %s" % (self.unit, exc))
            return None
        if not restarts:
            return None
        crashed = [item["invocation_id"] for item in restarts]
        self.tracker.deaths += len(restarts)
        if self.tracker.deaths <= self.tracker.crash_loop_restarts:
            self.notes.append("invocation(s) %s exited and systemd restarted them before this wait first looked; "
                              "following %s (%s of %s tolerated restarts)" % (
                                  ", ".join(crashed), self.tracker.invocation_id, self.tracker.deaths,
                                  self.tracker.crash_loop_restarts))
            return None
        try:
            self.tail.clear()
            self.tail.extend(redact_text(line) for line in self.host.tail(crashed[0], self.policy.tail_lines))
        except JournalError as exc:
            self.notes.append("could not read the journal of invocation %s: %s" % (crashed[0], exc))
        self.journal_tail = list(self.tail)
        how = ("exited, and systemd restarted it %s before this wait first looked (%s; now invocation %s): crash loop"
               % ("once" if len(restarts) == 1 else "%s times" % len(restarts), restarts[-1]["message"],
                  self.tracker.invocation_id))
        return Outcome(CRASH_LOOP, msgs.ended_message(self.unit, crashed[0], how, self.elapsed(), "starting",
                                                      self.journal_tail, None, msgs.likely_cause(self.journal_tail)))

    def _reset_invocation(self):
        if self.follower is not None:
            self.follower.close()
            self.follower = None
        self.log = StartupLog()
        self.cursor = self.own_cursor = None
        self.tail.clear()
        for name in ("new_invocation", "config_line", "port_open", "generate"):
            self.phases.pop(name, None)
        self.generate = self.settle_since = self.missing_since = self.poked_at = self.listener = self.launched = None
        self.evidence = self.receipt = None
        self.settled = False

    def _look_back(self):
        """A running invocation (no restart): its receipt, else its journal searched, not read whole."""
        # Where its journal ends BEFORE the search: a young invocation logs its first lines while we
        # search, and they must be read after it, not skipped (the first install has no previous
        # invocation to wait past: the wait starts here, maybe before SGLang logged anything).
        try:
            newest = self.host.last_cursor(self.tracker.invocation_id)
        except JournalError:
            newest = None
        found = look_back(self.host, self.tracker.invocation_id)
        self.log, self.receipt = found.log, found.receipt
        if found.note:
            self.notes.append(found.note)
        for entry in found.entries:
            if not entry.from_systemd:
                self.tail.append(redact_text(entry.message))
        if found.entries and not self._startup_done() and found.entries[-1].cursor:
            self.cursor = self.own_cursor = found.entries[-1].cursor  # still starting up: follow on from there
            self._open_follower(from_start=False)
        else:
            # follow on from where its journal ended before the search (from its first entry when it had
            # logged nothing): what it logs while we search is read, never skipped (a line read twice
            # counts once)
            self.cursor = self.own_cursor = newest
            self._open_follower(from_start=newest is None)
        lines = self._lines()
        if lines:
            self._mark("config_line", logged_at=lines[0].get("timestamp"))

    # --- the journal ---------------------------------------------------------------------

    def _open_follower(self, from_start, from_now=False):
        self.follower = self.host.follower(self.tracker.invocation_id, cursor=None if from_now else self.cursor,
                                           from_start=from_start and not self.cursor)

    def _startup_done(self):
        return self.receipt is not None or self.log.after_config_seen

    def _read_journal(self, timeout):
        if self.follower is None:
            # Lines already read are behind the cursor; without one, only a running invocation
            # whose startup is already known may skip what it logged (the next slice must not
            # lose what was logged between two slices).
            skip = self.cursor is None and self.tracker.verify_only and self._startup_done()
            self._open_follower(from_start=self.cursor is None and not skip, from_now=skip)
        try:
            entries = self.follower.read(timeout)
        except JournalError as exc:
            self.phase = "%s (last error: %s)" % (self.phase.split(" (last error")[0], exc)
            self.follower = None  # started again from the cursor on the next poll
            self.host.sleep(max(0.0, min(self.policy.tick, self.remaining())))
            return None
        if self.follower.cursor:
            self.cursor = self.follower.cursor
        known_lines = len(self.log.config_lines)
        self.log.feed(entries)
        for entry in entries:
            if entry.from_systemd:
                self._force_state = True
            else:
                self.tail.append(redact_text(entry.message))
                self.own_cursor = entry.cursor or self.own_cursor
        for phase, detail in self.log.take_events():
            if self.generate is None or phase == "draft_runner":  # after the first answer: only what matters
                self._event(phase, describe_phase(phase, detail),
                            phase_change=detail is None or phase == "draft_runner")
        if len(self.log.config_lines) > known_lines:
            first = self.log.config_lines[0]
            self._mark("config_line", logged_at=first.get("timestamp"))
            items = ev.mismatches(self.intent.expect, self.intent.mode, self.log.config_lines)
            if items:
                return self._config_mismatch(items)
            self.phase = "config line agrees; waiting for /generate" if self.intent.expect else \
                "config line logged; waiting for /generate"
        return None

    def _read_tail(self):
        try:
            messages = self.host.tail(self.tracker.invocation_id, self.policy.tail_lines)
            if messages:
                self.tail.clear()
                self.tail.extend(redact_text(message) for message in messages)
        except JournalError as exc:
            self.notes.append("could not read the journal of invocation %s: %s" % (self.tracker.invocation_id, exc))

    def _read_to_the_end(self):
        """Before judging a death: the invocation's journal up to its end, so the phase and the last lines
        come from what it logged, not from where the wait happened to be (a slice starts without a follower;
        a process may die before its first line was read)."""
        if self.follower is None:
            if self.cursor is None and (self.tracker.verify_only or not self.log.lines_seen):
                if not self.log.lines_seen:
                    self._read_landmarks()
                self._read_tail()
                return
            self._open_follower(from_start=self.cursor is None)
        self._drain_journal()

    def _read_landmarks(self):
        """The startup landmarks of an invocation that was never followed (a bounded search)."""
        try:
            entries = self.host.grep(self.tracker.invocation_id)
        except JournalError as exc:
            self.notes.append("could not search the journal of invocation %s: %s" % (self.tracker.invocation_id, exc))
            return
        if entries:
            self.log.feed(entries)
            self.log.take_events()

    def _drain_journal(self):
        """After a death: the last lines and systemd's exit notes, with a short grace to flush."""
        if self.follower is None:
            return
        deadline = self.host.clock() + FLUSH_SECONDS
        while self.host.clock() < deadline:
            try:
                entries = self.follower.read(min(self.policy.tick, max(0.0, deadline - self.host.clock())))
            except JournalError:
                self._read_tail()
                return
            self.log.feed(entries)
            for entry in entries:
                if not entry.from_systemd:
                    self.tail.append(redact_text(entry.message))
            if any(entry.from_systemd and ("Failed with result" in entry.message or "Deactivated" in entry.message
                                           or "Scheduled restart" in entry.message) for entry in entries):
                return
        self.log.take_events()

    # --- readiness -----------------------------------------------------------------------

    def _probe_generate(self):
        remaining = self.remaining()
        if not self.host.port_open(min(1.0, max(remaining, 0.1))):
            self.phase = "%s; port not open yet" % self.log.describe()
            return None
        if "port_open" not in self.phases:
            self._mark("port_open")
            self._event("port_open", "port open")
        listener = self.host.listener(self.state.control_group if self.state else "", self.tracker.main_pid)
        if listener is not None:
            self.listener = listener
            if listener["verdict"] != "inside":
                return Outcome(FOREIGN_LISTENER, listener["message"])
        resp = self.host.generate(min(self.policy.request_timeout, max(remaining, 0.1)))
        if resp.kind == "http" and resp.status in (401, 403):
            return Outcome(UNAUTHORIZED, "%s answers /generate with HTTP %s: the api_key does not match the server's "
                           "--api-key" % (self.unit, resp.status))
        ok, text, meta = generate_verdict(resp)
        if not ok:
            self.phase = "port open, /generate not answering yet (%s%s)" % (
                resp.describe(), ": " + resp.body[:EXCERPT_CHARS] if resp.kind == "http" and resp.body else "")
            return None
        self.generate = {"status": resp.status, "text": text[:EXCERPT_CHARS], "meta_info": meta}
        self._mark("generate")
        self._event("generate", "/generate answered (%s tokens%s)" % (
            meta.get("completion_tokens", "?"), ", accept length %s" % meta["spec_accept_length"]
            if meta.get("spec_accept_length") is not None else ""))
        self.settle_since = self.elapsed()
        return self._conclude()

    # --- the verdict ---------------------------------------------------------------------

    def _conclude(self):
        outcome = self._judge_evidence()
        if outcome is not None:
            return None if outcome is WAITING else outcome
        if self.launched is None:
            outcome = self._check_launched()
            if outcome is not None:
                return None if outcome is WAITING else outcome
        if not self.settled and self.policy.min_ready_seconds > 0:
            if self._credited_settle():
                self.settled = True
            else:
                waited = self.elapsed() - self.settle_since
                if waited < self.policy.min_ready_seconds:
                    text = "settling: serving for %.1fs of min_ready_seconds %.0f (no restart, no death)" % (
                        waited, self.policy.min_ready_seconds)
                    if not self.phase.startswith("settling"):
                        self._event("settling", text)
                    self.phase = text
                    return None
                resp = self.host.generate(min(self.policy.request_timeout, max(self.remaining(), 0.1)))
                ok, dummy, dummy = generate_verdict(resp)
                if not ok:
                    return Outcome(UNSTABLE, "%s: invocation %s answered /generate, but no longer after %.1fs of "
                                   "min_ready_seconds (%s)" % (self.unit, self.tracker.invocation_id, waited,
                                                               resp.describe()))
                self.settled = True
        if not self.verified:
            return Outcome(PASS, "%s: invocation %s is serving, UNVERIFIED (accepted by accept_unverified): %s" % (
                self.unit, self.tracker.invocation_id, self.notes[-1] if self.notes else "no evidence"), ok=True)
        compared = msgs.compared_text(self.intent, self.evidence, len(self._lines()),
                                      bool(self.launched and self.launched.get("command_checked")),
                                      bool(self.launched and self.launched.get("environment_checked")))
        settle = " and stayed up for min_ready_seconds %.0f" % self.policy.min_ready_seconds \
            if self.policy.min_ready_seconds > 0 else ""
        return Outcome(PASS, "%s: invocation %s is serving (%s; /generate answered after %.1fs%s)" % (
            self.unit, self.tracker.invocation_id, compared, self.phases.get("generate", {}).get("elapsed", 0.0),
            settle), ok=True)

    def _credited_settle(self):
        """A running invocation verified before (a receipt of it) has been up since then."""
        if not self.receipt:
            return False
        since = self.host.wall() - float(self.receipt.get("verified_at") or 0)
        return since >= self.policy.min_ready_seconds

    def _lines(self):
        """Every config line to judge: those the receipt kept (for a start the journal may no longer
        hold), then those read from the journal after it."""
        kept = list(self.receipt.get("config_lines") or []) if self.receipt else []
        cursors = set(line.get("cursor") for line in kept)
        return kept + [line for line in self.log.config_lines if line.get("cursor") not in cursors]

    def _source(self):
        if self.receipt is None:
            return "journal"
        return "receipt+journal" if self.log.config_lines else "receipt"

    def _judge_evidence(self):
        """None when the config-line evidence is settled, WAITING to look again, or a final Outcome."""
        if self.evidence is not None or not self.verified:
            return None
        lines = self._lines()
        if lines:
            # Lines found by looking back (verify only) were never compared as they arrived.
            items = ev.mismatches(self.intent.expect, self.intent.mode, lines)
            if items:
                kept = len(self.receipt.get("config_lines") or []) if self.receipt else 0
                for item in items:
                    if item.get("occurrence", 0) <= kept:
                        item["where"] = "in the config line of invocation %s kept by its receipt (%s)" % (
                            self.tracker.invocation_id, self.host.receipt_path)
                self.evidence = self._source()  # what the mismatch rests on
                return self._config_mismatch(items)
            self.evidence = self._source()
            return None
        if self.receipt is not None:
            # A receipt without lines recorded a check that no draft-runner line was logged (mode absent),
            # and its journal holds none since.
            if self.intent.mode == ev.REQUIRED:
                return Outcome(MISSING_CONFIG_LINE, (
                    "%s: the receipt of invocation %s (%s) records a verification that it logged no config line, "
                    "its journal holds none since, and its start is no longer needed to tell: expected %s" % (
                        self.unit, self.tracker.invocation_id, self.host.receipt_path, self.intent.expect)))
            self.evidence = "receipt"
            return None
        if self.intent.mode == ev.OPTIONAL:
            self.evidence = "none"
            return None
        notices = self._suppression_notices()
        completeness = ev.journal_completeness(self.log.start_seen, self.log.after_config_seen, notices)
        if completeness == ev.CONCLUSIVE:
            if self.intent.mode == ev.ABSENT:
                self.evidence = "journal"
                return None
            return Outcome(MISSING_CONFIG_LINE, (
                "%s: invocation %s logged no config line ('Initialized DFLASH draft runner' / 'Initialized DDTree "
                "worker', rank 0) although /generate answers and its journal is complete around where the line "
                "belongs (its start and later lines are there, journald dropped nothing): the draft runner did not "
                "start as intended; expected %s" % (self.unit, self.tracker.invocation_id, self.intent.expect)))
        if completeness == ev.INCOMPLETE:
            if self.missing_since is None:
                self.missing_since = self.elapsed()
            waited = self.elapsed() - self.missing_since
            if waited < self.policy.journal_grace:
                self._poke()
                self.phase = ("/generate answers; waiting for a line logged after the config line's place, or "
                              "journald's suppression notice (%.0fs of journal_grace %.0f)" % (
                                  waited, self.policy.journal_grace))
                return WAITING
        return self._unverified(self._completeness_reason(completeness, notices), notices)

    def _completeness_reason(self, completeness, notices):
        # A start that is not in the journal: retention, or a journald that keeps nothing (Storage=none).
        storage = self.host.journal_storage() if completeness == ev.NO_START else None
        return msgs.completeness_reason(completeness, notices, self.unit, self.tracker.invocation_id,
                                        self.host.receipt_dir, storage)

    def _poke(self):
        """journald writes its "Suppressed N messages" notice only when the unit logs again after the
        rate-limit interval, and an idle server logs nothing: a /generate (its access-log line) is that line."""
        now = self.elapsed()
        if self.poked_at is not None and now - self.poked_at < POKE_SECONDS:
            return
        self.poked_at = now
        self.host.generate(min(self.policy.request_timeout, max(self.remaining(), 0.1)))

    def _unverified(self, reason, notices):
        if notices:
            self.suppression = {"messages_dropped": sum(n.get("count") or 0 for n in notices),
                                "notices": [n.get("message") for n in notices]}
        if self.policy.accept_unverified:
            self.verified = False
            self.evidence = "none"
            self.notes.append("UNVERIFIED, accepted (accept_unverified): " + reason)
            return None
        return Outcome(UNVERIFIED, msgs.unverified_message(self.unit, self.tracker.invocation_id, reason, self.intent))

    def _suppression_notices(self):
        since = self.state.start_timestamp if self.state is not None else None
        try:
            return self.host.suppressed(self.tracker.invocation_id, since) or []
        except JournalError as exc:
            self.notes.append("could not look for journald suppression notices: %s" % exc)
            return []

    def _check_launched(self):
        """What runs is what was intended: the main process's argv and environment, the effective unit."""
        differences = self._launch_differences()
        if differences is WAITING:
            self._force_state = True
            return WAITING
        if differences:
            return Outcome(MISMATCH, self._mismatch_text(differences))
        return None

    def _config_mismatch(self, items):
        """A config line disagrees: say also what the command line and environment show (a drop-in that
        launched other arguments is named), so the message points at the cause, not only the symptom."""
        if self.launched is None:
            differences = self._launch_differences()
            if differences is not WAITING:
                items = list(items) + differences
        return Outcome(MISMATCH, self._mismatch_text(items))

    def _mismatch_text(self, items):
        text = msgs.mismatch_message(self.unit, self.tracker.invocation_id, items, self._flag_in_unit)
        if self.launched and self.launched.get("drop_in_paths"):
            text += "; drop-ins of %s: %s" % (self.unit, ", ".join(self.launched["drop_in_paths"]))
        return text

    def _launch_differences(self):
        """Differences of the main process's argv and environment (and the effective unit's) from the
        intent; sets ``launched``. WAITING while the command line cannot be read yet (inside exec)."""
        intent = self.intent
        launched = {"command_checked": False, "environment_checked": False, "drop_in_paths": []}
        if intent.command is None and intent.environment is None:
            self.launched = launched
            return []
        pid = self.tracker.main_pid
        differences = []
        if intent.command is not None:
            argv = self.host.cmdline(pid)
            if argv is None:
                return WAITING
            found, notes = command_differences(intent.command, argv)
            for item in found:
                item.update(where="on the command line of its main process %s" % pid, plain=True)
                differences.append(item)
            self.notes.extend("main process %s: %s" % (pid, note) for note in notes)
            launched["command_checked"] = True
            launched["command"] = redact(argv)
        effective = None
        if intent.environment is not None:
            try:
                effective = self.host.effective()
            except SystemdError as exc:
                self.notes.append("could not read the effective unit: %s" % exc)
            if effective is not None:
                for item in compare_environment(intent.environment, effective.environment):
                    item.update(where="in the effective Environment= of %s" % self.unit, plain=True)
                    differences.append(item)
                launched["drop_in_paths"] = effective.drop_in_paths
            running = self.host.environ(pid, list(intent.environment))
            if running is None:
                self.notes.append("could not read the environment of main process %s (run with become)" % pid)
            else:
                for item in compare_environment(intent.environment, running):
                    item.update(where="in the environment of its main process %s" % pid, plain=True)
                    differences.append(item)
            launched["environment_checked"] = running is not None or effective is not None
        self.launched = launched
        return differences

    def _flag_in_unit(self, key):
        flags = self.host.flags_for_key(key)
        if not flags:
            return "no unit flag known for %s" % key
        argv = self.intent.command
        if argv is None:
            try:
                effective = self.host.effective()
                argv = effective.exec_start[0] if effective.exec_start else []
            except SystemdError:
                argv = []
        for flag in flags:
            if flag in argv:
                index = argv.index(flag)
                value = argv[index + 1] if index + 1 < len(argv) else ""
                return "%s %s in %s" % (flag, value, self.unit)
        return "no %s in %s's ExecStart" % (" / ".join(flags), self.unit)

    # --- endings -------------------------------------------------------------------------

    def _ended(self, verdict, how):
        self.journal_tail = list(self.tail)
        phase = self.log.describe() if self.log.lines_seen else self.phase
        if self.generate is not None:
            phase = "settling after its first good /generate" if self.policy.min_ready_seconds > 0 else "serving"
        exit_info = self.log.exit  # systemd's notes about this invocation, from its journal
        if self.state is not None and self.state.crashed and self.state.invocation_id == self.tracker.invocation_id:
            exit_info = self.state.how_it_ended()
        if exit_info and exit_info in how:
            exit_info = None  # said already
        return Outcome(verdict, msgs.ended_message(self.unit, self.tracker.invocation_id, how, self.elapsed(), phase,
                                                   self.journal_tail, exit_info, msgs.likely_cause(self.journal_tail)))

    def _timeout(self):
        if self.generate is not None and self.missing_since is not None:
            notices = self._suppression_notices()
            completeness = ev.journal_completeness(self.log.start_seen, self.log.after_config_seen, notices)
            outcome = self._unverified(self._completeness_reason(completeness, notices), notices)
            if outcome is not None:
                return outcome
        last_line = self.tail[-1] if self.tail else None
        state = self.state.describe() if self.state is not None else "unknown"
        return Outcome(TIMEOUT, "timed out after %.1fs waiting for %s: last phase: %s; unit %s; last journal line: %s" % (
            self.elapsed(), self.unit, self.phase, state,
            repr(last_line) if last_line is not None else "(none seen for this invocation)"))

    def _finish(self, outcome):
        lines = self._lines()
        if outcome.verdict == PASS and self.verified and self.policy.write_receipt and \
                ev.compared_anything(self.intent.mode, self.intent.expect, lines) and \
                (self.receipt is None or self.log.config_lines):
            receipt = ev.make_receipt(self.unit, self.tracker.invocation_id, self.tracker.main_pid, self.intent.expect,
                                      self.intent.mode, lines,
                                      redact(self.intent.command) if self.intent.command else None, self.host.wall(),
                                      journal_cursor=self.own_cursor)
            try:
                self.host.write_receipt(receipt)
                self.receipt_written = self.host.receipt_path
            except (IOError, OSError) as exc:
                self.notes.append("could not write the verification receipt %s: %s" % (self.host.receipt_path, exc))
        return outcome

    # --- what the module returns ---------------------------------------------------------

    def to_state(self):
        """Everything the next slice needs (JSON-serialisable, no secrets)."""
        return {"tracker": self.tracker.to_state(), "log": self.log.to_state(), "cursor": self.cursor,
                "own_cursor": self.own_cursor,
                "tail": list(self.tail), "phases": self.phases, "phase": self.phase, "generate": self.generate,
                "settle_since": self.settle_since, "settled": self.settled, "missing_since": self.missing_since,
                "poked_at": self.poked_at,
                "notes": self.notes, "listener": self.listener, "launched": self.launched,
                "evidence": self.evidence, "receipt": self.receipt, "verified": self.verified,
                "elapsed": self.elapsed()}

    def observed(self):
        lines = self._lines()
        return lines[-1]["values"] if lines else None

    def result(self):
        lines = [line.get("line") for line in self._lines()]
        return {
            "invocation_id": self.tracker.invocation_id,
            "main_pid": self.tracker.main_pid,
            "unit_state": self.state.as_dict() if self.state is not None else None,
            "expected": self.intent.expect,
            "config_line_mode": self.intent.mode,
            "observed": self.observed(),
            "config_line": lines[-1] if lines else None,
            "config_lines": lines,
            "source": self.evidence if self.evidence in ("journal", "receipt", "receipt+journal") else None,
            "verified": self.verified and self.evidence is not None,
            "elapsed": self.elapsed(),
            "phases": self.phases,
            "phase": self.phase,
            "generate": self.generate,
            "listener": self.listener,
            "launched": self.launched,
            "journal_tail": self.journal_tail,
            "suppression": self.suppression,
            "receipt": self.receipt_written,
            "notes": self.notes,
            "events": self.events,
        }
