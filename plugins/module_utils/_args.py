# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one place that knows SGLang's flag names (by version) and turns settings into argv.

Settings are a mapping keyed by the role's variable names (``sglang_model_path``, ...).
Everything here is pure: no Ansible, no I/O, so the role's template, the ``expect`` of
``sglang_ready`` and the unit tests all call the same code.

Private to this collection: no compatibility promise.
"""
from __future__ import annotations

import re

from ansible_collections.gpufleet.inference.plugins.module_utils._flags import (
    BLOCK_SIZE_FLAG,
    CONFIG_FLAG,
    TREE_BUDGET_FLAG,
    WINDOW_FLAG_NEW,
    WINDOW_FLAG_OLD,
    server_info_key,
)
from ansible_collections.gpufleet.inference.plugins.module_utils._groups import GROUP_FLAGS
from ansible_collections.gpufleet.inference.plugins.module_utils._systemd import systemd_quote, systemd_quote_env

ALGORITHMS = ("none", "DFLASH", "EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "FROZEN_KV_MTP", "DSPARK",
              "UNO", "DDTREE")
# The first release that knows each algorithm (the choices of --speculative-algorithm in SGLang's
# srt/server_args.py, release by release). DDTREE exists in no public
# release (an upstream pull request and private builds): the host's own parser judges it.
ALGORITHM_SINCE = {"DFLASH": (0, 5, 11), "FROZEN_KV_MTP": (0, 5, 12), "DSPARK": (0, 5, 16), "UNO": (0, 5, 20)}
CUSTOM_BUILD_ALGORITHMS = ("DDTREE",)
# Algorithms whose draft worker logs a config line the module can read.
CONFIG_LINE_ALGORITHMS = ("DFLASH", "DDTREE")

# The module SGLang is started with (`python -m sglang.launch_server`, every release).
ENTRYPOINT = ("-m", "sglang.launch_server")
DEFAULT_PYTHON = "/opt/sglang/venv/bin/python"

# The API key is never on the command line (`ps` would show it): the unit passes
# `--config <sglang_config_file>` (CONFIG_FLAG), a YAML file readable only by root and the service
# user that holds `api-key: <key>` (SGLang merges it into its argv in-process).
# Environment name the role refuses in sglang_environment (the key has its own variable).
API_KEY_ENV = "SGLANG_API_KEY"

DFLASH_SINCE = (0, 5, 11)
GENERIC_WINDOW_SINCE = (0, 5, 12)

# Flags (with SGLang's own aliases) that the role manages -> the variable to set instead.
# argparse accepts unambiguous abbreviations, so a prefix of these collides too.
MANAGED_FLAGS = {
    "--model-path": "sglang_model_path",
    "--model": "sglang_model_path",
    "--served-model-name": "sglang_served_model_name",
    "--tp-size": "sglang_tp_size",
    "--tensor-parallel-size": "sglang_tp_size",
    "--host": "sglang_host",
    "--port": "sglang_port",
    "--api-key": "sglang_api_key",
    "--speculative-algorithm": "sglang_speculative_algorithm",
    "--speculative-draft-model-path": "sglang_speculative_draft_model_path",
    "--speculative-draft-model": "sglang_speculative_draft_model_path",
    "--speculative-num-draft-tokens": "sglang_speculative_num_draft_tokens",
    "--speculative-dflash-block-size": "sglang_speculative_num_draft_tokens",
    "--speculative-draft-window-size": "sglang_speculative_draft_window_size",
    "--speculative-dflash-draft-window-size": "sglang_speculative_draft_window_size",
    "--speculative-eagle-topk": "sglang_speculative_eagle_topk",
    "--speculative-num-steps": "sglang_speculative_num_steps",
    TREE_BUDGET_FLAG: "sglang_speculative_tree_budget",
}

POSITIVE_INT_SETTINGS = (
    "sglang_tp_size",
    "sglang_port",
    "sglang_speculative_num_draft_tokens",
    "sglang_speculative_draft_window_size",
    "sglang_speculative_eagle_topk",
    "sglang_speculative_num_steps",
    "sglang_speculative_tree_budget",
)
REQUIRED_INT_SETTINGS = ("sglang_tp_size", "sglang_port")
TEXT_SETTINGS = (
    "sglang_model_path",
    "sglang_served_model_name",
    "sglang_host",
    "sglang_speculative_draft_model_path",
)

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_FLAG = re.compile(r"^--[A-Za-z0-9][A-Za-z0-9_.-]*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?")
_EXECUTABLE = re.compile(r"^/[A-Za-z0-9._+@:/-]+$")
_ACCOUNT = re.compile(r"^[a-z_][a-z0-9_-]*$")
_UNIT_NAME = re.compile(r"^[A-Za-z0-9:_.@-]+\.service$")
_API_KEY_FORBIDDEN = re.compile(r"[\x00-\x1f\x7f]")


class SettingsError(ValueError):
    """Settings that SGLang (or systemd) would refuse; the message names the variable."""


# ---------------------------------------------------------------------------- helpers

def parse_version(version):
    """'0.5.12', '0.5.12rc1', 'v0.5.11.post1' -> (0, 5, 12); None when unparseable."""
    if version is None:
        return None
    match = _VERSION.match(str(version).strip())
    if not match:
        return None
    return tuple(int(part or 0) for part in match.groups())


def _algorithm(settings):
    value = settings.get("sglang_speculative_algorithm")
    if value is None or value == "" or value is False or str(value).lower() == "none":
        return "none"
    return str(value)


def _int_or_none(name, value, errors):
    """A positive int (or None). Booleans are not ints; digit strings (-e k=v) are."""
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        errors.append(f"{name} must be a positive integer, got {value!r} (a boolean)")
        return None
    if isinstance(value, int):
        number = value
    elif isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d+\s*", value):
        number = int(value)
    else:
        errors.append(f"{name} must be a positive integer, got {value!r}")
        return None
    if number <= 0:
        errors.append(f"{name} must be a positive integer, got {number}")
        return None
    return int(number)


def _text(name, value, errors, required=False):
    if value is None or value == "":
        if required:
            errors.append(f"{name} is required")
        return None
    if isinstance(value, (dict, list, tuple, set, bool)):
        errors.append(f"{name} must be a string, got {type(value).__name__}")
        return None
    text = str(value)
    if _CONTROL.search(text):
        errors.append(f"{name} contains a newline or control character, which a unit file"
                      f" cannot carry: {text!r}")
        return None
    return text


def _value_text(name, value, errors):
    """One extra_args value -> text (numbers as written; no booleans here)."""
    if isinstance(value, float):
        text = repr(value)
    else:
        text = str(value)
    if _CONTROL.search(text):
        errors.append(f"{name} contains a newline or control character, which a unit file"
                      f" cannot carry: {text!r}")
        return None
    return text


def _managed_collision(flag):
    """The variable a --flag collides with (exact, alias or argparse abbreviation)."""
    if flag in MANAGED_FLAGS:
        return MANAGED_FLAGS[flag]
    for managed, variable in MANAGED_FLAGS.items():
        if managed.startswith(flag):
            return variable
    return None


def _group_collision(flag):
    """Whether a --flag is one a serving group sets on each node (exact, alias or abbreviation)."""
    return any(group_flag.startswith(flag) for group_flag in GROUP_FLAGS)


def _extra_args(settings, errors):
    """sglang_extra_args -> list of (flag, [values]) in the order given."""
    extra = settings.get("sglang_extra_args") or {}
    if not isinstance(extra, dict):
        errors.append("sglang_extra_args must be a mapping of --flag to value"
                      f" (true for a bare flag), got {type(extra).__name__}")
        return []
    result = []
    for key, value in extra.items():
        where = f"sglang_extra_args[{key!r}]"
        if not isinstance(key, str) or not _FLAG.match(key):
            errors.append(f"sglang_extra_args key {key!r} is not a --flag"
                          " (write e.g. '--mem-fraction-static': 0.85)")
            continue
        variable = _managed_collision(key)
        if variable:
            errors.append(f"{where} collides with a flag the role manages: set {variable}"
                          " instead")
            continue
        if _group_collision(key):
            errors.append(f"{where} is a flag of a multi-node serving group, derived for each node: set"
                          " sglang_node_rank and sglang_serving_group (or sglang_serving_groups) instead")
            continue
        if value is None or value is False:
            continue  # explicitly switched off
        if value is True:
            result.append((key, []))
            continue
        if isinstance(value, dict):
            errors.append(f"{where} must be a string, number, true or a list, got a mapping"
                          " (pass JSON as a string)")
            continue
        values = value if isinstance(value, (list, tuple)) else [value]
        texts = []
        for item in values:
            if isinstance(item, (bool, dict, list, tuple)) or item is None:
                errors.append(f"{where} list items must be strings or numbers, got {item!r}")
                texts = None
                break
            text = _value_text(where, item, errors)
            if text is None:
                texts = None
                break
            texts.append(text)
        if texts is not None:
            result.append((key, texts))
    return result


def _environment(settings, errors):
    env = settings.get("sglang_environment") or {}
    if not isinstance(env, dict):
        errors.append("sglang_environment must be a mapping of NAME to value,"
                      f" got {type(env).__name__}")
        return {}
    result = {}
    for key, value in env.items():
        if not isinstance(key, str) or not _ENV_NAME.match(key):
            errors.append(f"sglang_environment key {key!r} is not a valid environment"
                          " variable name")
            continue
        if key == API_KEY_ENV:
            errors.append(f"sglang_environment[{key!r}] is reserved for the API key:"
                          " set sglang_api_key instead")
            continue
        if isinstance(value, (dict, list, tuple)):
            errors.append(f"sglang_environment[{key!r}] must be a string or number")
            continue
        if value is None:
            text = ""
        elif isinstance(value, bool):
            text = "1" if value else "0"
        else:
            text = str(value)
        if _CONTROL.search(text):
            errors.append(f"sglang_environment[{key!r}] contains a newline or control"
                          f" character, which a unit file cannot carry: {text!r}")
            continue
        result[key] = text
    return result


def _check_version(settings, version, algorithm, window, errors):
    parsed = parse_version(version)
    if parsed is None:
        errors.append(f"sglang_version {version!r} is not a version like 0.5.12"
                      " (leave it empty to detect it from the host)")
        return None
    since = ALGORITHM_SINCE.get(algorithm)
    if since is not None and parsed < since:
        errors.append(f"sglang_speculative_algorithm is {algorithm} but SGLang {version}"
                      f" (sglang_version) has no {algorithm}: it arrived in"
                      f" {'.'.join(str(part) for part in since)}")
    if window is not None and algorithm not in ("none", "DFLASH") and parsed < GENERIC_WINDOW_SINCE:
        errors.append(f"sglang_speculative_draft_window_size is a DFLASH-only setting in"
                      f" SGLang {version}; sglang_speculative_algorithm is {algorithm}")
    return parsed


def node_args(node):
    """A serving group's per-node argv (_groups.node_args: ``--nnodes N --node-rank I --dist-init-addr
    HEAD:PORT [--dist-timeout S]``) as text; [] for a single-node server (``node`` None or empty)."""
    if not node:
        return []
    if not isinstance(node, (list, tuple)) or not all(isinstance(word, (str, int)) for word in node):
        raise SettingsError(f"the node arguments of a serving group must be a list of words, got {node!r}")
    words = [str(word) for word in node]
    flags = words[0::2]
    unknown = [flag for flag in flags if flag not in GROUP_FLAGS]
    if len(words) % 2 or unknown or "--node-rank" not in flags or "--nnodes" not in flags:
        raise SettingsError(f"the node arguments of a serving group must be pairs of {', '.join(GROUP_FLAGS)}"
                            f" with --nnodes and --node-rank, got {words!r}")
    return words


def node_rank(node):
    """The node's rank in its serving group (0: the head), or None for a single-node server."""
    words = node_args(node)
    if not words:
        return None
    rank = words[words.index("--node-rank") + 1]
    if not rank.isdigit():
        raise SettingsError(f"--node-rank must be a number, got {rank!r}")
    return int(rank)


