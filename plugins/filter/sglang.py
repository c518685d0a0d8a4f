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
            "systemd_quote": systemd_quote,
            "systemd_environment": systemd_environment,
        }
