# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Filters exposing the collection's one args builder to the role.

The unit template and the ``expect`` of ``sglang_ready`` call these, so both come from the
same code (plugins/module_utils/_args.py). Documentation: plugins/filter/<name>.yml.
"""
from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.inference.plugins.module_utils import _args
from ansible_collections.gpufleet.inference.plugins.module_utils import _records


def _guard(function, *args):
    try:
        return function(*args)
    except _args.SettingsError as exc:
        raise AnsibleFilterError(str(exc)) from None


def sglang_validate(settings, version=None):
    """True, or AnsibleFilterError naming the variable that SGLang or systemd would refuse."""
    return _guard(_args.validate, settings, version)


def sglang_args(settings, version):
    """The SGLang argv (after `python -m sglang.launch_server`), without the API key."""
    return _guard(_args.build_args, settings, version)


def sglang_expect(settings, version):
    """The config-line keys the new process must log, with their intended values."""
    return _guard(_args.build_expect, settings, version)


def sglang_intent(settings, version):
    """What the running process must show: expect, config_line, command, environment."""
    return _guard(_args.build_intent, settings, version)


def sglang_server_info(settings, version):
    """The /server_info keys and values of the settings the role sets."""
    return _guard(_args.intended_server_info, settings, version)


def sglang_endpoints(host, port, address=None, extra_args=None):
    """{url, worker_url}: where the server is probed on its host, and how a router reaches it."""
    try:
        return _args.server_endpoints(host, port, address, extra_args)
    except (TypeError, ValueError) as exc:
        raise AnsibleFilterError("sglang_endpoints: %s" % exc) from None


def sglang_config_path(settings):
    """Where the unit's SGLang config file (the API key) lives."""
    return _args.config_file_path(settings)


def sglang_config_text(settings):
    """The YAML of the SGLang config file (holds the API key: no_log wherever it goes)."""
    return _args.config_file_text(settings)


def sglang_execstart(settings, version):
    """The value of the unit's ExecStart=, one quoted argument per line."""
    return _guard(_args.render_execstart, settings, version)


def systemd_quote(arg):
    """One ExecStart argument quoted for a unit file."""
    return _guard(_args.systemd_quote, arg)


def systemd_environment(mapping):
    """sglang_environment -> list of quoted `NAME=value` words for Environment= lines."""
    env = _guard(_args.environment, {"sglang_environment": mapping})
    return [_guard(_args.systemd_quote_env, name, value) for name, value in env.items()]


class FilterModule:
    """gpufleet.inference SGLang filters."""

    def filters(self):
        return {
            "sglang_validate": sglang_validate,
            "sglang_args": sglang_args,
            "sglang_expect": sglang_expect,
            "sglang_execstart": sglang_execstart,
            "sglang_intent": sglang_intent,
            "sglang_server_info": sglang_server_info,
            "sglang_endpoints": sglang_endpoints,
            "sglang_config_path": sglang_config_path,
            "sglang_config_text": sglang_config_text,
            "sglang_verified_from_drift": _records.verified_from_drift,
            "sglang_verification": _records.verification,
            "sglang_adopted_record": _records.adopted_record,
            "sglang_revert_outcome": _records.revert_outcome,
            "systemd_quote": systemd_quote,
            "systemd_environment": systemd_environment,
        }