def is_follower(node):
    """A node other than the head: it runs schedulers only, serves no HTTP and logs no config line."""
    rank = node_rank(node)
    return rank is not None and rank > 0


# ---------------------------------------------------------------------------- public API

def normalize(settings, version=None):
    """Validate `settings` and return them normalised; raise SettingsError naming variables.

    `version` (the host's SGLang version) enables the version-dependent checks; without it
    only the version-independent ones run (the role calls both, before and after detection).
    """
    if not isinstance(settings, dict):
        raise SettingsError(f"settings must be a mapping, got {type(settings).__name__}")
    errors = []
    norm = {}

    norm["python"] = settings.get("sglang_python")
    if norm["python"] is not None and (not isinstance(norm["python"], str)
                                       or not _EXECUTABLE.match(norm["python"])):
        errors.append(f"sglang_python must be an absolute path without spaces, quotes, '$'"
                      f" or '%' (systemd runs it directly), got {norm['python']!r}")
    config_file = settings.get("sglang_config_file")
    if config_file is not None and (not isinstance(config_file, str)
                                    or not _EXECUTABLE.match(config_file)):
        errors.append(f"sglang_config_file must be an absolute path without spaces, quotes, '$'"
                      f" or '%', got {config_file!r}")
    for name in ("sglang_user", "sglang_group"):
        account = settings.get(name)
        if account is not None and (not isinstance(account, str)
                                    or not _ACCOUNT.match(account)):
            errors.append(f"{name} must be a user/group name like 'sglang', got {account!r}")
    unit = settings.get("sglang_unit_name")
    if unit is not None and (not isinstance(unit, str) or not _UNIT_NAME.match(unit)):
        errors.append(f"sglang_unit_name must be a unit name ending in .service, got {unit!r}")

    norm["model_path"] = _text("sglang_model_path", settings.get("sglang_model_path"),
                               errors, required=True)
    norm["served_model_name"] = _text("sglang_served_model_name",
                                      settings.get("sglang_served_model_name"), errors)
    norm["host"] = _text("sglang_host", settings.get("sglang_host"), errors)
    norm["draft_model_path"] = _text("sglang_speculative_draft_model_path",
                                     settings.get("sglang_speculative_draft_model_path"), errors)
    for name in POSITIVE_INT_SETTINGS:
        norm[name] = _int_or_none(name, settings.get(name), errors)
    for name in REQUIRED_INT_SETTINGS:
        if settings.get(name) in (None, ""):
            errors.append(f"{name} is required")
    if norm["sglang_port"] is not None and norm["sglang_port"] > 65535:
        errors.append(f"sglang_port must be <= 65535, got {norm['sglang_port']}")

    algorithm = _algorithm(settings)
    if algorithm not in ALGORITHMS:
        errors.append(f"sglang_speculative_algorithm must be one of {', '.join(ALGORITHMS)},"
                      f" got {algorithm!r}")
    norm["algorithm"] = algorithm
    block = norm["sglang_speculative_num_draft_tokens"]
    window = norm["sglang_speculative_draft_window_size"]
    budget = norm["sglang_speculative_tree_budget"]

    if algorithm == "none":
        for name in ("sglang_speculative_draft_model_path", "sglang_speculative_num_draft_tokens",
                     "sglang_speculative_draft_window_size", "sglang_speculative_eagle_topk",
                     "sglang_speculative_num_steps", "sglang_speculative_tree_budget"):
            if settings.get(name) not in (None, ""):
                errors.append(f"{name} is set ({settings.get(name)!r}) but"
                              " sglang_speculative_algorithm is none: it would have no effect")
    if algorithm in ("DFLASH", "DDTREE") and not norm["draft_model_path"]:
        errors.append("sglang_speculative_draft_model_path is required when"
                      f" sglang_speculative_algorithm is {algorithm}: SGLang refuses {algorithm}"
                      " without a draft model")
    if algorithm == "DFLASH" and window is not None and block is not None and window < block:
        errors.append(f"sglang_speculative_draft_window_size ({window}) must be >="
                      f" sglang_speculative_num_draft_tokens ({block}): SGLang refuses a"
                      " DFlash window smaller than its block size")
    if budget is not None and algorithm not in ("none", "DDTREE"):
        errors.append(f"sglang_speculative_tree_budget is a DDTREE setting;"
                      f" sglang_speculative_algorithm is {algorithm}")

    api_key = settings.get("sglang_api_key")
    if api_key not in (None, ""):
        # The key itself is never echoed.
        if not isinstance(api_key, str) or _API_KEY_FORBIDDEN.search(api_key):
            errors.append("sglang_api_key must be a string without newlines or control characters")
        elif api_key.startswith("-"):
            # SGLang turns the config file into `--api-key <key>` for argparse, which takes
            # a leading '-' for an option and refuses to start ("expected one argument").
            errors.append("sglang_api_key must not start with '-': SGLang reads it from its config file as"
                          " '--api-key <key>', and its argument parser takes a leading '-' for an option")
        norm["api_key_set"] = True
    else:
        norm["api_key_set"] = False

    norm["extra_args"] = _extra_args(settings, errors)
    norm["environment"] = _environment(settings, errors)

    if version is not None:
        norm["version"] = _check_version(settings, version, algorithm, window, errors)
    else:
        norm["version"] = None

    if errors:
        raise SettingsError("; ".join(errors))
    return norm


