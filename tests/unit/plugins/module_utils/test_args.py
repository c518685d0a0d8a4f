# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The args builder: flags per SGLang version, expectations, validation, systemd quoting."""
import re

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils import _args
from ansible_collections.gpufleet.inference.plugins.module_utils._args import (
    SettingsError, build_args, build_expect, render_execstart, validate)

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
    ({"sglang_config_file": "/etc/sglang/a b.yaml"}, "sglang_config_file must be an absolute path"),
    ({"sglang_config_file": "sglang.yaml"}, "sglang_config_file must be an absolute path"),
    ({"sglang_config_file": "/etc/%i.yaml"}, "sglang_config_file must be an absolute path"),
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
    ({"sglang_api_key": "two\nlines"}, "sglang_api_key must be a string without newlines or control characters"),
    ({"sglang_api_key": "tab\there"}, "sglang_api_key must be a string without newlines or control characters"),
    ({"sglang_api_key": "del\x7f"}, "sglang_api_key must be a string without newlines or control characters"),
    ({"sglang_api_key": 12345}, "sglang_api_key must be a string without newlines or control characters"),
    ({"sglang_api_key": "-starts-with-a-dash"}, "sglang_api_key must not start with '-'"),
    ({"sglang_api_key": "--x"}, "sglang_api_key must not start with '-'"),
    ({"sglang_speculative_algorithm": "FROZEN_KV_MTP", "sglang_speculative_draft_window_size": None,
      "sglang_speculative_num_draft_tokens": None, "sglang_speculative_tree_budget": 8},
     "sglang_speculative_tree_budget is a DDTREE setting; sglang_speculative_algorithm is FROZEN_KV_MTP"),
])
def test_validation_names_the_variable(overrides, message):
    with pytest.raises(SettingsError) as caught:
        validate(k26(**overrides))
    assert message in str(caught.value)
    # the same error from everything that builds from the settings
    with pytest.raises(SettingsError):
        build_args(k26(**overrides), "0.5.23")


@pytest.mark.parametrize("bad", ["sec\nret$", "-sec ret"])
def test_validation_never_echoes_the_api_key(bad):
    with pytest.raises(SettingsError) as caught:
        validate(k26(sglang_api_key=bad))
    assert bad not in str(caught.value) and "sec" not in str(caught.value)


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


# ----------------------------------------------------------------------- api key

@pytest.mark.parametrize("key", [KEY, 'with space, "quotes", $HOME, %i and \\'])
def test_api_key_never_in_args_or_execstart_but_a_config_file(key):
    settings = k26(sglang_api_key=key)
    for version in ("0.5.11", "0.5.12", "0.5.23"):
        args = build_args(settings, version)
        assert key not in " ".join(args) and "--api-key" not in args
        assert args[-2:] == ["--config", "/etc/sglang/sglang.yaml"]
        execstart = render_execstart(settings, version)
        assert key not in execstart and "api-key" not in execstart and "SGLANG_API_KEY" not in execstart
        assert execstart.endswith('"--config" \\\n    "/etc/sglang/sglang.yaml"')
        # no unescaped $ at all: nothing in ExecStart is expanded by systemd any more
        assert re.findall(r"(?<!\$)\$(?!\$)", execstart) == []
        command = _args.build_command(settings, version)
        assert key not in " ".join(command) and command[-1] == "/etc/sglang/sglang.yaml"
        intent = _args.build_intent(settings, version)
        assert key not in repr(intent)


def test_config_file_path():
    assert _args.config_file_path(k26()) == "/etc/sglang/sglang.yaml"
    assert _args.config_file_path(k26(sglang_unit_name="sglang-b.service")) == "/etc/sglang/sglang-b.yaml"
    assert _args.config_file_path(k26(sglang_unit_name="sglang@1.service")) == "/etc/sglang/sglang@1.yaml"
    assert _args.config_file_path(k26(sglang_config_file="/srv/k.yaml")) == "/srv/k.yaml"
    args = build_args(k26(sglang_api_key=KEY, sglang_config_file="/srv/k.yaml"), "0.5.23")
    assert args[-2:] == ["--config", "/srv/k.yaml"]
    assert "--config" not in build_args(k26(sglang_config_file="/srv/k.yaml"), "0.5.23")  # no key, no file


