# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The judge of the wait, as a table: what the host showed (a Snapshot) -> verdict, done, what to look at next,
and the words the message must hold. Every verdict of the README's verification contract has its rows."""
from collections import namedtuple

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils import _config_line as cfg
from ansible_collections.gpufleet.inference.plugins.module_utils import _evidence as ev
from ansible_collections.gpufleet.inference.plugins.module_utils import _judge as jd
from ansible_collections.gpufleet.inference.plugins.module_utils._systemd import EffectiveUnit

from fakes import (COMMAND, CONFIG_2048, CONFIG_512, CONFIG_NONE, EXPECT_2048, GOOD, NEW, NEWER, OLD, STARTING, WALL0,
                   http_json, unit_state)

RECEIPT_PATH = "/var/lib/gpufleet-inference/receipts/sglang.service.json"


def line(text, cursor):
    parsed = cfg.parse_config_line(text)
    parsed["cursor"] = cursor
    return parsed


def like(base, **changes):
    """`base` with `changes` (a new dict)."""
    found = dict(base)
    found.update(changes)
    return found


def receipt(*lines, **fields):
    return dict({"version": 1, "unit": "sglang.service", "invocation_id": NEW, "verified_at": WALL0,
                 "config_line_mode": "required", "config_lines": list(lines)}, **fields)


LINE_2048, LINE_512, LINE_NONE = line(CONFIG_2048, "j:6"), line(CONFIG_512, "j:7"), line(CONFIG_NONE, "j:8")
ANSWER = {"status": 200, "text": " Paris.", "meta_info": {"completion_tokens": 8}}
CHECKED = {"command_checked": True, "environment_checked": False, "drop_in_paths": [], "command": COMMAND}
FLAGS = jd.UnitFlags({"block_size": ("--speculative-num-draft-tokens",),
                      "draft_window_size": ("--speculative-draft-window-size", "--speculative-dflash-draft-window-size"),
                      "compact_cache": ()}, tuple(COMMAND))
TAIL = ("[2026-11-29 10:00:00] server_args=ServerArgs(model_path='/m')",
        "RuntimeError: CUDA error: an illegal memory access was encountered")
RESTARTED_BEFORE = [{"invocation_id": NEW, "n_restarts": 1,
                     "message": "sglang.service: Scheduled restart job, restart counter is at 1."}]
AUTO_RESTART = unit_state(NEW, "activating", "auto-restart", restarts=1, pid=0, result="exit-code", code="1", status="1")
FAILED = unit_state(NEW, "failed", "failed", pid=0, result="exit-code", code="1", status="1")
KILLED = unit_state(NEW, "failed", "failed", pid=0, result="signal", code="2", status="9")
FOREIGN = {"verdict": "outside", "message": "a process outside sglang.service answers on 127.0.1.11:30000: pid 9"}
NOTICE = {"count": 4321, "message": "Suppressed 4321 messages from sglang.service", "invocation_id": NEW}

# What the host showed at the main stations of a restart that goes well.
FOLLOWED = dict(after=OLD, invocation_id=NEW, unit_state=unit_state(NEW), startup="loading weights: shard 8/16 (50%)",
                lines_seen=3, start_seen=True, elapsed=3.0, phase="invocation %s started" % NEW)
LOGGED = like(FOLLOWED, journal_lines=(LINE_2048,), after_config_seen=True, startup="warmed up", lines_seen=9)
ANSWERED = like(LOGGED, generate=ANSWER, generate_elapsed=4.0, elapsed=4.0)
CHECKED_ALL = like(ANSWERED, evidence="journal", launched=CHECKED)
NO_LINE = like(ANSWERED, journal_lines=())  # it answers; its journal holds no config line
SERVING = like(FOLLOWED, after=None, phase="invocation %s started" % NEW)


def snapshot(looks=None, expect=None, mode=None, command=COMMAND, environment=None, **fields):
    policy = fields.pop("policy", {})
    return jd.with_looks(jd.Snapshot(
        intent=ev.Intent(EXPECT_2048 if expect is None else expect, mode, command, environment),
        policy=jd.Policy(**dict({"timeout": 120}, **policy)), **fields), looks or {})


Row = namedtuple("Row", "name snapshot verdict done look phrases")


def row(name, fields, verdict, done=False, look=None, phrases=()):
    return Row(name, fields, verdict, done, look, phrases)