def validate(settings, version=None):
    """Raise SettingsError (naming the variable) for settings SGLang or systemd would refuse."""
    normalize(settings, version)
    return True


def window_flag(version):
    """The DFlash draft-window flag of SGLang `version` (see _flags: renamed after 0.5.11)."""
    parsed = parse_version(version)
    if parsed is None:
        raise SettingsError(f"sglang_version {version!r} is not a version like 0.5.12")
    if parsed < DFLASH_SINCE:
        raise SettingsError(f"SGLang {version} (sglang_version) has no DFLASH draft window:"
                            " it arrived in 0.5.11")
    return WINDOW_FLAG_OLD if parsed < GENERIC_WINDOW_SINCE else WINDOW_FLAG_NEW


def _require_version(version):
    if version is None or str(version).strip() == "":
        raise SettingsError("sglang_version is empty: it must be set or detected from the"
                            " host before the arguments can be built")


def build_args(settings, version, node=None):
    """Settings -> SGLang's argv after `python -m sglang.launch_server`.

    `node`: the per-node argv of a serving group's node (_groups.node_args), after the settings'
    own arguments; None for a single-node server. Never contains the API key: with sglang_api_key
    set it ends with `--config <file>`, the root-only YAML file that holds the key (config_file_text).
    """
    _require_version(version)
    norm = normalize(settings, version)
    group = node_args(node)
    args = ["--model-path", norm["model_path"]]
    if norm["served_model_name"]:
        args += ["--served-model-name", norm["served_model_name"]]
    if norm["sglang_tp_size"] is not None:
        args += ["--tp-size", str(norm["sglang_tp_size"])]
    if norm["host"]:
        args += ["--host", norm["host"]]
    if norm["sglang_port"] is not None:
        args += ["--port", str(norm["sglang_port"])]
    algorithm = norm["algorithm"]
    if algorithm != "none":
        args += ["--speculative-algorithm", algorithm]
        if norm["draft_model_path"]:
            args += ["--speculative-draft-model-path", norm["draft_model_path"]]
        if norm["sglang_speculative_num_draft_tokens"] is not None:
            args += [BLOCK_SIZE_FLAG, str(norm["sglang_speculative_num_draft_tokens"])]
        if norm["sglang_speculative_draft_window_size"] is not None:
            args += [window_flag(version), str(norm["sglang_speculative_draft_window_size"])]
        if norm["sglang_speculative_eagle_topk"] is not None:
            args += ["--speculative-eagle-topk", str(norm["sglang_speculative_eagle_topk"])]
        if norm["sglang_speculative_num_steps"] is not None:
            args += ["--speculative-num-steps", str(norm["sglang_speculative_num_steps"])]
        if norm["sglang_speculative_tree_budget"] is not None:
            args += [TREE_BUDGET_FLAG, str(norm["sglang_speculative_tree_budget"])]
    for flag, values in norm["extra_args"]:
        args.append(flag)
        args.extend(values)
    args += group
    if norm["api_key_set"]:
        args += [CONFIG_FLAG, config_file_path(settings)]
    return args