@pytest.mark.parametrize("key", [KEY, 'quo"te', "back\\slash\\", "it's", "k: v # c", "- dash", "true", "123", "null",
                                 "~", "${X}", "%p", "caf\u00e9", "\U0001f600-emoji", "a\u2028b\u0085c", "\\u00e9"])
def test_config_file_text_reads_back_as_the_key(key):
    import yaml  # what SGLang reads --config with (yaml.safe_load)
    text = _args.config_file_text(k26(sglang_api_key=key))
    assert text.startswith('api-key: "') and text.endswith('"\n') and text.count("\n") == 1
    assert yaml.safe_load(text) == {"api-key": key}


def test_config_file_text_without_a_key():
    assert _args.config_file_text(k26()) == "{}\n"
    assert _args.config_file_text(k26(sglang_api_key="")) == "{}\n"


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


# ----------------------------------------------------------------------- algorithms by version

def plain(algorithm, **overrides):
    """An algorithm without DFLASH's window/block settings."""
    settings = dict(sglang_speculative_algorithm=algorithm, sglang_speculative_draft_window_size=None,
                    sglang_speculative_num_draft_tokens=None)
    settings.update(overrides)
    return k26(**settings)


def test_algorithms():
    assert _args.ALGORITHMS == ("none", "DFLASH", "EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM",
                                "FROZEN_KV_MTP", "DSPARK", "UNO", "DDTREE")


@pytest.mark.parametrize("algorithm,first,before", [
    ("DFLASH", "0.5.11", "0.5.10"),
    ("FROZEN_KV_MTP", "0.5.12", "0.5.11"),
    ("DSPARK", "0.5.16", "0.5.15"),
    ("UNO", "0.5.20", "0.5.19.post1"),
])
def test_algorithm_version_floors(algorithm, first, before):
    settings = k26() if algorithm == "DFLASH" else plain(algorithm)
    args = build_args(settings, first)
    assert flag_value(args, "--speculative-algorithm") == algorithm
    assert validate(settings, first + "rc1") is True
    with pytest.raises(SettingsError) as caught:
        build_args(settings, before)
    assert ("sglang_speculative_algorithm is %s but SGLang %s (sglang_version) has no %s: it arrived in %s"
            % (algorithm, before, algorithm, first)) in str(caught.value)
    # without a version only the version-independent checks run
    assert validate(settings) is True


def test_ddtree_is_not_version_checked():
    # no public release has it: the host's own parser (preflight) judges it, whatever the version
    settings = plain("DDTREE", sglang_speculative_tree_budget=64)
    for version in ("0.5.10", "0.5.11", "0.5.23"):
        assert flag_value(build_args(settings, version), "--speculative-algorithm") == "DDTREE"
    assert "DDTREE" not in _args.ALGORITHM_SINCE and "DDTREE" in _args.CUSTOM_BUILD_ALGORITHMS


@pytest.mark.parametrize("algorithm", ["EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "FROZEN_KV_MTP",
                                       "DSPARK", "UNO"])
def test_other_algorithms_build_without_expectations(algorithm):
    settings = plain(algorithm, sglang_speculative_eagle_topk=4, sglang_speculative_num_steps=3)
    args = build_args(settings, "0.5.23")
    assert flag_value(args, "--speculative-eagle-topk") == "4" and flag_value(args, "--speculative-num-steps") == "3"
    assert build_expect(settings, "0.5.23") == {}


# ----------------------------------------------------------------------- intent

def test_build_intent_for_dflash_requires_the_line():
    settings = k26(sglang_environment={"NCCL_DEBUG": "WARN", "A": True}, sglang_api_key=KEY)
    intent = _args.build_intent(settings, "0.5.23")
    assert intent == {"expect": {"block_size": 16, "draft_window_size": 2048, "compact_cache": True},
                      "config_line": "required", "command": _args.build_command(settings, "0.5.23"),
                      "environment": {"NCCL_DEBUG": "WARN", "A": "1"}}
    assert intent["command"][:3] == ["/opt/sglang/venv/bin/python", "-m", "sglang.launch_server"]