W, D = jd.WAITING, True
TABLE = [
    # --- which invocation
    row("before systemd was read, keep watching", dict(after=OLD), W),
    row("a unit systemd does not know is not_found", dict(after=OLD, unit_state=unit_state("", load="not-found")),
        jd.NOT_FOUND, D, phrases=["unit sglang.service not found (LoadState=not-found)"]),
    row("verify only: a unit that is not running is not_active",
        dict(unit_state=unit_state("", "inactive", "dead")), jd.NOT_ACTIVE, D,
        phrases=["sglang.service is not running: inactive/dead"]),
    row("verify only: a unit stopped on purpose is not_active, not died",
        dict(unit_state=unit_state(NEW, "inactive", "dead", pid=0, result="success")), jd.NOT_ACTIVE, D,
        phrases=["sglang.service is not running: inactive/dead (InvocationID %s" % NEW]),
    row("the old invocation still runs: waiting, never probed", dict(after=OLD, unit_state=unit_state(OLD)), W,
        phrases=["waiting for a new invocation of sglang.service (still %s, active/running)" % OLD]),
    row("a new invocation is followed", dict(after=OLD, unit_state=unit_state(NEW, "activating", "start")), W,
        look=jd.FOLLOW),
    row("verify only: the running invocation is followed", dict(unit_state=unit_state(NEW)), W, look=jd.FOLLOW),
    row("verify only: a failed invocation is followed (then judged as ended)", dict(unit_state=FAILED), W,
        look=jd.FOLLOW),
    # --- restarts by systemd before the first look
    row("a restart before the first look asks for the crashed invocation's lines",
        like(FOLLOWED, invocation_id=NEWER, unit_state=unit_state(NEWER, restarts=1), baseline_restarts=1, deaths=1,
             looks={jd.FOLLOW: RESTARTED_BEFORE}), W, look=jd.CRASHED_TAIL),
    row("a restart before the first look is a crash_loop naming the crashed invocation",
        like(FOLLOWED, invocation_id=NEWER, unit_state=unit_state(NEWER, restarts=1), baseline_restarts=1, deaths=1,
             tail=("ValueError: --speculative-draft-window-size must be positive, got 0.",),
             looks={jd.FOLLOW: RESTARTED_BEFORE, jd.CRASHED_TAIL: None}), jd.CRASH_LOOP, D,
        phrases=["invocation %s exited, and systemd restarted it once before this wait first looked" % NEW,
                 "now invocation %s" % NEWER, "Cause: ValueError: --speculative-draft-window-size must be positive"]),
    row("a tolerated restart before the first look is a note",
        like(FOLLOWED, invocation_id=NEWER, unit_state=unit_state(NEWER, restarts=1), baseline_restarts=1, deaths=1,
             policy={"crash_loop_restarts": 1}, looks={jd.FOLLOW: RESTARTED_BEFORE}), W),
    # --- deaths and restarts of the followed invocation
    row("an invocation found ended reads its journal to the end first",
        like(FOLLOWED, unit_state=AUTO_RESTART, looks={jd.FOLLOW: []}), W, look=jd.READ_TO_END),
    row("an invocation that ended before the first look is a crash_loop when systemd restarts it",
        like(FOLLOWED, unit_state=AUTO_RESTART, looks={jd.FOLLOW: [], jd.READ_TO_END: None}), jd.CRASH_LOOP, D,
        phrases=["ended before it could be checked (activating/auto-restart, code=exited, status=1/FAILURE, "
                 "Result exit-code)"]),
    row("verify only: a failed invocation died",
        like(SERVING, unit_state=FAILED, looks={jd.FOLLOW: [], jd.READ_TO_END: None}), jd.DIED, D,
        phrases=["is not running (failed/failed, code=exited, status=1/FAILURE, Result exit-code)"]),
    row("verify only: an invocation a stop job ended is not_active, not a death (0.5.11 SIGKILLs itself on stop)",
        like(SERVING, unit_state=KILLED, stop_job="stop", looks={jd.FOLLOW: [], jd.READ_TO_END: None}), jd.NOT_ACTIVE,
        D, phrases=["sglang.service is not running: stopped by a stop job of systemd (systemctl stop, or a "
                    "shutdown), not crashed (invocation %s, code=killed, status=9/KILL, Result signal)" % NEW]),
    row("a new invocation a stop job ended died, and the message says who ended it",
        like(FOLLOWED, unit_state=KILLED, stop_job="stop", looks={jd.READ_TO_END: None}), jd.DIED, D,
        phrases=["stopped by a stop job of systemd (systemctl stop, or a shutdown), not crashed"]),
    row("a death names the phase, the exit status once and the likely cause",
        like(FOLLOWED, unit_state=FAILED, tail=TAIL, looks={jd.READ_TO_END: None}), jd.DIED, D,
        phrases=["invocation %s ended (failed/failed, code=exited, status=1/FAILURE, Result exit-code)" % NEW,
                 "while loading weights: shard 8/16 (50%)", "Cause: RuntimeError: CUDA error",
                 "Last 2 journal lines of the invocation"]),
    row("a death without lines names the wait's phase",
        like(FOLLOWED, unit_state=FAILED, lines_seen=0, looks={jd.READ_TO_END: None}), jd.DIED, D,
        phrases=["while invocation %s started" % NEW, "(no journal entries)"]),
    row("systemd restarting it is a crash_loop", like(FOLLOWED, unit_state=AUTO_RESTART, looks={jd.READ_TO_END: None}),
        jd.CRASH_LOOP, D, phrases=["exited (code=exited, status=1/FAILURE, Result exit-code) and systemd is "
                                   "restarting it (Restart=, crash loop)"]),
    row("a restart count above the one it started with is a crash_loop",
        like(FOLLOWED, unit_state=unit_state(NEW, restarts=2), baseline_restarts=1, looks={jd.READ_TO_END: None}),
        jd.CRASH_LOOP, D, phrases=["was restarted by systemd (NRestarts 1 -> 2, crash loop)"]),
    row("another invocation after a restart by systemd is a crash_loop",
        like(FOLLOWED, unit_state=unit_state(NEWER, restarts=1), looks={jd.READ_TO_END: None}), jd.CRASH_LOOP, D,
        phrases=["was replaced by invocation %s (restarted by systemd: crash loop)" % NEWER]),
    row("another invocation that systemd did not restart is replaced",
        like(FOLLOWED, unit_state=unit_state(NEWER), looks={jd.READ_TO_END: None}), jd.REPLACED, D,
        phrases=["was replaced by invocation %s although systemd did not restart it (NRestarts 0)" % NEWER,
                 "someone or something else restarted sglang.service"]),
    row("a tolerated crash follows the next invocation",
        like(FOLLOWED, unit_state=AUTO_RESTART, policy={"crash_loop_restarts": 1}), W, look=jd.FOLLOW_NEXT),
    row("a crash while settling says so",
        like(ANSWERED, unit_state=AUTO_RESTART, policy={"min_ready_seconds": 10}, looks={jd.READ_TO_END: None}),
        jd.CRASH_LOOP, D,
        phrases=["while settling after its first good /generate"]),
    # --- every config line against the intent
    row("a config line with other values first reads what runs",
        like(FOLLOWED, journal_lines=(LINE_512,)), W, look=jd.LAUNCH),
    row("then the unit's flags, to name them",
        like(FOLLOWED, journal_lines=(LINE_512,), launched=CHECKED, looks={jd.LAUNCH: jd.Launch(launched=CHECKED)}),
        W, look=jd.UNIT_FLAGS),
    row("a config line with other values is a mismatch at once, naming the flag",
        like(FOLLOWED, journal_lines=(LINE_NONE,), launched=CHECKED,
             looks={jd.LAUNCH: jd.Launch(launched=CHECKED), jd.UNIT_FLAGS: FLAGS}), jd.MISMATCH, D,
        phrases=["sglang.service runs other settings than intended",
                 "draft_window_size: expected 2048 (--speculative-dflash-draft-window-size 2048 in sglang.service), "
                 "observed None in the config line of invocation %s" % NEW, "compact_cache: expected True"]),
    row("a flag missing from the unit is named",
        like(FOLLOWED, journal_lines=(LINE_NONE,), launched=CHECKED, looks={
            jd.LAUNCH: None, jd.UNIT_FLAGS: jd.UnitFlags(FLAGS.flags, ("/py", "-m", "sglang.launch_server"))}),
        jd.MISMATCH, D, phrases=["no --speculative-draft-window-size / --speculative-dflash-draft-window-size in "
                                 "sglang.service's ExecStart"]),
    row("a second config line with other values is a mismatch",
        like(ANSWERED, journal_lines=(LINE_2048, LINE_512), launched=CHECKED, looks={jd.UNIT_FLAGS: FLAGS}),
        jd.MISMATCH, D, phrases=["observed 512 in the second config line of invocation %s" % NEW]),
    row("a line kept by the receipt is named as such",
        like(SERVING, receipt=receipt(dict(LINE_512, cursor="old")), launched=CHECKED, looks={jd.UNIT_FLAGS: FLAGS}),
        jd.MISMATCH, D, phrases=["in the config line of invocation %s kept by its receipt (%s)" % (NEW, RECEIPT_PATH)]),
    row("a receipt never hides a later line of the same invocation",
        like(SERVING, receipt=receipt(dict(LINE_2048, cursor="old")), journal_lines=(LINE_NONE,), launched=CHECKED,
             looks={jd.UNIT_FLAGS: FLAGS}), jd.MISMATCH, D,
        phrases=["observed None in the second config line of invocation %s" % NEW]),
    row("a draft runner where none was intended is a mismatch",
        like(FOLLOWED, expect={}, mode="absent", journal_lines=(LINE_2048,), launched=CHECKED,
             looks={jd.LAUNCH: None}), jd.MISMATCH, D,
        phrases=["expected no draft-runner line (speculative decoding off), but it logged", "draft_window_size=2048"]),
    row("a config-line mismatch names what the command line shows and the drop-ins",
        like(FOLLOWED, journal_lines=(LINE_512,), launched=like(CHECKED, drop_in_paths=["/etc/d/override.conf"]),
             looks={jd.UNIT_FLAGS: FLAGS, jd.LAUNCH: jd.Launch(({
                 "key": "--speculative-dflash-draft-window-size", "expected": "2048", "observed": "512",
                 "where": "on the command line of its main process 4242", "plain": True},))}), jd.MISMATCH, D,
        phrases=["--speculative-dflash-draft-window-size: expected 2048, observed 512 on the command line of its "
                 "main process 4242", "drop-ins of sglang.service: /etc/d/override.conf"]),
    # --- systemd first
    row("systemd logged about the invocation: its view first", like(LOGGED, unit_stale=True), W),
    # --- readiness
    row("the port is probed", dict(LOGGED), W, look=jd.PORT),
    row("a closed port is waited for", like(FOLLOWED, looks={jd.PORT: False}), W,
        phrases=["loading weights: shard 8/16 (50%); port not open yet"]),
    row("an open port: who listens", like(LOGGED, looks={jd.PORT: True}), W, look=jd.LISTENER),
    row("a process outside the unit on the port is a foreign_listener",
        like(LOGGED, looks={jd.PORT: True, jd.LISTENER: FOREIGN}), jd.FOREIGN_LISTENER, D,
        phrases=["a process outside sglang.service answers on 127.0.1.11:30000: pid 9"]),
    row("the unit's own listener (or none checked): /generate",
        like(LOGGED, looks={jd.PORT: True, jd.LISTENER: None}), W, look=jd.GENERATE),
    row("a wrong api key is unauthorized",
        like(LOGGED, looks={jd.PORT: True, jd.LISTENER: None, jd.GENERATE: http_json(401, {"error": "Unauthorized"})}),
        jd.UNAUTHORIZED, D, phrases=["answers /generate with HTTP 401: the api_key does not match the server's "
                                     "--api-key"]),
    row("a server still warming up is waited for",
        like(LOGGED, looks={jd.PORT: True, jd.LISTENER: None, jd.GENERATE: STARTING}), W,
        phrases=['port open, /generate not answering yet (HTTP 503 {"error": "starting"})']),
    row("an empty answer is waited for, its body shown",
        like(LOGGED, looks={jd.PORT: True, jd.LISTENER: None, jd.GENERATE: http_json(200, {"text": ""})}), W,
        phrases=['port open, /generate not answering yet (HTTP 200: {"text": ""})']),
    # --- the evidence once it answers
    row("config lines in the journal are the evidence", dict(ANSWERED), W),
    row("verify only: a receipt without lines stands in when no line was expected",
        like(SERVING, expect={}, mode="absent", receipt=receipt(config_line_mode="absent"), generate=ANSWER,
             generate_elapsed=0.0), W),
    row("a receipt that records no config line is a missing_config_line when one is required",
        like(SERVING, receipt=receipt(), generate=ANSWER, generate_elapsed=0.0), jd.MISSING_CONFIG_LINE, D,
        phrases=["the receipt of invocation %s (%s) records a verification that it logged no config line" % (
            NEW, RECEIPT_PATH)]),
    row("nothing expected and no line: nothing to compare", like(NO_LINE, expect={}, mode="optional"), W),
    row("a missing line: journald's suppression notices are read", dict(NO_LINE), W, look=jd.NOTICES),
    row("a complete journal without the line is a missing_config_line",
        like(NO_LINE, looks={jd.NOTICES: []}), jd.MISSING_CONFIG_LINE, D,
        phrases=["logged no config line", "its journal is complete around where the line belongs"]),
    row("off intended and a complete journal without the line: evidence",
        like(NO_LINE, expect={}, mode="absent", looks={jd.NOTICES: []}), W),
    row("nothing logged after the line's place yet: poke the idle server and wait",
        like(NO_LINE, after_config_seen=False, elapsed=6.0, looks={jd.NOTICES: []}), W, look=jd.POKE,
        phrases=["waiting for a line logged after the config line's place, or journald's suppression notice "
                 "(2s of journal_grace 35)"]),
    row("poked already: keep watching", like(NO_LINE, after_config_seen=False, looks={jd.NOTICES: [], jd.POKE: None}),
        W),
    row("nothing after the line's place within journal_grace is unverified",
        like(NO_LINE, after_config_seen=False, elapsed=40.0, looks={jd.NOTICES: []}), jd.UNVERIFIED, D,
        phrases=["cannot be told whether journald dropped the line",
                 "/server_info only echoes the parsed arguments and does not count"]),
    row("a line lost to journald's rate limit is unverified, never a pass",
        like(NO_LINE, looks={jd.NOTICES: [NOTICE]}), jd.UNVERIFIED, D,
        phrases=["journald's rate limit dropped 4321 messages of sglang.service", "Suppressed 4321 messages"]),
    row("a start gone from the journal asks journald's storage",
        like(NO_LINE, start_seen=False, looks={jd.NOTICES: []}), W, look=jd.STORAGE),
    row("a start gone from the journal is retention",
        like(NO_LINE, start_seen=False, looks={jd.NOTICES: [], jd.STORAGE: "auto"}), jd.UNVERIFIED, D,
        phrases=["no longer holds the start of invocation %s" % NEW, "journal retention",
                 "no receipt of a verification of this invocation is in /var/lib/gpufleet-inference/receipts"]),
    row("a journald that keeps nothing is named as the cause",
        like(NO_LINE, start_seen=False, looks={jd.NOTICES: [], jd.STORAGE: "none"}), jd.UNVERIFIED, D,
        phrases=["Storage=none"]),
    row("accept_unverified accepts with a note", like(NO_LINE, policy={"accept_unverified": True},
                                                      looks={jd.NOTICES: [NOTICE]}), W),
    # --- what runs
    row("evidence settled: what runs is read", like(ANSWERED, evidence="journal"), W, look=jd.LAUNCH),
    row("a command line that cannot be read yet: systemd's view first",
        like(ANSWERED, evidence="journal", looks={jd.LAUNCH: None}), W, look=jd.UNIT),
    row("a process launched with other arguments is a mismatch",
        like(ANSWERED, evidence="journal", launched=CHECKED, looks={jd.LAUNCH: jd.Launch(({
            "key": "--tp-size", "expected": "8", "observed": "4", "where": "on the command line of its main process "
            "4242", "plain": True},), launched=CHECKED)}), jd.MISMATCH, D,
        phrases=["--tp-size: expected 8, observed 4 on the command line of its main process 4242"]),
    # --- settle
    row("settling after the first answer", like(CHECKED_ALL, elapsed=7.0, policy={"min_ready_seconds": 10}), W,
        phrases=["settling: serving for 3.0s of min_ready_seconds 10 (no restart, no death)"]),
    row("settled: one more /generate", like(CHECKED_ALL, elapsed=14.0, policy={"min_ready_seconds": 10}), W,
        look=jd.SETTLE_PROBE),
    row("no longer answering at the end of the settle is unstable",
        like(CHECKED_ALL, elapsed=14.0, policy={"min_ready_seconds": 10}, looks={jd.SETTLE_PROBE: STARTING}),
        jd.UNSTABLE, D, phrases=["answered /generate, but no longer after 10.0s of min_ready_seconds (HTTP 503"]),
    row("still answering at the end of the settle is a pass",
        like(CHECKED_ALL, elapsed=14.0, policy={"min_ready_seconds": 10}, looks={jd.SETTLE_PROBE: GOOD}), jd.PASS, D,
        phrases=["and stayed up for min_ready_seconds 10"]),
    row("verified by a receipt long enough ago: no settle again",
        like(CHECKED_ALL, receipt=receipt(dict(LINE_2048, cursor="old")), wall=WALL0 + 60, evidence="receipt",
             policy={"min_ready_seconds": 10}), jd.PASS, D, phrases=["from the receipt of its verification"]),
    # --- pass
    row("a pass names what it compared",
        dict(CHECKED_ALL), jd.PASS, D,
        phrases=["sglang.service: invocation %s is serving (compared block_size=16, compact_cache=True, "
                 "draft_window_size=2048 (config line in its journal); its command line; /generate answered after "
                 "4.0s)" % NEW]),
    row("two agreeing lines are counted", like(CHECKED_ALL, journal_lines=(LINE_2048, dict(LINE_2048, cursor="j:9"))),
        jd.PASS, D, phrases=["(2 config lines in its journal)"]),
    row("off intended: the pass says so", like(CHECKED_ALL, expect={}, mode="absent", journal_lines=()), jd.PASS, D,
        phrases=["compared no draft-runner line, as intended (speculative decoding off)"]),
    row("nothing compared: readiness only, never 'agrees'",
        like(CHECKED_ALL, expect={}, mode="optional", evidence="none", launched={}, journal_lines=()), jd.PASS, D,
        phrases=["nothing was compared (no expectation given): readiness only"]),
    row("accepted without evidence: a pass that says UNVERIFIED",
        like(CHECKED_ALL, evidence=jd.ACCEPTED, notes=("UNVERIFIED, accepted (accept_unverified): the line was lost",
                                                       "main process 4242: its program is /usr/bin/python3.11")),
        jd.PASS, D, phrases=["is serving, UNVERIFIED (accepted by accept_unverified): UNVERIFIED, accepted "
                             "(accept_unverified): the line was lost"]),
    # --- timeout
    row("out of time waiting for a new invocation is a timeout",
        dict(after=OLD, unit_state=unit_state(OLD), elapsed=120.0), jd.TIMEOUT, D,
        phrases=["timed out after 120.0s waiting for sglang.service: last phase: waiting for a new invocation",
                 "last journal line: (none seen for this invocation)"]),
    row("a timeout names the last phase and the last line",
        like(FOLLOWED, tail=("[2026-11-29 10:00:03] The server is fired up and ready to roll!",), elapsed=120.0,
             looks={jd.PORT: False}), jd.TIMEOUT, D,
        phrases=["last phase: loading weights: shard 8/16 (50%); port not open yet",
                 "unit active/running (InvocationID %s" % NEW, "last journal line: '[2026-11-29 10:00:03] The server"]),
    row("a timeout names why reading the host fails, once",
        like(FOLLOWED, elapsed=120.0, last_error="systemctl show failed (rc=1)", looks={jd.PORT: False},
             phase="x (last error: systemctl show failed (rc=1))"), jd.TIMEOUT, D,
        phrases=["last phase: loading weights: shard 8/16 (50%); port not open yet (last error: systemctl show "
                 "failed (rc=1)); unit active/running"]),
    row("out of time, a look still due comes first", like(FOLLOWED, elapsed=120.0), W, look=jd.PORT),
    row("out of time within journal_grace: its notices, then unverified",
        like(NO_LINE, after_config_seen=False, elapsed=120.0, looks={jd.NOTICES: [], jd.POKE: None}),
        jd.UNVERIFIED, D, phrases=["cannot be told whether journald dropped the line"]),
]


