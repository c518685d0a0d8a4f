# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Judge the wait for an SGLang unit's new process from what the host showed: one pure function.

Private to this collection: no compatibility promise. Pure: no I/O, no clock.

``judge(snapshot)`` answers as kubectl's rollout status functions do: a verdict, a message and
whether the wait is done. A wait that is not done also learns what to look at next
(``Judgement.look``: follow the new invocation, read its journal to the end, probe the port, send
``/generate``, read the command line, look for journald's suppression notices, ...). The loop
(_wait) does every read, keeps what it saw in the next ``Snapshot`` and asks again. Each verdict of
the README's verification contract is one branch below, in the order they are judged:

- which invocation (``not_found``, ``not_active``, waiting for a new one);
- restarts by systemd before the first look, deaths and restarts of the followed one
  (``crash_loop``, ``died``, ``replaced``);
- every config line against the intent (``mismatch``), as soon as it is read;
- readiness: the port, who listens on it (``foreign_listener``), ``/generate`` (``unauthorized``);
  a follower node of a serving group (``Intent.follower``): its own journal's line that it joined;
- the evidence once it answers (``missing_config_line``, ``unverified``), then what runs (``mismatch``);
- settle (``unstable``), then ``pass``; ``timeout`` when time is out and nothing else is due.
"""
from __future__ import annotations

import os

from dataclasses import dataclass, field, replace
from types import MappingProxyType

from ansible_collections.gpufleet.inference.plugins.module_utils import _evidence as ev
from ansible_collections.gpufleet.inference.plugins.module_utils import _messages as msgs
from ansible_collections.gpufleet.inference.plugins.module_utils._http import HTTP
from ansible_collections.gpufleet.inference.plugins.module_utils._probe import generate_verdict
from ansible_collections.gpufleet.inference.plugins.module_utils._process import (
    command_differences,
    compare_environment,
    redact,
)

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
WAITING = "waiting"  # not done: the loop looks again (a slice that ends here returns its state)
ENDED = (DIED, CRASH_LOOP, REPLACED)  # verdicts that quote the invocation's last journal lines

# What the loop looks at when the judge asks (Judgement.look); each at most once per look at the host.
FOLLOW = "follow"              # lock onto the invocation the unit shows: its restarts since `after`, or its past
FOLLOW_NEXT = "follow_next"    # a tolerated restart by systemd: wait for the next invocation instead
READ_TO_END = "read_to_end"    # the followed invocation ended: its journal up to systemd's exit notes
CRASHED_TAIL = "crashed_tail"  # the last lines of the invocation that crashed before the first look
PORT = "port"                  # a TCP connect
LISTENER = "listener"          # who owns the listening socket
GENERATE = "generate"          # POST /generate, until the first good answer
LAUNCH = "launch"              # the main process's command line and environment, the effective unit
UNIT_FLAGS = "unit_flags"      # the unit's flags for the expected keys (to name them in a mismatch)
NOTICES = "notices"            # journald's "Suppressed N messages" notices about the invocation
STORAGE = "storage"            # journald's Storage= (a start missing from the journal: retention or none)
POKE = "poke"                  # a /generate so that an idle server logs a line (journald then writes its notice)
SETTLE_PROBE = "settle_probe"  # the /generate at the end of min_ready_seconds
UNIT = "unit"                  # systemd's view first (at the next look), before anything else

ACCEPTED = "unverified"        # Snapshot.evidence of an invocation accepted without evidence
ACCEPTED_NOTE = "UNVERIFIED, accepted (accept_unverified): "


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


@dataclass(frozen=True)
class Launch:
    """What runs, against the intent: differences, notes worth keeping, and the report (`launched`)."""
    differences: tuple = ()
    notes: tuple = ()
    launched: dict = field(default_factory=dict)


@dataclass(frozen=True)
class UnitFlags:
    """The unit's flags for each expected key, and the command line the unit runs."""
    flags: dict = field(default_factory=dict)
    argv: tuple = ()


@dataclass(frozen=True)
class Snapshot:
    """What the host showed so far; the loop builds one per judgement and never changes it."""
    unit: str = "sglang.service"
    intent: ev.Intent = field(default_factory=ev.Intent)
    policy: Policy = field(default_factory=Policy)
    # which invocation
    after: str | None = None            # the invocation waited past; None verifies the running one
    invocation_id: str | None = None    # the invocation followed (None: none yet)
    baseline_restarts: int = 0          # systemd's NRestarts when it was first followed
    deaths: int = 0                     # restarts by systemd counted since `after` (tolerated ones included)
    unit_state: object = None           # _systemd.UnitState at the last look, None before the first
    unit_stale: bool = False            # systemd logged about the invocation after that look
    last_error: str | None = None       # why the last read of systemd or the journal failed
    # what its journal (or a receipt of its earlier verification) showed
    journal_lines: tuple = ()           # its rank-0 config lines from the journal (dicts of _config_line)
    receipt: dict | None = None         # the receipt of this invocation's verification, if any
    receipt_path: str = ev.receipt_path("/var/lib/gpufleet-inference/receipts", "sglang.service")
    start_seen: bool = False            # its first line (server_args=) is in the journal
    after_config_seen: bool = False     # a line SGLang logs after the config line's place is in the journal
    lines_seen: int = 0
    joined_at: float | None = None      # when a follower node logged that it joined its group (host's epoch)
    startup: str = "starting"           # its startup phase in words
    exit_info: str | None = None        # how it ended, from systemd's notes in its journal
    stop_job: str | None = None         # stop/restart: PID 1 logged a job stopping it (asked for, not a crash)
    tail: tuple = ()                    # its last lines (the crashed one's, after CRASHED_TAIL)
    # what the wait established
    generate: dict | None = None        # the first good /generate answer
    generate_elapsed: float | None = None
    launched: dict | None = None        # what runs was checked (Launch.launched)
    evidence: str | None = None         # journal, receipt, receipt+journal, none (nothing to compare), ACCEPTED
    notes: tuple = ()
    phase: str = "starting"             # the wait's phase in words at the last judgement
    elapsed: float = 0.0
    wall: float = 0.0                   # the host's clock (receipts carry it)
    looks: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))  # look -> what it saw, this time

    @property
    def verify_only(self):
        return self.after is None

    @property
    def lines(self):
        return ev.judged_lines(self.receipt, self.journal_lines)