def config_file_path(settings):
    """Where the unit's SGLang config file (the API key) lives."""
    path = settings.get("sglang_config_file")
    if path:
        return path
    unit = settings.get("sglang_unit_name") or "sglang.service"
    return "/etc/sglang/%s.yaml" % re.sub(r"\.service$", "", unit)


def config_file_text(settings):
    """The YAML of the config file: the API key only, as a double-quoted YAML string.

    The key is spelled like the flag (``api-key``): SGLang turns each key into ``--<key>``
    verbatim, and ``--api_key`` is no flag of its parser (it would print the key in its error).
    """
    api_key = settings.get("sglang_api_key")
    if api_key in (None, ""):
        return "{}\n"
    # Not json.dumps: it writes a character beyond U+FFFF as a surrogate pair (\ud83d\ude00),
    # which PyYAML (SGLang's yaml.safe_load) reads as two lone surrogates. Escape every
    # non-ASCII character (no YAML line break U+0085/U+2028 is ever written raw).
    quoted = []
    for char in str(api_key):
        code = ord(char)
        if char in '"\\':
            quoted.append("\\" + char)
        elif 0x20 <= code < 0x7F:
            quoted.append(char)
        else:
            quoted.append("\\u%04x" % code if code <= 0xFFFF else "\\U%08x" % code)
    return 'api-key: "%s"\n' % "".join(quoted)