@pytest.mark.parametrize("case", TABLE, ids=[case.name for case in TABLE])
def test_the_judge_gives_each_snapshot_its_verdict(case):
    fields = dict(case.snapshot)
    judgement = jd.judge(snapshot(**fields))
    assert (judgement.verdict, judgement.done, judgement.look) == (case.verdict, case.done, case.look), \
        judgement.message
    for phrase in case.phrases:
        assert phrase in judgement.message, judgement.message


def test_every_verdict_of_the_contract_has_a_row():
    verdicts = set(case.verdict for case in TABLE)
    assert verdicts == {jd.PASS, jd.MISMATCH, jd.DIED, jd.CRASH_LOOP, jd.REPLACED, jd.UNSTABLE, jd.TIMEOUT,
                        jd.FOREIGN_LISTENER, jd.MISSING_CONFIG_LINE, jd.UNVERIFIED, jd.UNAUTHORIZED, jd.NOT_ACTIVE,
                        jd.NOT_FOUND, jd.WAITING}


def test_the_judge_never_asks_for_a_look_it_has_already():
    for case in TABLE:
        judgement = jd.judge(snapshot(**dict(case.snapshot)))
        assert judgement.look is None or judgement.look not in dict(case.snapshot).get("looks", {}), case.name


# --------------------------------------------------------------------------- what a judgement establishes

