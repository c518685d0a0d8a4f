# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The args builder: flags per SGLang version, expectations, validation, systemd quoting."""
import re

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils import _args
from ansible_collections.gpufleet.inference.plugins.module_utils._args import (
    SettingsError, build_args, build_expect, render_execstart, systemd_quote, validate)

KEY = "s3cr3t-KEY.value"


def k26(**overrides):
    """Kimi K2.6 with DFlash on 8 GPUs, as the example inventory runs it."""
    settings = {
        "sglang_python": "/opt/sglang/venv/bin/python",
        "sglang_model_path": "/models/Kimi-K2.6",
        "sglang_served_model_name": "kimi-k2.6",
        "sglang_tp_size": 8,
        "sglang_host": "127.0.1.2",
        "sglang_port": 30000,
        "sglang_speculative_algorithm": "DFLASH",
        "sglang_speculative_draft_model_path": "/models/Kimi-K2.6-DFlash",
        "sglang_speculative_num_draft_tokens": 16,
        "sglang_speculative_draft_window_size": 2048,
    }
    settings.update(overrides)
    return settings


def flag_value(args, flag):
    return args[args.index(flag) + 1]


# ----------------------------------------------------------------------- flags per version

@pytest.mark.parametrize("version, window_flag, absent", [
    ("0.5.11", "--speculative-dflash-draft-window-size", "--speculative-draft-window-size"),
    ("0.5.12", "--speculative-draft-window-size", "--speculative-dflash-draft-window-size"),
    ("0.5.19", "--speculative-draft-window-size", "--speculative-dflash-draft-window-size"),
    ("0.5.23", "--speculative-draft-window-size", "--speculative-dflash-draft-window-size"),
    ("0.5.12rc1", "--speculative-draft-window-size", "--speculative-dflash-draft-window-size"),
    ("0.5.11.post1", "--speculative-dflash-draft-window-size", "--speculative-draft-window-size"),
])
def test_window_flag_per_version(version, window_flag, absent):
    args = build_args(k26(), version)
    assert flag_value(args, window_flag) == "2048"
    assert absent not in args
    assert flag_value(args, "--speculative-num-draft-tokens") == "16"


def test_full_args_k26_0_5_23():
    assert build_args(k26(), "0.5.23") == [
        "--model-path", "/models/Kimi-K2.6",
        "--served-model-name", "kimi-k2.6",
        "--tp-size", "8",
        "--host", "127.0.1.2",
        "--port", "30000",
        "--speculative-algorithm", "DFLASH",
        "--speculative-draft-model-path", "/models/Kimi-K2.6-DFlash",
        "--speculative-num-draft-tokens", "16",
        "--speculative-draft-window-size", "2048",
    ]


def test_dflash_on_0_5_10_fails_naming_the_version():
    with pytest.raises(SettingsError, match=r"sglang_speculative_algorithm is DFLASH but SGLang"
                                            r" 0\.5\.10 \(sglang_version\) has no DFLASH"):
        build_args(k26(), "0.5.10")


def test_no_speculative_algorithm_on_0_5_10_is_fine():
    settings = k26(sglang_speculative_algorithm="none", sglang_speculative_draft_model_path="",
                   sglang_speculative_num_draft_tokens=None,
                   sglang_speculative_draft_window_size=None)
    args = build_args(settings, "0.5.10")
    assert not any(arg.startswith("--speculative") for arg in args)


def test_no_window_means_no_window_flag():
    args = build_args(k26(sglang_speculative_draft_window_size=None), "0.5.12")
    assert not any("window" in arg for arg in args)


def test_ddtree_flags():
    settings = k26(sglang_speculative_algorithm="DDTREE", sglang_speculative_draft_window_size=None,
                   sglang_speculative_tree_budget=64, sglang_speculative_eagle_topk=4)
    args = build_args(settings, "0.5.23")
    assert flag_value(args, "--speculative-ddtree-tree-budget") == "64"
    assert flag_value(args, "--speculative-eagle-topk") == "4"
    assert _args.TREE_BUDGET_FLAG in _args.flags_for_key("tree_budget")


def test_eagle_window_is_dflash_only_on_0_5_11():
    settings = k26(sglang_speculative_algorithm="EAGLE3")
    with pytest.raises(SettingsError, match="DFLASH-only setting in SGLang 0.5.11"):
        build_args(settings, "0.5.11")
    assert "--speculative-draft-window-size" in build_args(settings, "0.5.12")