def config_file(settings):
    """The SGLang config file as the unit's files hold it, without its content: {path, mode, owner,
    group}; None without an API key (no config file then)."""
    if settings.get("sglang_api_key") in (None, ""):
        return None
    return {"path": config_file_path(settings), "mode": "0640", "owner": "root",
            "group": settings.get("sglang_group") or "root"}


def secret_files(settings):
    """The unit's files that hold secrets (sglang_unit_files' secret_files): the SGLang config file
    with the API key, or none."""
    meta = config_file(settings)
    return [dict(meta, content=config_file_text(settings))] if meta else []


def build_command(settings, version, node=None):
    """The full command of the unit: interpreter, entrypoint, args (no API key); `node` as in build_args."""
    args = build_args(settings, version, node)
    python = settings.get("sglang_python") or DEFAULT_PYTHON
    return [python, *ENTRYPOINT, *args]


def build_expect(settings, version):
    """Config-line keys the running process must log, with their intended values.

    DFLASH: block_size, draft_window_size, compact_cache (True iff a window is set);
    DDTREE: block_size, tree_budget; anything else: {}. A block size or tree budget left
    to SGLang's default (taken from the draft model / build) is not expected.
    """
    _require_version(version)
    norm = normalize(settings, version)
    block = norm["sglang_speculative_num_draft_tokens"]
    expect = {}
    if norm["algorithm"] == "DFLASH":
        if block is not None:
            expect["block_size"] = block
        window = norm["sglang_speculative_draft_window_size"]
        expect["draft_window_size"] = window
        expect["compact_cache"] = window is not None
    elif norm["algorithm"] == "DDTREE":
        if block is not None:
            expect["block_size"] = block
        if norm["sglang_speculative_tree_budget"] is not None:
            expect["tree_budget"] = norm["sglang_speculative_tree_budget"]
    return expect