def judged(**fields):
    return jd.judge(snapshot(**fields))


def test_the_first_wait_for_a_new_invocation_is_an_event_and_only_the_first():
    first = judged(after=OLD, unit_state=unit_state(OLD))
    assert first.event == ("waiting", "old invocation %s still active/running (draining)" % OLD)
    again = judged(after=OLD, unit_state=unit_state(OLD), phase=first.message)
    assert again.event is None and again.message == first.message


def test_evidence_is_established_with_its_source():
    assert judged(**ANSWERED).evidence == "journal"
    assert judged(**like(SERVING, receipt=receipt(dict(LINE_2048, cursor="old")), generate=ANSWER,
                         generate_elapsed=0.0)).evidence == "receipt"
    assert judged(**like(SERVING, receipt=receipt(dict(LINE_2048, cursor="old")), journal_lines=(
        dict(LINE_2048, cursor="j:20"),), generate=ANSWER, generate_elapsed=0.0)).evidence == "receipt+journal"
    assert judged(**like(NO_LINE, expect={}, mode="optional")).evidence == "none"
    assert judged(**like(NO_LINE, expect={}, mode="absent", looks={jd.NOTICES: []})).evidence == "journal"
    assert judged(**like(SERVING, expect={}, mode="absent", receipt=receipt(config_line_mode="absent"),
                         generate=ANSWER, generate_elapsed=0.0)).evidence == "receipt"


