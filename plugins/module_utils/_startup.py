# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What one SGLang invocation's journal says about its startup: phase, progress, config lines.

Private to this collection: no compatibility promise. Pure: entries in, facts out.

SGLang's startup lines (0.5.11-0.5.23), in order: ``server_args=...``; per rank ``Load weight
begin``; ``Loading safetensors checkpoint shards: NN% Completed | k/n``; ``Load weight end``;
``KV Cache is allocated``; ``Capture cuda graph begin``/``end``; the draft model's weights; the
config line ``Initialized DFLASH draft runner. ...``; ``max_total_num_tokens=...``; uvicorn's
``Started server process`` / ``Uvicorn running on``; the warmup ``/generate``; ``The server is
fired up and ready to roll!``. Every line after the config line proves that journald kept the
stretch of the log where the config line belongs (see _evidence).

A node of a multi-node serving group also logs ``Init parallel begin.`` (``Init torch distributed
begin.`` up to 0.5.20) per rank, where it waits for every rank of every node; a follower (node 1 and
up) ends its startup with ``Dummy health check server started in background thread at HOST:PORT``,
logged once every local scheduler is ready: it joined the group (it never logs the lines of HTTP).
"""
from __future__ import annotations

import re

from ansible_collections.gpufleet.inference.plugins.module_utils import _config_line as cfg
from ansible_collections.gpufleet.inference.plugins.module_utils import _evidence as ev
from ansible_collections.gpufleet.inference.plugins.module_utils._journal import JournalError
from ansible_collections.gpufleet.inference.plugins.module_utils._process import redact_text
from ansible_collections.gpufleet.inference.plugins.module_utils._systemd import describe_exit

# Phases in startup order; a line never moves the phase backwards.
PHASES = ("starting", "rendezvous", "loading_weights", "weights_loaded", "kv_cache", "cuda_graph",
          "draft_runner", "joined", "port_open", "ready")
PHASE_TEXT = {
    "starting": "starting",
    "rendezvous": "distributed init (waiting for every rank to join)",
    "loading_weights": "loading weights",
    "weights_loaded": "weights loaded",
    "kv_cache": "KV cache allocated",
    "cuda_graph": "capturing CUDA graphs",
    "draft_runner": "draft runner initialised",
    "joined": "joined its serving group (its schedulers are ready)",
    "port_open": "HTTP server up",
    "ready": "warmed up (fired up and ready to roll)",
}
_FAILED_WITH = re.compile(r"Failed with result '([^']+)'")  # systemd's note: the unit's Result
# Each phase line is recognised by its shape (see _config_line): the marker at the START of the
# message, never anywhere in the line - request logs quote user text.
_SHARDS = re.compile(r"^Loading safetensors checkpoint shards:\s*(\d+)% Completed \|\s*(\d+)/(\d+)")
_PREFIXED_STARTS = (  # SGLang's own logger: "[ts( TAGn)*] <message>"
    ("server_args=", "starting"),
    ("Init parallel begin", "rendezvous"),
    ("Init torch distributed begin", "rendezvous"),
    ("Load weight begin", "loading_weights"),
    ("Load weight end", "weights_loaded"),
    ("KV Cache is allocated", "kv_cache"),
    ("Capture cuda graph begin", "cuda_graph"),
    # the scheduler serving requests
    ("Prefill batch", "port_open"),
    ("Decode batch", "port_open"),
    ("The server is fired up and ready to roll", "ready"),
    ("Dummy health check server started", "joined"),  # a follower node: its schedulers are ready
)
_UVICORN_LEVEL = re.compile(r"^(?:INFO|WARNING|ERROR|DEBUG|CRITICAL):\s+")
_ACCESS_LOG = re.compile(r'^\S+:\d+ - "(?:GET|POST|PUT|DELETE|HEAD|OPTIONS|PATCH) /')
# What journalctl --grep must find to judge a long-running invocation without reading all of it:
# its first line, its config lines, and a line that comes after the config line (a pre-filter:
# classify() and the config-line parser decide).
GREP_PATTERN = r"server_args=|%s|Uvicorn running on|fired up and ready to roll|Dummy health check server started" % (
    cfg.GREP_PATTERN)


def classify(line):
    """(phase, detail) for a startup line in its logging shape, else None. Shard progress
    (tqdm's line, which carries no prefix) reports loading_weights."""
    prefixed, dummy, message = cfg.message_of(line)
    if not prefixed:
        # tqdm redraws with carriage returns: the last drawing is the current one
        shards = _SHARDS.match(message.split("\r")[-1].strip() or message.strip())
        if shards:
            return "loading_weights", "shard %s/%s (%s%%)" % (shards.group(2), shards.group(3), shards.group(1))
    else:
        for marker, phase in _PREFIXED_STARTS:
            if message.startswith(marker):
                return phase, None
    # uvicorn's lines: its level prefix, after SGLang's "[ts] " (set_uvicorn_logging_configs) or alone
    rest = _UVICORN_LEVEL.sub("", message, count=1)
    if rest.startswith("Uvicorn running on") or _ACCESS_LOG.match(rest):
        return "port_open", None
    return None


_STOP_JOBS = ("stop", "restart")


class StartupLog(object):
    """Facts about one invocation, fed with its journal entries in order; serialisable.

    ``start_seen``: its first line (``server_args=``) is in the journal, i.e. retention kept the
    start. ``after_config_seen``: a line that SGLang logs after the config line's place (warmup,
    uvicorn, access log, our own /generate) is in the journal, so journald stored that stretch or
    wrote its "Suppressed" notice before it. ``config_lines``: every rank-0 config line.
    ``stop_job``: ``stop`` or ``restart`` when PID 1 logged a job of that type stopping it (an operator's
    ``systemctl stop``/``restart``, a shutdown): an end that was asked for, not a crash.
    ``joined_at``: when a follower node logged that it joined its serving group (epoch seconds, the
    journal's own timestamp), None before.
    """

    FIELDS = ("phase", "detail", "start_seen", "after_config_seen", "config_lines", "exit",
              "systemd_messages", "lines_seen", "joined_at", "stop_job")

    def __init__(self, state=None):
        state = state or {}
        self.phase = state.get("phase", "starting")
        self.detail = state.get("detail")
        self.start_seen = state.get("start_seen", False)
        self.after_config_seen = state.get("after_config_seen", False)
        self.config_lines = list(state.get("config_lines", []))
        self.exit = state.get("exit")
        self.systemd_messages = list(state.get("systemd_messages", []))
        self.lines_seen = state.get("lines_seen", 0)
        self.joined_at = state.get("joined_at")
        self.stop_job = state.get("stop_job")
        self.events = []  # (phase, detail) changes since the caller last took them

    def to_state(self):
        return dict((name, getattr(self, name)) for name in self.FIELDS)

    def _advance(self, phase, detail):
        if PHASES.index(phase) < PHASES.index(self.phase):
            return
        if phase == self.phase and detail is None:
            return  # another rank's line of the same phase: nothing new
        if (phase, detail) != (self.phase, self.detail):
            self.phase, self.detail = phase, detail
            self.events.append((phase, detail))

    def feed(self, entries):
        """Take entries in journal order."""
        for entry in entries:
            if entry.from_systemd:
                self._systemd(entry)
                continue
            self.lines_seen += 1
            message = entry.message
            parsed = cfg.parse_config_line(message)
            if parsed is not None:
                known = entry.cursor is not None and any(line.get("cursor") == entry.cursor
                                                         for line in self.config_lines)
                if parsed["rank0"] and not known:  # a line read twice (a search, then the follower) counts once
                    parsed["cursor"] = entry.cursor
                    parsed["realtime_usec"] = entry.realtime_usec
                    parsed["line"] = redact_text(parsed["line"])
                    self.config_lines.append(parsed)
                    self._advance("draft_runner", _config_detail(parsed["values"]))
                continue
            found = classify(message)
            if found is None:
                continue
            phase, detail = found
            if phase == "starting":
                self.start_seen = True
            if phase == "joined" and self.joined_at is None and entry.realtime_usec is not None:
                self.joined_at = int(entry.realtime_usec) / 1e6
            if PHASES.index(phase) >= PHASES.index("port_open"):
                self.after_config_seen = True
            self._advance(phase, detail)

    def _systemd(self, entry):
        fields = entry.fields
        if fields.get("JOB_TYPE") in _STOP_JOBS:  # "Stopping/Stopped <unit>" of a job someone asked for
            self.stop_job = fields["JOB_TYPE"]
        if fields.get("EXIT_CODE") or fields.get("EXIT_STATUS"):
            self.exit = describe_exit(fields.get("EXIT_CODE"), fields.get("EXIT_STATUS")) or "code=%s, status=%s" % (
                fields.get("EXIT_CODE", "?"), fields.get("EXIT_STATUS", "?"))
        result = _FAILED_WITH.search(entry.message or "")
        if result and "Result " not in (self.exit or ""):
            self.exit = "%s, Result %s" % (self.exit, result.group(1)) if self.exit else "Result %s" % result.group(1)
        self.systemd_messages = (self.systemd_messages + [entry.message])[-5:]

    def take_events(self):
        events, self.events = self.events, []
        return events

    def describe(self):
        return describe_phase(self.phase, self.detail)


def describe_phase(phase, detail=None):
    text = PHASE_TEXT.get(phase, phase)
    return "%s: %s" % (text, detail) if detail else text


def _config_detail(values):
    shown = ("block_size", "draft_window_size", "compact_cache", "tree_budget")
    return ", ".join("%s=%s" % (key, cfg.render(values[key])) for key in shown if key in values)


class LookBack(object):
    """What a running invocation's evidence is, found without reading its whole journal.

    ``lines`` are every config line to judge: those its receipt kept (the start may be gone from
    the journal) and those its journal holds after the receipt's last read position - a receipt
    stands in only for what the journal no longer has and never hides a later line. ``log`` is a
    StartupLog fed with the journal entries found, ``entries`` those entries, ``receipt`` the
    receipt of this very invocation (or None), ``note`` why the journal could not be searched.
    """

    def __init__(self, log, receipt, entries, note):
        self.log = log
        self.receipt = receipt
        self.entries = entries
        self.note = note
        self.lines = ev.judged_lines(receipt, log.config_lines)
        self.source = ev.evidence_source(receipt, log.config_lines) if self.lines or receipt is not None else None


def look_back(host, invocation_id):
    """A running invocation's evidence (LookBack): its receipt, if one was written for this very
    invocation, and a search of its journal for the startup landmarks (GREP_PATTERN) - after the
    receipt's last read position when there is a receipt, else from its start. The one lookup the
    wait, the drift check and sglang_info share."""
    log = StartupLog()
    receipt = host.receipt_for(invocation_id)
    after = ev.receipt_cursor(receipt) if receipt is not None else None
    try:
        entries = host.grep(invocation_id, after_cursor=after)
    except JournalError as exc:
        return LookBack(log, receipt, [], "could not search the journal of invocation %s: %s" % (invocation_id, exc))
    if entries is None:
        return LookBack(log, receipt, [], "journalctl here cannot --grep; the journal of invocation %s was not "
                        "searched" % invocation_id)
    log.feed(entries)
    log.take_events()
    return LookBack(log, receipt, entries, None)