def build_intent(settings, version, node=None):
    """Everything a running process must show: config-line values and whether a draft-runner
    line may appear at all (``config_line``), its command line, and its environment.

    "Off" is an expectation too: without DFLASH/DDTREE no draft-runner line may be logged
    (EAGLE, NGRAM, ... log none of their own; a DFLASH line would mean another algorithm runs).

    A follower node of a serving group (`node`, rank >= 1) logs no config line (only global TP rank
    0, on the head, does) and serves no HTTP: its intent is its command line and environment, and
    ``follower`` says that its readiness is its own journal's (it joined the group).
    """
    norm = normalize(settings, version)
    follower = is_follower(node)
    logs_line = norm["algorithm"] in CONFIG_LINE_ALGORITHMS
    intent = {
        "expect": {} if follower else build_expect(settings, version),
        "config_line": "optional" if follower else "required" if logs_line else "absent",
        "command": build_command(settings, version, node),
        "environment": environment(settings),
    }
    if follower:
        intent["follower"] = True
    return intent


def intended_server_info(settings, version, node=None):
    """The /server_info keys (and values) of the settings the role sets, from the settings; None for a
    follower node of a serving group (`node`, rank >= 1), which serves no /server_info.

    /server_info echoes the parsed arguments: a difference means the process was launched with
    other arguments (a --config file, a drop-in); agreement proves nothing about the runtime.
    """
    norm = normalize(settings, version)
    if is_follower(node):
        return None
    info = {"model_path": norm["model_path"]}
    if norm["served_model_name"]:
        info["served_model_name"] = norm["served_model_name"]
    for key, name in (("tp_size", "sglang_tp_size"), ("port", "sglang_port")):
        if norm[name] is not None:
            info[key] = norm[name]
    if norm["host"]:
        info["host"] = norm["host"]
    algorithm = norm["algorithm"]
    info["speculative_algorithm"] = None if algorithm == "none" else algorithm
    if algorithm != "none":
        window_key = server_info_key("sglang_speculative_draft_window_size", window_flag(version)) \
            if norm["sglang_speculative_draft_window_size"] is not None else None
        for key, name in (("speculative_draft_model_path", "draft_model_path"),
                          ("speculative_num_draft_tokens", "sglang_speculative_num_draft_tokens"),
                          (window_key, "sglang_speculative_draft_window_size"),
                          ("speculative_eagle_topk", "sglang_speculative_eagle_topk"),
                          ("speculative_num_steps", "sglang_speculative_num_steps")):
            if key and norm[name] is not None:
                info[key] = norm[name]
    return info