def test_a_mismatch_says_what_it_rests_on():
    assert judged(**like(ANSWERED, journal_lines=(LINE_512,), launched=CHECKED,
                         looks={jd.UNIT_FLAGS: FLAGS})).evidence == "journal"
    assert judged(**like(SERVING, receipt=receipt(dict(LINE_512, cursor="old")), launched=CHECKED,
                         looks={jd.UNIT_FLAGS: FLAGS})).evidence == "receipt"


def test_accepting_unverified_keeps_the_reason_as_a_note():
    judgement = judged(**like(NO_LINE, policy={"accept_unverified": True}, looks={jd.NOTICES: [NOTICE]}))
    assert judgement.evidence == jd.ACCEPTED and not judgement.done
    assert judgement.note.startswith("UNVERIFIED, accepted (accept_unverified): journald's rate limit dropped 4321")


def test_a_tolerated_restart_says_which_of_how_many():
    crash = judged(**like(FOLLOWED, unit_state=AUTO_RESTART, policy={"crash_loop_restarts": 2}, deaths=1))
    assert crash.look == jd.FOLLOW_NEXT
    assert crash.note.startswith("invocation %s exited (code=exited" % NEW)
    assert crash.note.endswith("following the next one (2 of 2 tolerated restarts)")
    before = judged(**like(FOLLOWED, invocation_id=NEWER, unit_state=unit_state(NEWER, restarts=1), baseline_restarts=1, deaths=1,
                           policy={"crash_loop_restarts": 1}, looks={jd.FOLLOW: RESTARTED_BEFORE}))
    assert before.note == ("invocation(s) %s exited and systemd restarted them before this wait first looked; "
                           "following %s (1 of 1 tolerated restarts)" % (NEW, NEWER))
    said = judged(**like(FOLLOWED, invocation_id=NEWER, unit_state=unit_state(NEWER, restarts=1), baseline_restarts=1, deaths=1,
                         policy={"crash_loop_restarts": 1}, notes=(before.note,), looks={jd.FOLLOW: RESTARTED_BEFORE}))
    assert said.note is None and said.look == jd.PORT  # said once; the wait goes on