@dataclass(frozen=True)
class Judgement:
    """A verdict and its message; when not done, what to look at next and what was established."""
    verdict: str
    message: str
    done: bool = False
    look: str | None = None             # what the loop looks at next (None: keep watching)
    evidence: str | None = None         # the evidence source established (the loop keeps it)
    note: str | None = None             # worth knowing about how the result was reached
    event: tuple | None = None          # (phase, text): a progress event

    @property
    def ok(self):
        return self.verdict in (PASS, WAITING)


def judge(snap):
    """The verdict on what the host showed (a Judgement)."""
    judgement = _progress(snap)
    looking = judgement.look not in (None, UNIT) and judgement.look not in snap.looks
    if judgement.done or looking or snap.elapsed < snap.policy.timeout - 0.001:
        return judgement  # float clocks may never reach the deadline exactly
    return _timed_out(snap, judgement)


def _progress(snap):
    for branch in (_unit_known, _which_invocation, _restarts_before_first_look, _ending, _agreement,
                   _systemd_first, _readiness, _evidence, _launch, _settle):
        judgement = branch(snap)
        if judgement is not None:
            return judgement
    return _passed(snap)


def _watching(snap, message=None, **kwargs):
    return Judgement(WAITING, message or snap.phase, **kwargs)


def _done(verdict, message, **kwargs):
    return Judgement(verdict, message, done=True, **kwargs)


def _ask(snap, look, message=None):
    """Look at `look` unless it was looked at for this judgement already (then at the next look)."""
    return _watching(snap, message, look=None if look in snap.looks else look)


# --- which invocation --------------------------------------------------------------------------

def _unit_known(snap):
    return _watching(snap) if snap.unit_state is None else None


def _which_invocation(snap):
    state = snap.unit_state
    if not state.exists:
        return _done(NOT_FOUND, "unit %s not found (LoadState=%s)" % (snap.unit, state.load_state or "?"))
    if snap.invocation_id:
        return None
    if snap.verify_only:
        # a unit someone stopped is not running, not dead: only a crashed one has an end to explain
        if state.invocation_id and (state.running or (state.crashed and not state.stopped)):
            return _ask(snap, FOLLOW)
        return _done(NOT_ACTIVE, "%s is not running: %s" % (snap.unit, state.describe()))
    if state.invocation_id and state.invocation_id != snap.after:
        return _ask(snap, FOLLOW)
    event = None if snap.phase.startswith("waiting for a new invocation") else (
        "waiting", "old invocation %s still %s/%s (draining)" % (
            state.invocation_id or "none", state.active_state, state.sub_state))
    return _watching(snap, "waiting for a new invocation of %s (still %s, %s/%s)" % (
        snap.unit, state.invocation_id or "none", state.active_state, state.sub_state), event=event)


