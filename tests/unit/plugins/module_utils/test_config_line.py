# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils import _config_line as cfg

TP1 = ("[2026-11-29 10:00:00] Initialized DFLASH draft runner. attention_backend=flashinfer, "
       "model=DFlashDraftModel, block_size=16, draft_window_size=2048, compact_cache=True")
TP0 = ("[2026-11-29 10:00:00 TP0] Initialized DFLASH draft runner. attention_backend=flashinfer, "
       "model=DFlashDraftModel, block_size=16, draft_window_size=2048, compact_cache=True")
NO_WINDOW = ("[2026-11-29 10:00:00 TP0] Initialized DFLASH draft runner. attention_backend=fa3, "
             "model=DFlash2DraftModel, block_size=8, draft_window_size=None, compact_cache=False")
DDTREE = "[2026-11-29 10:00:00 TP0 EP0] Initialized DDTree worker. block_size=16, tree_budget=64, max_tree_nodes=128"


def test_tp1_line_without_rank_tag():
    parsed = cfg.parse_config_line(TP1)
    assert parsed["rank0"] and parsed["tags"] == {}
    assert parsed["kind"] == "dflash"
    assert parsed["values"] == {"attention_backend": "flashinfer", "model": "DFlashDraftModel", "block_size": 16,
                                "draft_window_size": 2048, "compact_cache": True}


def test_tp0_line():
    parsed = cfg.parse_config_line(TP0)
    assert parsed["tags"] == {"TP": 0} and parsed["rank0"]
    assert parsed["timestamp"] == "2026-11-29 10:00:00"


def test_none_and_false_values():
    values = cfg.parse_config_line(NO_WINDOW)["values"]
    assert values["draft_window_size"] is None
    assert values["compact_cache"] is False
    assert values["model"] == "DFlash2DraftModel"


@pytest.mark.parametrize("prefix,tags", [
    ("[2026-11-29 10:00:00 TP3]", {"TP": 3}),
    ("[2026-11-29 10:00:00 DP1 TP7]", {"DP": 1, "TP": 7}),
    ("[2026-11-29 10:00:00 DP3 TP3 EP3]", {"DP": 3, "TP": 3, "EP": 3}),
    ("[2026-11-29 10:00:00 PP2 ATTN_CP3 TP3 EP3]", {"PP": 2, "ATTN_CP": 3, "TP": 3, "EP": 3}),
    ("[2026-11-29 10:00:00 DP1 MOE_DP1 TP7]", {"DP": 1, "MOE_DP": 1, "TP": 7}),
    ("[2026-11-29 10:00:00 DP2 PP1 ATTN_CP1 MOE_DP2 TP5 EP5]",
     {"DP": 2, "PP": 1, "ATTN_CP": 1, "MOE_DP": 2, "TP": 5, "EP": 5}),
])
def test_other_ranks_are_not_rank0(prefix, tags):
    parsed = cfg.parse_config_line(prefix + " Initialized DFLASH draft runner. block_size=16, draft_window_size=None")
    assert parsed is not None and not parsed["rank0"]
    # MOE_DP is its own tag, never read as a DP tag; ATTN_CP is never read as anything else
    assert parsed["tags"] == tags


@pytest.mark.parametrize("prefix,tags", [
    ("[2026-11-29 10:00:00 DP1 TP0]", {"DP": 1, "TP": 0}),
    ("[2026-11-29 10:00:00 TP0 EP0]", {"TP": 0, "EP": 0}),
    ("[2026-11-29 10:00:00 PP2 ATTN_CP3 TP0 EP3]", {"PP": 2, "ATTN_CP": 3, "TP": 0, "EP": 3}),
    ("[2026-11-29 10:00:00 DP3 TP0 EP0]", {"DP": 3, "TP": 0, "EP": 0}),
    ("[2026-11-29 10:00:00 DP1 MOE_DP1 TP0]", {"DP": 1, "MOE_DP": 1, "TP": 0}),
    ("[2026-11-29 10:00:00 MOE_DP3 TP0]", {"MOE_DP": 3, "TP": 0}),
    ("[2026-11-29 10:00:00 DP0 PP0 ATTN_CP0 MOE_DP0 TP0 EP0]",
     {"DP": 0, "PP": 0, "ATTN_CP": 0, "MOE_DP": 0, "TP": 0, "EP": 0}),
    ("[2026-11-29T10:00:00,5 TP0]", {"TP": 0}),
    ("[2026-11-29 10:00:00.123 TP0]", {"TP": 0}),
    ("[2026-11-29 10:00:00.123]", {}),
])
def test_rank_tags_and_milliseconds(prefix, tags):
    parsed = cfg.parse_config_line(prefix + " Initialized DFLASH draft runner. block_size=16, draft_window_size=2048")
    assert parsed["tags"] == tags and parsed["rank0"]
    assert parsed["values"] == {"block_size": 16, "draft_window_size": 2048}