def test_settling_starts_with_an_event():
    settling = judged(**like(CHECKED_ALL, elapsed=5.0, policy={"min_ready_seconds": 10}))
    assert settling.event == ("settling", settling.message)
    assert judged(**like(CHECKED_ALL, elapsed=6.0, phase=settling.message, policy={"min_ready_seconds": 10})
                  ).event is None


def test_the_settle_is_not_credited_by_a_receipt_written_moments_ago():
    fresh = judged(**like(CHECKED_ALL, receipt=receipt(dict(LINE_2048, cursor="old")), wall=WALL0 + 3,
                          evidence="receipt", policy={"min_ready_seconds": 10}))
    assert fresh.verdict == jd.WAITING and "settling" in fresh.message


def test_an_ok_judgement_is_a_pass_or_a_wait():
    assert jd.Judgement(jd.PASS, "", True).ok and jd.Judgement(jd.WAITING, "").ok
    assert not jd.Judgement(jd.MISMATCH, "", True).ok and not jd.Judgement(jd.TIMEOUT, "", True).ok


def test_snapshot_looks_cannot_be_changed():
    snap = snapshot(looks={jd.PORT: True})
    with pytest.raises(TypeError):
        snap.looks[jd.PORT] = False


# --------------------------------------------------------------------------- receipts