def _restarts_before_first_look(snap):
    """Every restart systemd made since the invocation the wait was told to wait past counts, however
    late the wait first looked: a new process that crashed and was restarted (Restart=) before then is
    a crash loop, not a fresh start to lock onto."""
    restarts = snap.looks.get(FOLLOW)
    if not restarts:
        return None
    crashed = [item["invocation_id"] for item in restarts]
    if snap.deaths <= snap.policy.crash_loop_restarts:
        note = ("invocation(s) %s exited and systemd restarted them before this wait first looked; following %s "
                "(%s of %s tolerated restarts)" % (", ".join(crashed), snap.invocation_id, snap.deaths,
                                                   snap.policy.crash_loop_restarts))
        return None if note in snap.notes else _watching(snap, note=note)
    if CRASHED_TAIL not in snap.looks:
        return _watching(snap, look=CRASHED_TAIL)
    how = ("exited, and systemd restarted it %s before this wait first looked (%s; now invocation %s): crash loop"
           % ("once" if len(restarts) == 1 else "%s times" % len(restarts), restarts[-1]["message"],
              snap.invocation_id))
    return _done(CRASH_LOOP, msgs.ended_message(snap.unit, crashed[0], how, snap.elapsed, "starting", snap.tail,
                                                None, msgs.likely_cause(snap.tail)))


def _death(state):
    """A main process that ended: systemd restarting it (Restart=) is a crash loop, else it died."""
    return CRASH_LOOP if state.sub_state.startswith("auto-restart") else DIED


def _how_it_ended(snap):
    """(verdict, how) when the followed invocation no longer runs, else None."""
    state = snap.unit_state
    if FOLLOW in snap.looks and state.crashed:  # it had ended when the wait first saw it
        return _death(state), "%s (%s/%s, %s)" % (
            "is not running" if snap.verify_only else "ended before it could be checked",
            state.active_state, state.sub_state, state.how_it_ended())
    if state.invocation_id != snap.invocation_id:
        if state.n_restarts > snap.baseline_restarts or state.crashed:
            return CRASH_LOOP, "was replaced by invocation %s (restarted by systemd: crash loop)" % (
                state.invocation_id or "none")
        return REPLACED, ("was replaced by invocation %s although systemd did not restart it (NRestarts %s): "
                          "someone or something else restarted %s" % (state.invocation_id or "none",
                                                                      state.n_restarts, snap.unit))
    if state.sub_state.startswith("auto-restart"):
        return CRASH_LOOP, "exited (%s) and systemd is restarting it (Restart=, crash loop)" % state.how_it_ended()
    if state.n_restarts > snap.baseline_restarts:
        return CRASH_LOOP, "was restarted by systemd (NRestarts %s -> %s, crash loop)" % (
            snap.baseline_restarts, state.n_restarts)
    if state.crashed:
        return DIED, "ended (%s/%s, %s)" % (state.active_state, state.sub_state, state.how_it_ended())
    return None


def _ending(snap):
    ended = _how_it_ended(snap)
    if ended is None:
        return None
    verdict, how = ended
    if verdict == CRASH_LOOP and snap.deaths < snap.policy.crash_loop_restarts:
        return _watching(snap, look=FOLLOW_NEXT, note="invocation %s %s; following the next one (%s of %s "
                         "tolerated restarts)" % (snap.invocation_id, how, snap.deaths + 1,
                                                  snap.policy.crash_loop_restarts))
    if READ_TO_END not in snap.looks:
        return _watching(snap, look=READ_TO_END)
    if verdict == DIED and snap.stop_job:
        stopped = "stopped by a %s job of systemd (systemctl %s, or a shutdown), not crashed" % (
            snap.stop_job, snap.stop_job)
        if snap.verify_only:
            return _done(NOT_ACTIVE, "%s is not running: %s (invocation %s, %s)" % (
                snap.unit, stopped, snap.invocation_id, snap.unit_state.how_it_ended()))
        how = "%s: %s" % (how, stopped)
    phase = snap.startup if snap.lines_seen else snap.phase
    if snap.generate is not None:
        phase = "settling after its first good /generate" if snap.policy.min_ready_seconds > 0 else "serving"
    state = snap.unit_state
    exit_info = state.how_it_ended() if state.crashed and state.invocation_id == snap.invocation_id \
        else snap.exit_info
    if exit_info and exit_info in how:
        exit_info = None  # said already
    return _done(verdict, msgs.ended_message(snap.unit, snap.invocation_id, how, snap.elapsed, phase, snap.tail,
                                             exit_info, msgs.likely_cause(snap.tail)))