def server_endpoints(host, port, address=None, extra_args=None):
    """Where the server answers: ``url`` (probed on the host itself) and ``worker_url`` (how a
    router elsewhere reaches it).

    An empty host is SGLang's default (127.0.0.1). A wildcard bind (0.0.0.0, ::) is probed on loopback (127.0.0.1, ::1) and reached from
    elsewhere at `address` (the inventory's ansible_host); IPv6 literals are bracketed; TLS when
    --ssl-certfile is among the extra args.
    """
    scheme = "https" if isinstance(extra_args, dict) and extra_args.get("--ssl-certfile") else "http"
    host = (str(host).strip() if host is not None else "") or "127.0.0.1"  # SGLang's default --host
    port = int(port)
    wildcard = host in ("0.0.0.0", "::", "[::]", "*")
    probe = ("::1" if host in ("::", "[::]") else "127.0.0.1") if wildcard else host
    reach = (address or probe) if wildcard else host

    def url(name):
        name = name.strip("[]")
        return "%s://%s:%s" % (scheme, "[%s]" % name if ":" in name else name, port)

    return {"url": url(probe), "worker_url": url(reach)}


def environment(settings):
    """sglang_environment validated, as an ordered {NAME: text} mapping."""
    errors = []
    env = _environment(settings, errors)
    if errors:
        raise SettingsError("; ".join(errors))
    return env


# ---------------------------------------------------------------------------- systemd text

def render_execstart(settings, version, indent="    ", node=None):
    """The value of ExecStart=: one systemd-quoted argument per line, `\\` continued."""
    parts = [systemd_quote(arg) for arg in build_command(settings, version, node)]
    return (" \\\n" + indent).join(parts)


# ---------------------------------------------------------------------------- the role's files

