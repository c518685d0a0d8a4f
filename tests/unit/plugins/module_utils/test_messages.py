# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The wording of the verdicts: what was being done, what was seen, what it means."""
import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils import _config_line as cfg
from ansible_collections.gpufleet.inference.plugins.module_utils import _messages as msgs
from ansible_collections.gpufleet.inference.plugins.module_utils._evidence import Intent

from fakes import CONFIG_2048, EXPECT_2048, NEW

UNIT = "sglang.service"


# --------------------------------------------------------------------------- likely_cause

@pytest.mark.parametrize("lines,cause", [
    (["Load weight begin", "Scheduler hit an exception: RuntimeError: CUDA error: an illegal memory access",
      "Traceback (most recent call last):", '  File "x.py", line 1, in <module>',
      "Received sigquit from a child process. It usually means the child failed."],
     "Received sigquit from a child process. It usually means the child failed."),
    (["Traceback (most recent call last):", '  File "/x/server_args.py", line 9, in __post_init__',
      "ValueError: draft window must be >= block size", "  warnings.warn(msg)"],
     "ValueError: draft window must be >= block size"),
    (["usage: launch_server.py [-h] ...", "launch_server.py: error: unrecognized arguments: --bogus 1"],
     "launch_server.py: error: unrecognized arguments: --bogus 1"),
    (["  torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB  "],
     "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"),
    (["Killed"], "Killed"),
    (["Traceback (most recent call last):"], None),  # the header alone says nothing
    (['  File "x.py", line 1, in <module> Error'], None),  # a stack frame is not the cause
    (["Load weight begin", "all good"], None),
    ([], None),
    (None, None),
])
def test_likely_cause(lines, cause):
    assert msgs.likely_cause(lines) == cause


# --------------------------------------------------------------------------- mismatch_message

def flag_in_unit(key):
    return "--speculative-dflash-draft-window-size 2048 in %s" % UNIT if key == "draft_window_size" else None


def test_config_mismatch_names_expected_flag_observed_and_the_line():
    items = [{"key": "draft_window_size", "expected": 2048, "observed": None, "occurrence": 1},
             {"key": "compact_cache", "expected": True, "observed": False, "occurrence": 1}]
    text = msgs.mismatch_message(UNIT, NEW, items, flag_in_unit)
    assert text == ("sglang.service runs other settings than intended: draft_window_size: expected 2048 "
                    "(--speculative-dflash-draft-window-size 2048 in sglang.service), observed None in the config "
                    "line of invocation %s; compact_cache: expected True, observed False in the config line of "
                    "invocation %s" % (NEW, NEW))


def test_a_later_occurrence_and_a_missing_key_and_strings():
    items = [{"key": "draft_window_size", "expected": 2048, "observed": 512, "occurrence": 2},
             {"key": "tree_budget", "expected": 64, "observed": cfg.ABSENT, "occurrence": 4},
             {"key": "attention_backend", "expected": "fa3", "observed": "flashinfer"}]
    text = msgs.mismatch_message(UNIT, NEW, items, None)
    assert "draft_window_size: expected 2048, observed 512 in the second config line of invocation %s" % NEW in text
    assert "tree_budget: expected 64, observed nothing (key not logged) in the #4 config line" in text
    assert "attention_backend: expected 'fa3', observed 'flashinfer' in the config line of invocation" in text


def test_plain_items_read_as_given_and_absent_is_nothing():
    items = [{"key": "--port", "expected": "30000", "observed": None, "plain": True,
              "where": "on the command line of its main process 4242"},
             {"key": "--cuda-graph-bs", "expected": ["1", "2"], "observed": "4", "plain": True, "where": "there"},
             {"key": "B", "expected": None, "observed": "2", "plain": True, "where": "in the environment"}]
    text = msgs.mismatch_message(UNIT, NEW, items, flag_in_unit)
    assert "--port: expected 30000, observed nothing on the command line of its main process 4242" in text
    assert "--cuda-graph-bs: expected 1 2, observed 4 there" in text
    assert "B: expected nothing, observed 2 in the environment" in text
    assert "'30000'" not in text  # plain text is not repr'd


def test_draft_runner_item():
    items = [{"key": "draft_runner", "expected": "no draft-runner line (speculative decoding off)",
              "observed": CONFIG_2048, "occurrence": 1}]
    text = msgs.mismatch_message(UNIT, NEW, items, flag_in_unit)
    assert text == ("sglang.service runs other settings than intended: expected no draft-runner line (speculative "
                    "decoding off), but it logged %r in the config line of invocation %s" % (CONFIG_2048, NEW))


def test_a_where_given_by_the_caller_wins():
    items = [{"key": "draft_window_size", "expected": 2048, "observed": 512, "occurrence": 1,
              "where": "in the config line of invocation X kept by its receipt (/r.json)"}]
    assert msgs.mismatch_message(UNIT, NEW, items, None).endswith("observed 512 in the config line of invocation X "
                                                                  "kept by its receipt (/r.json)")


# --------------------------------------------------------------------------- ended_message