def test_docker_timestamps_wrapping():
    line = "2026-11-29T10:00:00.123456789Z " + TP0
    assert cfg.parse_config_line(line)["values"]["draft_window_size"] == 2048


def test_ray_wrapping_with_repeat_suffix_and_colours():
    line = ("\x1b[36m(SchedulerActor pid=4242)\x1b[0m " + TP0 + " [repeated 7x across cluster]")
    parsed = cfg.parse_config_line(line)
    assert parsed["values"]["compact_cache"] is True
    assert parsed["rank0"]
    ray_tp3 = "(SchedulerActor pid=4243) " + TP0.replace("TP0", "TP3") + " [repeated 7x across cluster]"
    assert not cfg.parse_config_line(ray_tp3)["rank0"]


def test_ddtree_line():
    parsed = cfg.parse_config_line(DDTREE)
    assert parsed["kind"] == "ddtree"
    assert parsed["values"] == {"block_size": 16, "tree_budget": 64, "max_tree_nodes": 128}


@pytest.mark.parametrize("line", [
    "", None, "garbage", "[2026-11-29 10:00:00 TP0] Load weight end. elapsed=12.3 s, type=DeepseekV3",
    "[2026-11-29 10:00:00 TP0] Initialized DFLASH draft runner.",
    "[2026-11-29 10:00:00 TP0] DFLASH draft runner ready. mask_token=151669",
])
def test_garbage_is_not_a_config_line(line):
    assert cfg.parse_config_line(line) is None


def test_floats_strings_quotes():
    parsed = cfg.parse_config_line(
        "[2026-11-29 10:00:00] Initialized DDTree worker. block_size=16, tree_budget=1.5, name='a b', path=/x/y")
    assert parsed["values"] == {"block_size": 16, "tree_budget": 1.5, "name": "a b", "path": "/x/y"}


def test_find_config_line_skips_other_ranks():
    lines = ["noise", TP0.replace("TP0", "TP3").replace("2048", "7"), TP0, NO_WINDOW]
    assert cfg.find_config_line(lines)["values"]["draft_window_size"] == 2048
    assert cfg.find_config_line(["noise", TP0.replace("TP0", "TP1")]) is None


def test_find_config_lines_returns_every_rank0_line_in_order():
    # a re-initialised draft worker logs again; other TP ranks never count; each DP rank's TP0 does
    lines = ["noise", TP0, TP0.replace("TP0", "TP3").replace("2048", "7"), NO_WINDOW,
             TP0.replace("TP0", "DP1 MOE_DP1 TP0").replace("2048", "512"), DDTREE, "garbage"]
    found = cfg.find_config_lines(lines)
    assert [line["values"].get("draft_window_size") for line in found] == [2048, None, 512, None]
    assert [line["kind"] for line in found] == ["dflash", "dflash", "dflash", "ddtree"]
    assert found[2]["tags"] == {"DP": 1, "MOE_DP": 1, "TP": 0}
    assert cfg.find_config_lines([]) == [] and cfg.find_config_line([]) is None


def test_a_tag_that_is_not_sglangs_makes_the_line_no_config_line():
    # "[... GPU3]" is not SGLang's logging prefix, so the line is not in SGLang's shape
    assert cfg.parse_config_line("[2026-11-29 10:00:00 GPU3] Initialized DFLASH draft runner. block_size=16") is None
    assert cfg.parse_config_line("[x] Initialized DDTree worker. block_size=16") is None


# What SGLang's --log-requests writes (sglang/srt/utils/request_logger.py: "Receive: obj=..." and
# "Finish: obj=..., out=...", the text through repr; 0.5.11 without a prefix, 0.5.12+ with "[ts] ").
QUOTED = "[2026-11-29 09:00:00 TP0] Initialized DFLASH draft runner. attention_backend=fa3, model=M, " \
         "block_size=16, draft_window_size=None, compact_cache=False"


@pytest.mark.parametrize("line", [
    "[2026-11-29 10:05:00] Receive: obj=GenerateReqInput(text=%r, input_ids=None)" % ("why does " + QUOTED),
    "[2026-11-29 10:05:00] Receive: obj=GenerateReqInput(text=%r, input_ids=None)" % QUOTED,
    "Receive: obj=GenerateReqInput(text=%r, input_ids=None)" % QUOTED,
    "[2026-11-29 10:05:01] Finish: obj=GenerateReqInput(text='x'), out={'text': %r}" % QUOTED,
    '[2026-11-29 10:05:01] {"timestamp": "2026-11-29T10:05:01", "event": "request.received", "obj": {"text": "%s"}}'
    % QUOTED,
    "user said: " + QUOTED,
    "  " + QUOTED,  # indented: a continuation, not a line SGLang's logger wrote
    "[2026-11-29 10:05:00] INFO:     127.0.0.1:5 - \"POST /generate?q=%s HTTP/1.1\" 200 OK" % QUOTED,
])
def test_a_line_that_quotes_a_config_line_is_not_one(line):
    assert cfg.parse_config_line(line) is None
    assert cfg.find_config_lines([line]) == []