def test_empty_version_is_refused():
    with pytest.raises(SettingsError, match="sglang_version is empty"):
        build_args(k26(), "")
    with pytest.raises(SettingsError, match="sglang_version 'latest' is not a version"):
        build_args(k26(), "latest")


def test_digit_strings_from_extra_vars_are_accepted():
    args = build_args(k26(sglang_tp_size="8", sglang_port="30000"), "0.5.12")
    assert flag_value(args, "--tp-size") == "8"


def test_expect_key_flags_kept_for_the_wait_module():
    assert "--speculative-draft-window-size" in _args.flags_for_key("draft_window_size")
    assert "--speculative-num-draft-tokens" in _args.flags_for_key("block_size")
    assert _args.flags_for_key("nothing") == ()


# ----------------------------------------------------------------------- expectations

@pytest.mark.parametrize("version", ["0.5.11", "0.5.12", "0.5.19", "0.5.23"])
def test_expect_dflash_with_window(version):
    assert build_expect(k26(), version) == {
        "block_size": 16, "draft_window_size": 2048, "compact_cache": True}


def test_expect_dflash_without_window():
    assert build_expect(k26(sglang_speculative_draft_window_size=None), "0.5.12") == {
        "block_size": 16, "draft_window_size": None, "compact_cache": False}


def test_expect_dflash_block_size_left_to_sglang():
    expect = build_expect(k26(sglang_speculative_num_draft_tokens=None), "0.5.12")
    assert expect == {"draft_window_size": 2048, "compact_cache": True}


def test_expect_ddtree():
    settings = k26(sglang_speculative_algorithm="DDTREE", sglang_speculative_draft_window_size=None,
                   sglang_speculative_tree_budget=128)
    assert build_expect(settings, "0.5.23") == {"block_size": 16, "tree_budget": 128}


@pytest.mark.parametrize("algorithm", ["none", None, "", "EAGLE", "EAGLE3", "NEXTN", "STANDALONE",
                                       "NGRAM"])
def test_expect_other_algorithms_is_empty(algorithm):
    settings = k26(sglang_speculative_algorithm=algorithm, sglang_speculative_draft_window_size=None,
                   sglang_speculative_num_draft_tokens=None)
    if algorithm in ("none", None, ""):
        settings["sglang_speculative_draft_model_path"] = None
    assert build_expect(settings, "0.5.23") == {}


# ----------------------------------------------------------------------- validation