def test_ended_message_has_exit_info_cause_first_and_masks_secrets():
    tail = ["server_args=ServerArgs(api_key='sekret')", "launch --api-key sekret",
            "RuntimeError: bad key api_key='sekret'"]
    text = msgs.ended_message(UNIT, NEW, "ended (failed/failed, code=exited, status=1/FAILURE, Result exit-code)",
                              12.345, "loading weights", tail, "code=exited, status=1/FAILURE",
                              msgs.likely_cause(tail))
    head, lines = text.split("\n", 1)
    assert head == ("sglang.service: invocation %s ended (failed/failed, code=exited, status=1/FAILURE, Result "
                    "exit-code) after 12.3s, while loading weights (code=exited, status=1/FAILURE). Cause: "
                    "RuntimeError: bad key api_key='********'. Last 3 journal lines of the invocation:" % NEW)
    assert "sekret" not in text
    assert lines.split("\n") == ["server_args=ServerArgs(api_key='********')", "launch --api-key ********",
                                 "RuntimeError: bad key api_key='********'"]


def test_ended_message_without_lines_exit_or_cause():
    text = msgs.ended_message(UNIT, NEW, "ended", 1.0, "starting", [], None, None)
    assert text == ("sglang.service: invocation %s ended after 1.0s, while starting. Last 0 journal lines of the "
                    "invocation:\n(no journal entries)" % NEW)
    assert "Cause" not in text


# --------------------------------------------------------------------------- compared_text

def test_compared_text_names_the_keys_and_the_source():
    intent = Intent(EXPECT_2048, None, ["/py"], {"A": "1"})
    assert msgs.compared_text(intent, "journal", 1, True, True) == (
        "compared block_size=16, compact_cache=True, draft_window_size=2048 (config line in its journal); its "
        "command line; its environment")
    assert msgs.compared_text(intent, "receipt", 2, False, False) == (
        "compared block_size=16, compact_cache=True, draft_window_size=2048 (2 config lines from the receipt of its "
        "verification)")


def test_compared_text_never_says_agrees_when_nothing_was_compared():
    nothing = msgs.compared_text(Intent({}, "optional"), "none", 0, False, False)
    assert nothing == "nothing was compared (no expectation given): readiness only"
    # expected keys but no line compared (accepted without evidence): not claimed as compared
    assert msgs.compared_text(Intent(EXPECT_2048), "none", 0, False, False) == nothing
    assert "agrees" not in nothing
    assert msgs.compared_text(Intent({}, "optional"), "none", 0, True, False) == "compared its command line"


def test_compared_text_for_off():
    assert msgs.compared_text(Intent({}, "absent"), "journal", 0, False, False) == (
        "compared no draft-runner line, as intended (speculative decoding off)")


def test_unverified_message():
    text = msgs.unverified_message(UNIT, NEW, "the journal lost it", Intent(EXPECT_2048))
    assert text.startswith("sglang.service: invocation %s answers /generate, but there is no evidence" % NEW)
    assert "(unverified): the journal lost it" in text
    assert "Its config line was needed for {" in text
    assert all(part in text for part in ("'block_size': 16", "'compact_cache': True", "'draft_window_size': 2048"))
    assert "/server_info only echoes the parsed arguments and does not count" in text
    off = msgs.unverified_message(UNIT, NEW, "r", Intent({}, "absent"))
    assert "needed for proving speculative decoding is off" in off


# --------------------------------------------------------------------------- completeness_reason

def test_completeness_reasons():
    notices = [{"count": 100, "message": "Suppressed 100 messages from sglang.service"},
               {"count": None, "message": "Suppressed some"},
               {"count": 21, "message": "Suppressed 21 messages from sglang.service"}]
    lost = msgs.completeness_reason("lost", notices, UNIT, NEW, "/var/lib/r")
    assert lost == ("journald's rate limit dropped 121 messages of sglang.service during invocation %s (Suppressed 21 "
                    "messages from sglang.service), so its config line was lost" % NEW)
    no_start = msgs.completeness_reason("no_start", [], UNIT, NEW, "/var/lib/r")
    assert "no longer holds the start of invocation %s" % NEW in no_start
    assert "journal retention or vacuuming" in no_start and "no receipt" in no_start and "/var/lib/r" in no_start
    incomplete = msgs.completeness_reason("incomplete", [], UNIT, NEW, "/var/lib/r")
    assert incomplete == ("nothing that SGLang logs after its config line has reached the journal yet, so it cannot "
                          "be told whether journald dropped the line")


def test_a_followers_pass_says_what_its_own_evidence_is_and_that_the_head_serves_for_the_group():
    text = msgs.follower_passed("sglang.service", NEW, "compared its command line", 10)
    assert text == ("sglang.service: invocation %s joined its serving group as a follower node (its journal: every "
                    "local scheduler ready and stayed up for min_ready_seconds 10 since; compared its command line; "
                    "the head's /generate is the group's)" % NEW)
    assert "stayed up" not in msgs.follower_passed("sglang.service", NEW, "x", 0)