# --- what it runs --------------------------------------------------------------------------------

def _agreement(snap):
    """Every config line of the invocation agrees with the intent, the moment it is read."""
    lines = snap.lines
    items = ev.mismatches(snap.intent.expect, snap.intent.mode, lines)
    if not items:
        return None
    kept = len(snap.receipt.get("config_lines") or []) if snap.receipt else 0
    for item in items:
        if item.get("occurrence", 0) <= kept:
            item["where"] = "in the config line of invocation %s kept by its receipt (%s)" % (
                snap.invocation_id, snap.receipt_path)
    # Say also what the command line and environment show: a drop-in that launched other arguments is
    # named, so the message points at the cause, not only the symptom.
    if snap.launched is None and LAUNCH not in snap.looks:
        return _watching(snap, look=LAUNCH)
    if any(item["key"] != "draft_runner" for item in items) and UNIT_FLAGS not in snap.looks:
        return _watching(snap, look=UNIT_FLAGS)
    launch = snap.looks.get(LAUNCH)
    items = items + list(launch.differences if launch is not None else ())
    return _done(MISMATCH, _mismatch_text(snap, items), evidence=ev.evidence_source(snap.receipt, snap.journal_lines))


def _mismatch_text(snap, items):
    unit_flags = snap.looks.get(UNIT_FLAGS) or UnitFlags()

    def flag_in_unit(key):
        flags = unit_flags.flags.get(key)
        if not flags:
            return "no unit flag known for %s" % key
        argv = list(unit_flags.argv)
        for flag in flags:
            if flag in argv:
                index = argv.index(flag)
                return "%s %s in %s" % (flag, argv[index + 1] if index + 1 < len(argv) else "", snap.unit)
        return "no %s in %s's ExecStart" % (" / ".join(flags), snap.unit)

    text = msgs.mismatch_message(snap.unit, snap.invocation_id, items, flag_in_unit)
    if snap.launched and snap.launched.get("drop_in_paths"):
        text += "; drop-ins of %s: %s" % (snap.unit, ", ".join(snap.launched["drop_in_paths"]))
    return text


def launch_check(intent, unit, pid, argv, effective=None, effective_error=None, running=None):
    """What runs against the intent (a Launch): `argv` the main process's command line (None when not
    intended), `effective` the effective unit (or `effective_error`), `running` its environment."""
    differences, notes = [], []
    launched = {"command_checked": False, "environment_checked": False, "drop_in_paths": []}
    if argv is not None:
        found, said = command_differences(intent.command, argv)
        differences += [dict(item, where="on the command line of its main process %s" % pid, plain=True)
                        for item in found]
        notes += ["main process %s: %s" % (pid, note) for note in said]
        launched.update(command_checked=True, command=redact(argv))
    if intent.environment is not None:
        if effective_error:
            notes.append("could not read the effective unit: %s" % effective_error)
        if effective is not None:
            differences += [dict(item, where="in the effective Environment= of %s" % unit, plain=True)
                            for item in compare_environment(intent.environment, effective.environment)]
            launched["drop_in_paths"] = effective.drop_in_paths
        if running is None:
            notes.append("could not read the environment of main process %s (run with become)" % pid)
        else:
            differences += [dict(item, where="in the environment of its main process %s" % pid, plain=True)
                            for item in compare_environment(intent.environment, running)]
        launched["environment_checked"] = running is not None or effective is not None
    return Launch(tuple(differences), tuple(notes), launched)


def _systemd_first(snap):
    """systemd logged about the invocation (it started, exited, is restarting): hear it out first."""
    return _watching(snap) if snap.unit_stale else None


def _launch(snap):
    """What runs is what was intended: the main process's argv and environment, the effective unit."""
    launch = snap.looks.get(LAUNCH)
    if launch is not None and launch.differences:
        return _done(MISMATCH, _mismatch_text(snap, list(launch.differences)))
    if snap.launched is not None:
        return None
    if LAUNCH not in snap.looks:
        return _watching(snap, look=LAUNCH)
    return _watching(snap, look=UNIT)  # its command line cannot be read yet (still inside exec)


# --- readiness and evidence ----------------------------------------------------------------------