@pytest.mark.parametrize("fields,due", [
    (dict(CHECKED_ALL), True),
    (like(CHECKED_ALL, policy={"write_receipt": False}), False),
    (like(CHECKED_ALL, expect={}, mode="optional", evidence="none", journal_lines=()), False),  # compared nothing
    (like(CHECKED_ALL, expect={}, mode="optional"), False),  # a line read, nothing compared with it
    (like(CHECKED_ALL, expect={}, mode="absent", journal_lines=()), True),  # "off" was checked
    (like(CHECKED_ALL, evidence=jd.ACCEPTED, journal_lines=()), False),  # never without evidence
    (like(CHECKED_ALL, receipt=receipt(LINE_2048), journal_lines=()), False),  # the receipt of it stays
    (like(CHECKED_ALL, receipt=receipt(LINE_2048)), True),  # its journal added lines
], ids=["compared", "switched off", "readiness only", "nothing expected", "off checked", "accepted unverified",
        "receipt kept", "receipt and later lines"])
def test_a_pass_leaves_a_receipt_only_of_what_it_compared(fields, due):
    assert jd.receipt_due(snapshot(**fields)) is due


# --------------------------------------------------------------------------- what runs

def test_launch_check_compares_the_command_line_and_notes_a_launcher():
    intent = ev.Intent(EXPECT_2048, None, COMMAND, None)
    same = jd.launch_check(intent, "sglang.service", 4242, COMMAND)
    assert same.differences == () and same.notes == ()
    assert same.launched == {"command_checked": True, "environment_checked": False, "drop_in_paths": [],
                             "command": COMMAND}
    shimmed = jd.launch_check(intent, "sglang.service", 4242, ["/usr/bin/python3.11"] + COMMAND[1:])
    assert shimmed.differences == () and "execs it" in shimmed.notes[0] and shimmed.notes[0].startswith(
        "main process 4242: its program is /usr/bin/python3.11")
    other = jd.launch_check(intent, "sglang.service", 4242, COMMAND[:-1] + ["512"])
    assert [item["key"] for item in other.differences] == ["--speculative-dflash-draft-window-size"]
    assert other.differences[0]["where"] == "on the command line of its main process 4242"