@pytest.mark.parametrize("overrides, message", [
    ({"sglang_speculative_num_draft_tokens": 2048, "sglang_speculative_draft_window_size": 1024},
     "sglang_speculative_draft_window_size (1024) must be >= sglang_speculative_num_draft_tokens"
     " (2048): SGLang refuses a DFlash window smaller than its block size"),
    ({"sglang_speculative_draft_model_path": ""},
     "sglang_speculative_draft_model_path is required when sglang_speculative_algorithm is DFLASH"),
    ({"sglang_speculative_algorithm": "DDTREE", "sglang_speculative_draft_model_path": None,
      "sglang_speculative_draft_window_size": None},
     "sglang_speculative_draft_model_path is required when sglang_speculative_algorithm is DDTREE"),
    ({"sglang_tp_size": 0}, "sglang_tp_size must be a positive integer, got 0"),
    ({"sglang_tp_size": -8}, "sglang_tp_size must be a positive integer, got -8"),
    ({"sglang_tp_size": True}, "sglang_tp_size must be a positive integer, got True (a boolean)"),
    ({"sglang_tp_size": 8.5}, "sglang_tp_size must be a positive integer, got 8.5"),
    ({"sglang_tp_size": "eight"}, "sglang_tp_size must be a positive integer, got 'eight'"),
    ({"sglang_port": 70000}, "sglang_port must be <= 65535"),
    ({"sglang_port": None}, "sglang_port is required"),
    ({"sglang_speculative_draft_window_size": 0},
     "sglang_speculative_draft_window_size must be a positive integer, got 0"),
    ({"sglang_speculative_draft_window_size": False},
     "sglang_speculative_draft_window_size must be a positive integer, got False (a boolean)"),
    ({"sglang_speculative_num_draft_tokens": -1},
     "sglang_speculative_num_draft_tokens must be a positive integer, got -1"),
    ({"sglang_speculative_eagle_topk": 1.5},
     "sglang_speculative_eagle_topk must be a positive integer, got 1.5"),
    ({"sglang_speculative_num_steps": 0},
     "sglang_speculative_num_steps must be a positive integer, got 0"),
    ({"sglang_speculative_tree_budget": 0},
     "sglang_speculative_tree_budget must be a positive integer, got 0"),
    ({"sglang_speculative_tree_budget": 64},
     "sglang_speculative_tree_budget is a DDTREE setting; sglang_speculative_algorithm is DFLASH"),
    ({"sglang_speculative_algorithm": "MEDUSA"}, "sglang_speculative_algorithm must be one of"),
    ({"sglang_speculative_algorithm": "none"},
     "sglang_speculative_draft_window_size is set (2048) but sglang_speculative_algorithm is none"),
    ({"sglang_model_path": ""}, "sglang_model_path is required"),
    ({"sglang_model_path": "/models/a\nExecStartPre=/bin/evil"},
     "sglang_model_path contains a newline or control character"),
    ({"sglang_served_model_name": "kimi\r"},
     "sglang_served_model_name contains a newline or control character"),
    ({"sglang_host": "127.0.0.1\x00"}, "sglang_host contains a newline or control character"),
    ({"sglang_speculative_draft_model_path": "/m\tx"},
     "sglang_speculative_draft_model_path contains a newline or control character"),
    ({"sglang_python": "python3"}, "sglang_python must be an absolute path"),
    ({"sglang_python": "/opt/my venv/bin/python"}, "sglang_python must be an absolute path"),
    ({"sglang_python": "/opt/$HOME/python"}, "sglang_python must be an absolute path"),
    ({"sglang_env_file": "/etc/sglang/a b.env"}, "sglang_env_file must be an absolute path"),
    ({"sglang_unit_name": "sglang"}, "sglang_unit_name must be a unit name ending in .service"),
    ({"sglang_user": "Bad User"}, "sglang_user must be a user/group name"),
    ({"sglang_group": "x;y"}, "sglang_group must be a user/group name"),
    ({"sglang_extra_args": ["--enable-metrics"]}, "sglang_extra_args must be a mapping"),
    ({"sglang_extra_args": {"enable-metrics": True}},
     "sglang_extra_args key 'enable-metrics' is not a --flag"),
    ({"sglang_extra_args": {"--mem-fraction-static=0.8": True}},
     "sglang_extra_args key '--mem-fraction-static=0.8' is not a --flag"),
    ({"sglang_extra_args": {"--port": 1}},
     "sglang_extra_args['--port'] collides with a flag the role manages: set sglang_port instead"),
    ({"sglang_extra_args": {"--api-key": "x"}},
     "sglang_extra_args['--api-key'] collides with a flag the role manages: set sglang_api_key"),
    ({"sglang_extra_args": {"--tp": 4}},
     "sglang_extra_args['--tp'] collides with a flag the role manages: set sglang_tp_size"),
    ({"sglang_extra_args": {"--model": "/x"}},
     "sglang_extra_args['--model'] collides with a flag the role manages: set sglang_model_path"),
    ({"sglang_extra_args": {"--speculative-dflash-draft-window-size": 4096}},
     "collides with a flag the role manages: set sglang_speculative_draft_window_size"),
    ({"sglang_extra_args": {"--speculative-dflash-block-size": 16}},
     "collides with a flag the role manages: set sglang_speculative_num_draft_tokens"),
    ({"sglang_extra_args": {"--log-level": "info\nExecStartPre=/bin/evil"}},
     "sglang_extra_args['--log-level'] contains a newline or control character"),
    ({"sglang_extra_args": {"--json-model-override-args": {"a": 1}}},
     "sglang_extra_args['--json-model-override-args'] must be a string, number, true or a list"),
    ({"sglang_environment": {"BAD NAME": "x"}},
     "sglang_environment key 'BAD NAME' is not a valid environment variable name"),
    ({"sglang_environment": {"SGLANG_API_KEY": "x"}},
     "sglang_environment['SGLANG_API_KEY'] is reserved for the API key: set sglang_api_key"),
    ({"sglang_environment": {"A": "x\ny"}},
     "sglang_environment['A'] contains a newline or control character"),
    ({"sglang_api_key": "has space"}, "sglang_api_key must be a string without whitespace"),
    ({"sglang_api_key": "a$b"}, "sglang_api_key must be a string without whitespace"),
    ({"sglang_api_key": 'a"b'}, "sglang_api_key must be a string without whitespace"),
])
def test_validation_names_the_variable(overrides, message):
    with pytest.raises(SettingsError) as caught:
        validate(k26(**overrides))
    assert message in str(caught.value)
    # the same error from everything that builds from the settings
    with pytest.raises(SettingsError):
        build_args(k26(**overrides), "0.5.23")