def _readiness(snap):
    """The port, who listens on it, /generate: until the first good answer."""
    if snap.intent.follower:
        return _joined(snap)
    if snap.generate is not None:
        return None
    if PORT not in snap.looks:
        return _watching(snap, look=PORT)
    if not snap.looks[PORT]:
        return _watching(snap, "%s; port not open yet" % snap.startup)
    if LISTENER not in snap.looks:
        return _watching(snap, look=LISTENER)
    listener = snap.looks[LISTENER]
    if listener is not None and listener["verdict"] != "inside":
        return _done(FOREIGN_LISTENER, listener["message"])
    if GENERATE not in snap.looks:
        return _watching(snap, look=GENERATE)
    resp = snap.looks[GENERATE]
    if resp.kind == HTTP and resp.status in (401, 403):
        return _done(UNAUTHORIZED, "%s answers /generate with HTTP %s: the api_key does not match the server's "
                     "--api-key" % (snap.unit, resp.status))
    body = resp.body[:200] if resp.kind == HTTP and resp.body and resp.status < 400 else ""  # else described
    return _watching(snap, "port open, /generate not answering yet (%s%s)" % (resp.describe(), body and ": " + body))


def _joined(snap):
    """A follower serves nothing to probe (its stand-in /health proves only that its main process lives): it is
    ready once its own journal says every local scheduler is ready, i.e. it joined its serving group."""
    if snap.joined_at is not None:
        return None
    return _watching(snap, "%s; not joined its serving group yet" % snap.startup)


def _evidence(snap):
    """Once /generate answers: what the config-line evidence rests on (a mismatch was judged already)."""
    if snap.evidence is not None:
        return None
    if snap.intent.follower:
        return _watching(snap, evidence="journal")  # its own invocation's line that it joined
    if snap.lines:
        return _watching(snap, evidence=ev.evidence_source(snap.receipt, snap.journal_lines))
    if snap.receipt is not None:
        # A receipt without lines recorded a check that no draft-runner line was logged (mode absent),
        # and its journal holds none since.
        if snap.intent.mode == ev.REQUIRED:
            return _done(MISSING_CONFIG_LINE, (
                "%s: the receipt of invocation %s (%s) records a verification that it logged no config line, "
                "its journal holds none since, and its start is no longer needed to tell: expected %s" % (
                    snap.unit, snap.invocation_id, snap.receipt_path, snap.intent.expect)))
        return _watching(snap, evidence="receipt")
    if snap.intent.mode == ev.OPTIONAL:
        return _watching(snap, evidence="none")
    if NOTICES not in snap.looks:
        return _watching(snap, look=NOTICES)
    completeness = ev.journal_completeness(snap.start_seen, snap.after_config_seen, snap.looks[NOTICES])
    if completeness == ev.CONCLUSIVE:
        if snap.intent.mode == ev.ABSENT:
            return _watching(snap, evidence="journal")
        return _done(MISSING_CONFIG_LINE, (
            "%s: invocation %s logged no config line ('Initialized DFLASH draft runner' / 'Initialized DDTree "
            "worker', rank 0) although /generate answers and its journal is complete around where the line "
            "belongs (its start and later lines are there, journald dropped nothing): the draft runner did not "
            "start as intended; expected %s" % (snap.unit, snap.invocation_id, snap.intent.expect)))
    waited = snap.elapsed - snap.generate_elapsed
    if completeness == ev.INCOMPLETE and waited < snap.policy.journal_grace:
        # journald writes its "Suppressed N messages" notice only when the unit logs again after the
        # rate-limit interval, and an idle server logs nothing: a /generate (its access-log line) is that line.
        return _ask(snap, POKE, "/generate answers; waiting for a line logged after the config line's place, or "
                    "journald's suppression notice (%.0fs of journal_grace %.0f)" % (
                        waited, snap.policy.journal_grace))
    return _unverified(snap, completeness)


def _unverified(snap, completeness):
    """No evidence: the verdict unverified (or accepted with a note), naming why the journal cannot tell."""
    if completeness == ev.NO_START and STORAGE not in snap.looks:
        return _watching(snap, look=STORAGE)  # retention, or a journald that keeps nothing (Storage=none)
    reason = msgs.completeness_reason(completeness, snap.looks[NOTICES], snap.unit, snap.invocation_id,
                                      os.path.dirname(snap.receipt_path), snap.looks.get(STORAGE))
    if snap.policy.accept_unverified:
        return _watching(snap, evidence=ACCEPTED, note=ACCEPTED_NOTE + reason)
    return _done(UNVERIFIED, msgs.unverified_message(snap.unit, snap.invocation_id, reason, snap.intent))