def test_launch_check_compares_the_environment_of_the_unit_and_of_the_process():
    intent = ev.Intent({}, "optional", None, {"A": 1})
    effective = EffectiveUnit({"Environment": "A=1 B=2", "DropInPaths": "/etc/d/x.conf"})
    found = jd.launch_check(intent, "sglang.service", 7, None, effective, None, {"A": "2"})
    wheres = sorted((item["key"], item["where"]) for item in found.differences)
    assert wheres == [("A", "in the environment of its main process 7"),
                      ("B", "in the effective Environment= of sglang.service")]
    assert found.launched["environment_checked"] and found.launched["drop_in_paths"] == ["/etc/d/x.conf"]
    unread = jd.launch_check(intent, "sglang.service", 7, None, None, "systemctl failed", None)
    assert unread.differences == () and not unread.launched["environment_checked"]
    assert unread.notes == ("could not read the effective unit: systemctl failed",
                            "could not read the environment of main process 7 (run with become)")


def test_nothing_intended_about_the_launch_checks_nothing():
    found = jd.launch_check(ev.Intent({}, "optional"), "sglang.service", 7, None)
    assert found == jd.Launch((), (), {"command_checked": False, "environment_checked": False, "drop_in_paths": []})


def test_policy_coerces_jinja_strings():
    policy = jd.Policy(timeout="30", min_ready_seconds="10", tick="0.5", accept_unverified=False)
    assert (policy.timeout, policy.min_ready_seconds, policy.tick) == (30.0, 10.0, 0.5)