def test_validation_never_echoes_the_api_key():
    bad = "sec ret$"
    with pytest.raises(SettingsError) as caught:
        validate(k26(sglang_api_key=bad))
    assert bad not in str(caught.value)


def test_all_errors_reported_at_once():
    with pytest.raises(SettingsError) as caught:
        validate(k26(sglang_tp_size=0, sglang_port=0))
    assert "sglang_tp_size" in str(caught.value) and "sglang_port" in str(caught.value)


def test_valid_settings_pass():
    assert validate(k26()) is True
    assert validate(k26(), "0.5.11") is True


def test_settings_must_be_a_mapping():
    with pytest.raises(SettingsError, match="settings must be a mapping"):
        validate(["--port", "1"])


# ----------------------------------------------------------------------- extra_args

def test_extra_args_rendering():
    extra = {
        "--enable-metrics": True,          # bare flag
        "--disable-radix-cache": False,    # switched off
        "--log-level": None,               # switched off
        "--mem-fraction-static": 0.85,
        "--cuda-graph-bs": [1, 2, 4, 8],   # nargs
        "--chunked-prefill-size": 8192,
        "--json-model-override-args": '{"rope_scaling": null}',
    }
    args = build_args(k26(sglang_extra_args=extra), "0.5.23")
    tail = args[args.index("2048") + 1:]
    assert tail == ["--enable-metrics", "--mem-fraction-static", "0.85",
                    "--cuda-graph-bs", "1", "2", "4", "8",
                    "--chunked-prefill-size", "8192",
                    "--json-model-override-args", '{"rope_scaling": null}']


def test_extra_args_unrelated_speculative_flag_is_allowed():
    args = build_args(k26(sglang_extra_args={"--speculative-draft-attention-backend": "fa3"}),
                      "0.5.23")
    assert flag_value(args, "--speculative-draft-attention-backend") == "fa3"


# ----------------------------------------------------------------------- quoting, api key

@pytest.mark.parametrize("raw, quoted", [
    ("plain", '"plain"'),
    ("with space", '"with space"'),
    ("50%", '"50%%"'),
    ("%h-%i", '"%%h-%%i"'),
    ("$HOME", '"$$HOME"'),
    ("${X}", '"$${X}"'),
    ('say "hi"', '"say \\"hi\\""'),
    ("back\\slash", '"back\\\\slash"'),
    ("trailing\\", '"trailing\\\\"'),
    ("it's", "\"it's\""),
    (";", '";"'),
    ("", '""'),
    (8, '"8"'),
    ("ünï", '"ünï"'),
])
def test_systemd_quote(raw, quoted):
    assert systemd_quote(raw) == quoted


@pytest.mark.parametrize("raw", ["a\nb", "a\rb", "a\x00b", "a\x1bb", "a\x7fb", "tab\there"])
def test_systemd_quote_rejects_control_characters(raw):
    with pytest.raises(SettingsError, match="newline or control character"):
        systemd_quote(raw)


def test_systemd_quote_env_keeps_dollar():
    assert _args.systemd_quote_env("A", '5$ 10% "x"\\') == '"A=5$ 10%% \\"x\\"\\\\"'


def test_api_key_never_in_args_or_execstart():
    settings = k26(sglang_api_key=KEY)
    for version in ("0.5.11", "0.5.12", "0.5.23"):
        args = build_args(settings, version)
        assert KEY not in " ".join(args)
        assert "--api-key" not in args
        execstart = render_execstart(settings, version)
        assert KEY not in execstart
        assert execstart.endswith('"--api-key" \\\n    "${SGLANG_API_KEY}"')
        # exactly one unescaped $ in the whole ExecStart
        assert len(re.findall(r"(?<!\$)\$(?!\$)", execstart)) == 1


def test_execstart_without_api_key_has_no_key_reference():
    execstart = render_execstart(k26(), "0.5.12")
    assert "api-key" not in execstart and "SGLANG_API_KEY" not in execstart


def test_execstart_one_argument_per_line():
    settings = k26(sglang_extra_args={"--note": "50% of $HOME"})
    lines = render_execstart(settings, "0.5.11").split("\n")
    assert lines[0] == '"/opt/sglang/venv/bin/python" \\'
    assert lines[1:3] == ['    "-m" \\', '    "sglang.launch_server" \\']
    assert '    "--speculative-dflash-draft-window-size" \\' in lines
    assert lines[-1] == '    "50%% of $$HOME"'
    assert all(line.endswith(" \\") for line in lines[:-1])
    assert len(lines) == 3 + len(build_args(settings, "0.5.11"))