# --- settle, pass, timeout ----------------------------------------------------------------------

def _settle(snap):
    """Stable before ok: same invocation, no restart, no death for min_ready_seconds, still answering."""
    need = snap.policy.min_ready_seconds
    if snap.intent.follower:
        joined = snap.wall - snap.joined_at
        if joined < need:
            text = "settling: joined its serving group %.1fs ago of min_ready_seconds %.0f (no restart, no death)" % (
                joined, need)
            return _watching(snap, text, event=None if snap.phase.startswith("settling") else ("settling", text))
        return None
    if need <= 0 or (snap.receipt and snap.wall - float(snap.receipt.get("verified_at") or 0) >= need):
        return None  # nothing to wait for, or verified (a receipt of it) at least that long ago
    waited = snap.elapsed - snap.generate_elapsed
    if waited < need:
        text = "settling: serving for %.1fs of min_ready_seconds %.0f (no restart, no death)" % (waited, need)
        return _watching(snap, text, event=None if snap.phase.startswith("settling") else ("settling", text))
    if SETTLE_PROBE not in snap.looks:
        return _watching(snap, look=SETTLE_PROBE)
    resp = snap.looks[SETTLE_PROBE]
    if not generate_verdict(resp)[0]:
        return _done(UNSTABLE, "%s: invocation %s answered /generate, but no longer after %.1fs of "
                     "min_ready_seconds (%s)" % (snap.unit, snap.invocation_id, waited, resp.describe()))
    return None


def _passed(snap):
    if snap.evidence == ACCEPTED:
        accepted = [note for note in snap.notes if note.startswith(ACCEPTED_NOTE)]
        return _done(PASS, "%s: invocation %s is serving, UNVERIFIED (accepted by accept_unverified): %s" % (
            snap.unit, snap.invocation_id, accepted[-1] if accepted else "no evidence"))
    launched = snap.launched or {}
    compared = msgs.compared_text(snap.intent, snap.evidence, len(snap.lines), bool(launched.get("command_checked")),
                                  bool(launched.get("environment_checked")))
    if snap.intent.follower:
        return _done(PASS, msgs.follower_passed(snap.unit, snap.invocation_id, compared, snap.policy.min_ready_seconds))
    settle = " and stayed up for min_ready_seconds %.0f" % snap.policy.min_ready_seconds \
        if snap.policy.min_ready_seconds > 0 else ""
    return _done(PASS, "%s: invocation %s is serving (%s; /generate answered after %.1fs%s)" % (
        snap.unit, snap.invocation_id, compared, snap.generate_elapsed or 0.0, settle))


def _timed_out(snap, judgement):
    """Out of time with nothing else due: an answering server still without evidence is unverified (its
    grace ran out with the wait), anything else a timeout with the last phase and journal line seen."""
    if snap.generate is not None and snap.evidence is None and not snap.policy.accept_unverified:
        if NOTICES not in snap.looks:
            return _watching(snap, look=NOTICES)
        completeness = ev.journal_completeness(snap.start_seen, snap.after_config_seen, snap.looks[NOTICES])
        unverified = _unverified(snap, completeness)
        if unverified.done or unverified.look:
            return unverified
    last_line = snap.tail[-1] if snap.tail else None
    return _done(TIMEOUT, "timed out after %.1fs waiting for %s: last phase: %s; unit %s; last journal line: %s" % (
        snap.elapsed, snap.unit, with_error(judgement.message, snap.last_error),
        snap.unit_state.describe() if snap.unit_state is not None else "unknown",
        repr(last_line) if last_line is not None else "(none seen for this invocation)"))


def with_error(phase, error):
    """A phase in words, with why reading the host fails when it does (said once)."""
    phase = phase.split(" (last error")[0]
    return "%s (last error: %s)" % (phase, error) if error else phase


def receipt_due(snap):
    """A pass leaves a receipt only when it compared the config line (a receipt records only what was
    compared), and replaces one of the same invocation only when the journal added lines to it."""
    return snap.policy.write_receipt and snap.evidence not in (None, ACCEPTED) and \
        ev.compared_anything(snap.intent.mode, snap.intent.expect, snap.lines) and \
        (snap.receipt is None or bool(snap.journal_lines))


def with_looks(snap, looks):
    """The same snapshot with other looks (for tests and for asking again within one look at the host)."""
    return replace(snap, looks=MappingProxyType(dict(looks)))