# Every role variable the controller reads to build a host's intent and files: the one list of them
# (their checks live in roles/sglang/meta/argument_specs.yml, which Ansible applies).
SETTINGS = ("sglang_unit_name", "sglang_python", "sglang_config_file", "sglang_user", "sglang_group",
            "sglang_model_path", "sglang_served_model_name", "sglang_tp_size", "sglang_host", "sglang_port",
            "sglang_api_key", "sglang_extra_args", "sglang_environment", "sglang_speculative_algorithm",
            "sglang_speculative_draft_model_path", "sglang_speculative_num_draft_tokens",
            "sglang_speculative_draft_window_size", "sglang_speculative_eagle_topk", "sglang_speculative_num_steps",
            "sglang_speculative_tree_budget", "sglang_restart", "sglang_restart_sec", "sglang_timeout_start_sec",
            "sglang_timeout_stop_sec", "sglang_journal_rate_limit_burst", "sglang_journal_rate_limit_interval")


def unit_stem(settings):
    return re.sub(r"\.service$", "", settings.get("sglang_unit_name") or "sglang.service")


def unit_paths(settings):
    """Where the role installs its files: the unit and journald's drop-in raising its rate limit."""
    return {"unit": "/etc/systemd/system/%s" % (settings.get("sglang_unit_name") or "sglang.service"),
            "journald": "/etc/systemd/journald.conf.d/50-gpufleet-%s.conf" % unit_stem(settings)}


def comment(text):
    """`text` as a comment block of a unit file (Ansible's `comment` filter, plain style)."""
    return "#\n%s\n#" % "\n".join("# " + line if line else "#" for line in str(text).splitlines())


def render_unit(settings, version, managed="Ansible managed", node=None):
    """The systemd unit of the server: the one rendering of it (the role, golden files and tests).

    A node of a serving group (`node`, _groups.node_args) runs its node's arguments, and KillMode=mixed:
    stopping its head then signals the head's main process only, which drains and shuts every node's
    schedulers down (0.5.19+), so the followers exit 0 and stay down; with control-group the head's
    schedulers die with it and every follower is killed and restarted by systemd into a half-stopped
    group (docs: multi-node serving groups, measured by tests/benchmarks/bench_group_order.py)."""
    name = settings.get("sglang_served_model_name") or settings.get("sglang_model_path") or ""
    lines = [comment(managed), "[Unit]", "Description=SGLang server %s" % str(name).replace("%", "%%"),
             "After=network-online.target", "Wants=network-online.target", "", "[Service]", "Type=simple",
             "User=%s" % settings.get("sglang_user"), "Group=%s" % settings.get("sglang_group")]
    for key, value in environment(settings).items():
        lines.append("Environment=%s" % systemd_quote_env(key, value))
    lines += ["ExecStart=%s" % render_execstart(settings, version, node=node),
              "TimeoutStartSec=%s" % settings.get("sglang_timeout_start_sec"),
              "TimeoutStopSec=%s" % settings.get("sglang_timeout_stop_sec"),
              "KillMode=%s" % ("mixed" if node_args(node) else "control-group"),
              "Restart=%s" % settings.get("sglang_restart"),
              "RestartSec=%s" % settings.get("sglang_restart_sec"),
              "SyslogIdentifier=%s" % unit_stem(settings), "", "[Install]", "WantedBy=multi-user.target"]
    return "\n".join(lines) + "\n"


def render_journald(settings, managed="Ansible managed"):
    """journald's drop-in raising its rate limit: SGLang logs a burst at startup (every TP rank) and its
    config line must not be suppressed (a unit's own LogRateLimit*= did not take effect inside nspawn)."""
    return "\n".join([comment(managed),
                      "# SGLang logs a burst at startup (every TP rank); its config line must not be suppressed.",
                      "[Journal]",
                      "RateLimitIntervalSec=%s" % settings.get("sglang_journal_rate_limit_interval"),
                      "RateLimitBurst=%s" % settings.get("sglang_journal_rate_limit_burst")]) + "\n"
