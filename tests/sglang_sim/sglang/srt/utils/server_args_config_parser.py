"""``--config FILE.yaml``: options merged from a YAML file into argv, in-process.

As the real ``ConfigArgumentMerger`` (sglang/srt/server_args_config_parser.py
up to 0.5.18, sglang/srt/utils/ from 0.5.19; present in every release
0.5.10-0.5.23):

- only the exact token ``--config`` triggers the merge (``--config=FILE`` is
  parsed and ignored); two of them, or none followed by a path, is a ValueError;
- the file must end in .yaml/.yml and exist;
- every key becomes ``--{key}`` spelled as written (so ``api-key:``; an
  underscore spelling like ``api_key:`` gives ``--api_key``, which argparse
  rejects); a store_true key adds the flag when true and nothing when false,
  other booleans pass ``true``/``false``; a list passes its items after the
  flag (nothing for an empty list); a mapping passes ``str(dict)`` before
  0.5.14 and ``json.dumps`` after; anything else ``str(value)``;
- keys of actions other than store/store_true raise ``Unsupported config
  option`` (0.5.23 also accepts single-value actions and every long spelling);
- the file's options go BEFORE the command line, so the command line wins
  (argparse keeps the last value).

The process list shows only ``--config FILE``.  YAML is read by the
simulator's own subset reader (``sglang._sim_yaml``), not PyYAML.
"""
import argparse
import json
import logging
from pathlib import Path

from sglang import _sim_yaml
from sglang._sim_profile import at_least

logger = logging.getLogger(__name__)


def _config_keys(action):
    # 0.5.23: YAML keys may use any long spelling of a flag, not just the dest.
    return {action.dest} | {
        option[2:].replace("-", "_") for option in action.option_strings if option.startswith("--")
    }


def _takes_one_value(action):
    return isinstance(action, argparse._StoreAction) or action.nargs is None


class ConfigArgumentMerger:
    def __init__(self, parser=None, boolean_actions=None):
        if parser is not None:
            self.parser = parser
            if at_least("0.5.23"):
                self.store_true_actions = [
                    key for action in parser._actions if isinstance(action, argparse._StoreTrueAction)
                    for key in _config_keys(action)
                ]
                supported = [a for a in parser._actions
                             if isinstance(a, argparse._StoreTrueAction) or _takes_one_value(a)]
                supported_keys = {key for a in supported for key in _config_keys(a)}
                self.unsupported_actions = {
                    key: a
                    for a in parser._actions
                    if a.option_strings and a not in supported
                    and "--config" not in a.option_strings
                    and "--help" not in a.option_strings and "-h" not in a.option_strings
                    for key in _config_keys(a)
                    if key not in supported_keys
                }
            else:
                self.store_true_actions = [
                    action.dest for action in parser._actions
                    if isinstance(action, argparse._StoreTrueAction)
                ]
                self.unsupported_actions = {
                    a.dest: a
                    for a in parser._actions
                    if a.option_strings
                    and not isinstance(a, argparse._StoreTrueAction)
                    and not isinstance(a, argparse._StoreAction)
                    and "--config" not in a.option_strings
                    and "--help" not in a.option_strings and "-h" not in a.option_strings
                }
        elif boolean_actions is not None:
            self.store_true_actions = boolean_actions
            self.unsupported_actions = {}
        else:
            self.store_true_actions = []
            self.unsupported_actions = {}

    def merge_config_with_args(self, cli_args):
        config_file_path = self._extract_config_file_path(cli_args)
        if not config_file_path:
            return cli_args
        config_data = self._parse_yaml_config(config_file_path)
        config_args = self._convert_config_to_args(config_data)
        config_index = cli_args.index("--config")
        before_config = cli_args[:config_index]
        after_config = cli_args[config_index + 2:]
        return config_args + before_config + after_config

    def _extract_config_file_path(self, args):
        config_indices = [i for i, arg in enumerate(args) if arg == "--config"]
        if len(config_indices) > 1:
            raise ValueError("Multiple config files specified! Only one allowed.")
        if not config_indices:
            return None
        config_index = config_indices[0]
        if config_index == len(args) - 1:
            raise ValueError("No config file specified after --config flag!")
        return args[config_index + 1]

    def _parse_yaml_config(self, file_path):
        self._validate_yaml_file(file_path)
        try:
            with open(file_path, "r") as file:
                config_data = _sim_yaml.safe_load(file.read())
        except Exception as e:
            logger.error(f"Failed to read config file {file_path}: {e}")  # pylint: disable=logging-fstring-interpolation
            raise
        if config_data is None:
            config_data = {}
        if not isinstance(config_data, dict):
            raise ValueError("Config file must contain a dictionary at root level")
        return config_data

    def _validate_yaml_file(self, file_path):
        path = Path(file_path)
        if path.suffix.lower() not in [".yaml", ".yml"]:
            raise ValueError(f"Config file must be YAML format, got: {path.suffix}")
        if not path.exists():
            raise ValueError(f"Config file not found: {file_path}")

    def _convert_config_to_args(self, config):
        args = []
        for key, value in config.items():
            key_norm = key.replace("-", "_")
            if key_norm in self.unsupported_actions:
                action = self.unsupported_actions[key_norm]
                raise ValueError(
                    f"Unsupported config option '{key_norm}' with action '{action.__class__.__name__}'"
                )
            if isinstance(value, bool):
                self._add_boolean_arg(args, key, value)
            elif isinstance(value, list):
                self._add_list_arg(args, key, value)
            elif isinstance(value, dict) and at_least("0.5.14"):
                self._add_scalar_arg(args, key, json.dumps(value))
            else:
                self._add_scalar_arg(args, key, value)
        return args

    def _add_boolean_arg(self, args, key, value):
        key_norm = key.replace("-", "_")
        if key_norm in self.store_true_actions:
            if value:
                args.append(f"--{key}")
        else:
            args.extend([f"--{key}", str(value).lower()])

    def _add_list_arg(self, args, key, value):
        if value:
            args.append(f"--{key}")
            args.extend(str(item) for item in value)

    def _add_scalar_arg(self, args, key, value):
        args.extend([f"--{key}", str(value)])