def test_build_intent_for_ddtree_requires_the_line():
    settings = plain("DDTREE", sglang_speculative_tree_budget=64, sglang_speculative_num_draft_tokens=8)
    intent = _args.build_intent(settings, "0.5.23")
    assert intent["config_line"] == "required" and intent["expect"] == {"block_size": 8, "tree_budget": 64}


@pytest.mark.parametrize("algorithm", ["none", "EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "FROZEN_KV_MTP",
                                       "DSPARK", "UNO"])
def test_build_intent_off_and_other_algorithms_forbid_a_draft_runner_line(algorithm):
    settings = plain(algorithm)
    if algorithm == "none":
        settings["sglang_speculative_draft_model_path"] = None
    intent = _args.build_intent(settings, "0.5.23")
    assert intent["config_line"] == "absent" and intent["expect"] == {} and intent["environment"] == {}


def test_build_intent_refuses_what_build_args_refuses():
    with pytest.raises(SettingsError, match="sglang_version is empty"):
        _args.build_intent(k26(), None)
    with pytest.raises(SettingsError, match="has no DFLASH"):
        _args.build_intent(k26(), "0.5.10")


# ----------------------------------------------------------------------- /server_info

@pytest.mark.parametrize("version,window_key", [
    ("0.5.11", "speculative_dflash_draft_window_size"),
    ("0.5.11.post1", "speculative_dflash_draft_window_size"),
    ("0.5.12", "speculative_draft_window_size"),
    ("0.5.23", "speculative_draft_window_size"),
])
def test_intended_server_info_window_key_by_version(version, window_key):
    info = _args.intended_server_info(k26(sglang_speculative_eagle_topk=1, sglang_speculative_num_steps=2), version)
    assert info == {"model_path": "/models/Kimi-K2.6", "served_model_name": "kimi-k2.6", "tp_size": 8,
                    "port": 30000, "host": "127.0.1.2", "speculative_algorithm": "DFLASH",
                    "speculative_draft_model_path": "/models/Kimi-K2.6-DFlash", "speculative_num_draft_tokens": 16,
                    window_key: 2048, "speculative_eagle_topk": 1, "speculative_num_steps": 2}


def test_intended_server_info_without_speculation_or_optional_settings():
    settings = plain("none", sglang_speculative_draft_model_path=None, sglang_served_model_name=None,
                     sglang_host=None)
    assert _args.intended_server_info(settings, "0.5.23") == {
        "model_path": "/models/Kimi-K2.6", "tp_size": 8, "port": 30000, "speculative_algorithm": None}
    no_window = _args.intended_server_info(k26(sglang_speculative_draft_window_size=None), "0.5.11")
    assert not any("window" in key for key in no_window)


def test_intended_server_info_never_carries_the_key():
    info = _args.intended_server_info(k26(sglang_api_key=KEY), "0.5.23")
    assert KEY not in repr(info) and "api_key" not in info


# ----------------------------------------------------------------------- endpoints

@pytest.mark.parametrize("host,address,url,worker_url", [
    ("", None, "http://127.0.0.1:30000", "http://127.0.0.1:30000"),          # SGLang's default --host
    (None, "10.0.0.5", "http://127.0.0.1:30000", "http://127.0.0.1:30000"),
    ("0.0.0.0", "10.0.0.5", "http://127.0.0.1:30000", "http://10.0.0.5:30000"),
    ("0.0.0.0", None, "http://127.0.0.1:30000", "http://127.0.0.1:30000"),
    ("::", "10.0.0.5", "http://[::1]:30000", "http://10.0.0.5:30000"),
    ("[::]", "fd00::5", "http://[::1]:30000", "http://[fd00::5]:30000"),
    ("fd00::11", "10.0.0.5", "http://[fd00::11]:30000", "http://[fd00::11]:30000"),
    ("[fd00::11]", None, "http://[fd00::11]:30000", "http://[fd00::11]:30000"),
    ("127.0.1.11", "127.0.1.11", "http://127.0.1.11:30000", "http://127.0.1.11:30000"),
    ("gpu-b01.example.internal", "10.0.0.5", "http://gpu-b01.example.internal:30000",
     "http://gpu-b01.example.internal:30000"),
    (" 127.0.1.11 ", None, "http://127.0.1.11:30000", "http://127.0.1.11:30000"),
])
def test_server_endpoints(host, address, url, worker_url):
    assert _args.server_endpoints(host, 30000, address) == {"url": url, "worker_url": worker_url}