def test_the_quoted_line_itself_is_a_config_line():
    # the control: the same text as SGLang logs it is recognised
    assert cfg.parse_config_line(QUOTED)["values"]["draft_window_size"] is None


def test_split_line_gives_timestamp_tags_and_message():
    assert cfg.split_line("[2026-11-29 10:00:00 DP1 TP3] Load weight begin.") == (
        "2026-11-29 10:00:00", {"DP": 1, "TP": 3}, "Load weight begin.")
    assert cfg.split_line("[2026-11-29 10:00:00] INFO:     Uvicorn running on http://h:1") == (
        "2026-11-29 10:00:00", {}, "INFO:     Uvicorn running on http://h:1")
    assert cfg.split_line("Loading safetensors checkpoint shards: 50% Completed") is None
    assert cfg.split_line("") is None and cfg.split_line(None) is None


@pytest.mark.parametrize("expected,observed", [
    ("2048", 2048), (2048, 2048), ("None", None), (None, None), ("null", None), ("true", True), (True, True),
    ("True", True), ("false", False), ("16", 16.0), ("flashinfer", "flashinfer"), (" 2048 ", 2048),
])
def test_values_equal_with_coercion(expected, observed):
    assert cfg.values_equal(expected, observed)


@pytest.mark.parametrize("expected,observed", [
    ("2048", None), (None, 2048), ("None", False), (True, 1), (1, True), ("true", False), ("1024", 2048),
    ("fa3", "flashinfer"), (False, 0), (0, False), ("1", True), ("yes", 1), (None, False), (None, 0),
    (2048, "2048x"),
])
def test_values_differ(expected, observed):
    assert not cfg.values_equal(expected, observed)


def test_compare_reports_every_key():
    observed = cfg.parse_config_line(NO_WINDOW)["values"]
    mismatches = cfg.compare({"draft_window_size": "2048", "compact_cache": "true", "block_size": 8, "tree_budget": 4},
                             observed)
    assert [m["key"] for m in mismatches] == ["compact_cache", "draft_window_size", "tree_budget"]
    assert mismatches[1] == {"key": "draft_window_size", "expected": 2048, "observed": None}
    assert mismatches[2]["observed"] is cfg.ABSENT
    assert cfg.compare({"block_size": "8"}, observed) == []


def test_normalize_expect():
    assert cfg.normalize_expect({"a": "2048", "b": "None", "c": "true", "d": "fa3"}) == \
        {"a": 2048, "b": None, "c": True, "d": "fa3"}


def test_render():
    assert cfg.render(None) == "None"
    assert cfg.render(2048) == "2048"
    assert cfg.render("fa3") == "'fa3'"
    assert "not logged" in cfg.render(cfg.ABSENT)


def test_compare_keeps_true_and_1_apart():
    mismatches = cfg.compare({"compact_cache": True, "block_size": 1}, {"compact_cache": 1, "block_size": True})
    assert [(m["key"], m["expected"], m["observed"]) for m in mismatches] == [
        ("block_size", 1, True), ("compact_cache", True, 1)]
    assert cfg.compare({}, {"a": 1}) == [] and cfg.compare(None, {}) == []


@pytest.mark.parametrize("text,value", [
    ("None", None), ("True", True), ("False", False), ("16", 16), ("-3", -3), ("1.5", 1.5), ("1e3", 1000.0),
    ("'a b'", "a b"), ('"q"', "q"), ("flashinfer", "flashinfer"), (" 7 ", 7), ("'", "'"),
])
def test_parse_value(text, value):
    parsed = cfg.parse_value(text)
    assert parsed == value and type(parsed) is type(value)


@pytest.mark.parametrize("value,normal", [
    ("none", None), ("NULL", None), ("~", None), ("", None), ("yes", True), ("On", True), ("off", False),
    ("NO", False), ("2048", 2048), (2048, 2048), (True, True), (None, None), ("fa3", "fa3"),
])
def test_normalize(value, normal):
    assert cfg.normalize(value) == normal and type(cfg.normalize(value)) is type(normal)


def test_grep_pattern_matches_every_marker():
    import re
    for marker in cfg.MARKERS:
        assert re.search(cfg.GREP_PATTERN, "[t TP0] " + marker + " block_size=1")