def test_server_endpoints_tls_and_port_text():
    extra = {"--ssl-certfile": "/etc/ssl/c.pem", "--ssl-keyfile": "/etc/ssl/k.pem"}
    tls = _args.server_endpoints("0.0.0.0", "8443", "gpu-1", extra)
    assert tls == {"url": "https://127.0.0.1:8443", "worker_url": "https://gpu-1:8443"}
    assert _args.server_endpoints("h", 1, None, {"--ssl-certfile": False})["url"] == "http://h:1"
    assert _args.server_endpoints("h", 1, None, {"--enable-metrics": True})["url"] == "http://h:1"
    assert _args.server_endpoints("h", 1, None, ["--ssl-certfile"])["url"] == "http://h:1"  # not a mapping


# ----------------------------------------------------------------------- the role's files

ROLE_FILE_SETTINGS = {"sglang_restart": "on-failure", "sglang_restart_sec": 10, "sglang_timeout_start_sec": 900,
                      "sglang_timeout_stop_sec": 900, "sglang_journal_rate_limit_burst": 100000,
                      "sglang_journal_rate_limit_interval": "30s", "sglang_user": "sglang", "sglang_group": "sglang"}


def test_the_unit_is_rendered_by_one_pure_function():
    settings = k26(sglang_environment={"SGLANG_LOG_MS": 1, "NOTE": "50% $off", "FLAG": True}, **ROLE_FILE_SETTINGS)
    text = _args.render_unit(settings, "0.5.23", managed="Ansible managed")
    lines = text.splitlines()
    assert lines[:4] == ["#", "# Ansible managed", "#", "[Unit]"]
    assert 'Environment="SGLANG_LOG_MS=1"' in lines and 'Environment="NOTE=50%% $off"' in lines
    assert 'Environment="FLAG=1"' in lines
    assert "ExecStart=" + render_execstart(settings, "0.5.23") in text
    for line in ("User=sglang", "Group=sglang", "Restart=on-failure", "RestartSec=10", "TimeoutStartSec=900",
                 "KillMode=control-group", "SyslogIdentifier=sglang", "WantedBy=multi-user.target", "Type=simple"):
        assert line in lines, line
    keyed = _args.render_unit(k26(sglang_api_key=KEY, **ROLE_FILE_SETTINGS), "0.5.23")
    assert text.endswith("\n") and KEY not in keyed


def test_a_percent_in_the_model_name_is_escaped_and_bad_environment_names_are_refused():
    settings = k26(sglang_served_model_name="kimi 100%", **ROLE_FILE_SETTINGS)
    assert "Description=SGLang server kimi 100%%" in _args.render_unit(settings, "0.5.23")
    with pytest.raises(SettingsError, match="sglang_environment key 'A-B'"):
        _args.render_unit(k26(sglang_environment={"A-B": "x"}, **ROLE_FILE_SETTINGS), "0.5.23")
    with pytest.raises(SettingsError, match=r"sglang_environment\['SGLANG_API_KEY'\]"):
        _args.render_unit(k26(sglang_environment={"SGLANG_API_KEY": "x"}, **ROLE_FILE_SETTINGS), "0.5.23")


def test_journalds_drop_in_and_the_paths_of_the_roles_files():
    text = _args.render_journald(ROLE_FILE_SETTINGS, managed="Managed by\nthe platform team")
    assert text.splitlines() == ["#", "# Managed by", "# the platform team", "#",
                                 "# SGLang logs a burst at startup (every TP rank); its config line must not be "
                                 "suppressed.", "[Journal]", "RateLimitIntervalSec=30s", "RateLimitBurst=100000"]
    assert _args.unit_paths({"sglang_unit_name": "llm-a.service"}) == {
        "unit": "/etc/systemd/system/llm-a.service",
        "journald": "/etc/systemd/journald.conf.d/50-gpufleet-llm-a.conf"}


# ----------------------------------------------------------------------- a node of a serving group

HEAD = ["--nnodes", "2", "--node-rank", "0", "--dist-init-addr", "10.0.0.1:50000", "--dist-timeout", "900"]
FOLLOWER = ["--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "10.0.0.1:50000"]


def test_a_nodes_arguments_follow_the_settings_and_come_before_the_config_file():
    args = build_args(k26(sglang_api_key=KEY, sglang_extra_args={"--trust-remote-code": True}), "0.5.23",
                      FOLLOWER)
    assert args[-2:] == ["--config", "/etc/sglang/sglang.yaml"]
    assert args[-2 - len(FOLLOWER):-2] == FOLLOWER
    assert args.index("--trust-remote-code") < args.index("--nnodes")
    assert build_args(k26(), "0.5.23", None) == build_args(k26(), "0.5.23", []) == build_args(k26(), "0.5.23")


def test_the_head_keeps_the_full_intent_and_a_follower_only_its_command_line_and_environment():
    head = _args.build_intent(k26(), "0.5.23", HEAD)
    assert head["expect"] == _args.build_expect(k26(), "0.5.23") and head["config_line"] == "required"
    assert "follower" not in head and head["command"][-len(HEAD):] == HEAD
    follower = _args.build_intent(k26(sglang_environment={"A": "1"}), "0.5.23", FOLLOWER)
    assert follower == {"expect": {}, "config_line": "optional", "follower": True, "environment": {"A": "1"},
                        "command": _args.build_command(k26(sglang_environment={"A": "1"}), "0.5.23", FOLLOWER)}
    assert _args.intended_server_info(k26(), "0.5.23", FOLLOWER) is None
    assert _args.intended_server_info(k26(), "0.5.23", HEAD) == _args.intended_server_info(k26(), "0.5.23")


def test_a_nodes_unit_runs_its_flags_with_kill_mode_mixed_and_a_single_server_control_group():
    settings = k26(sglang_user="sglang", sglang_group="sglang", sglang_unit_name="sglang.service")
    node = _args.render_unit(settings, "0.5.23", node=FOLLOWER)
    assert '"--node-rank" \\\n    "1"' in node and "KillMode=mixed" in node
    single = _args.render_unit(settings, "0.5.23")
    assert "--node-rank" not in single and "KillMode=control-group" in single


@pytest.mark.parametrize("node, rank, follower", [
    (None, None, False), ([], None, False), (HEAD, 0, False), (FOLLOWER, 1, True)])
def test_a_nodes_rank_and_whether_it_follows(node, rank, follower):
    assert _args.node_rank(node) == rank and _args.is_follower(node) is follower


@pytest.mark.parametrize("node", [["--nnodes", "2"], ["--node-rank", "1"], ["--nnodes", "2", "--node-rank"],
                                  ["--nnodes", "2", "--node-rank", "1", "--port", "1"], "--nnodes 2",
                                  ["--nnodes", "2", "--node-rank", "one"]])
def test_node_arguments_other_than_a_groups_flags_are_refused(node):
    with pytest.raises(SettingsError, match="node"):
        _args.node_rank(node)


@pytest.mark.parametrize("flag", ["--nnodes", "--node-rank", "--dist-init-addr", "--nccl-init-addr",
                                  "--dist-timeout", "--node-r"])
def test_extra_args_may_not_set_a_flag_a_serving_group_derives(flag):
    with pytest.raises(SettingsError, match=r"serving group.*sglang_node_rank"):
        validate(k26(sglang_extra_args={flag: "1"}))
