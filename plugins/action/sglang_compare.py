# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Compare one host with the role's intended SGLang settings, in one task (changes nothing).

The role's variables (checked already by Ansible against the entry point's argument spec) are read
by their own names (module_utils/_args.py SETTINGS). Validate what the spec cannot (flag
collisions, version-dependent flags), detect the host's SGLang version, build the intent and render
the unit and journald's drop-in (pure functions of module_utils/_args.py), compare the host with
them (gpufleet.inference.sglang_drift), and - only when the host must change - check the intended
arguments with the host's own SGLang. The result is the drift check's, plus what the host path
needs later (``prepared``: version, endpoint, intent, rendered files and their paths, the config
file's place - never its content). Documentation: plugins/modules/sglang_compare.py.
"""
from __future__ import annotations

import shlex

from ansible import constants as C
from ansible.errors import AnsibleActionFail, AnsibleConnectionFailure
from ansible.plugins.action import ActionBase

from ansible_collections.gpufleet.inference.plugins.module_utils import _args
from ansible_collections.gpufleet.inference.plugins.module_utils import _groups
from ansible_collections.gpufleet.inference.plugins.module_utils import _preflight
from ansible_collections.gpufleet.inference.plugins.module_utils._fleet import intent_digest
from ansible_collections.gpufleet.inference.plugins.module_utils._host import COMMAND_ENV
from ansible_collections.gpufleet.inference.plugins.plugin_utils import _serving

DRIFT_MODULE = "gpufleet.inference.sglang_drift"
PREFLIGHT_MODULE = "gpufleet.inference.sglang_preflight"
# The role's variables this step reads besides the settings of the unit.
CHECK_VARIABLES = ("sglang_version", "sglang_router_worker_url", "sglang_receipt_dir", "sglang_last_good_dir",
                   "sglang_fleet_dir", "sglang_probe_prompt", "sglang_probe_max_new_tokens")

ARGUMENT_SPEC = dict(
    preflight=dict(type="bool", default=True),
)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def _module(self, name, module_args, task_vars):
        result = self._execute_module(module_name=name, module_args=module_args, task_vars=task_vars)
        if result.get("unreachable"):
            result["failed"] = True
        return result

    def _preflight(self, python, environment, task_vars, args=None, detected=None):
        """sglang_preflight's work and result: the version, or with `args` SGLang's own checks of them.
        Through a pipelining connection its small scripts run as commands with their input on stdin (no
        module is sent, and a check does not detect the version again); without pipelining the module
        runs, as it does for a play that calls it."""
        if not self._is_pipelining_enabled("new"):
            module_args = dict(python=python, environment=environment)
            if args is not None:
                module_args["args"] = args
            return self._module(PREFLIGHT_MODULE, module_args, task_vars)

        def execute(argv, env):
            answer = self._low_level_execute_command(shlex.quote(argv[0]) + " -c " + shlex.quote(_preflight.BOOTSTRAP),
                                                     in_data=_preflight.remote_input(argv, env))
            return answer.get("rc"), answer.get("stdout") or "", answer.get("stderr") or ""
        known = None
        if detected and detected.get("version"):
            known = {"version": detected["version"], "source": detected.get("version_source")}
        try:
            return _preflight.preflight(execute, python, _preflight.command_environment(COMMAND_ENV, environment),
                                        args, version=known)
        except AnsibleConnectionFailure as exc:
            return dict(failed=True, unreachable=True, msg=str(exc))

    def _variables(self, task_vars):
        names = _args.SETTINGS + CHECK_VARIABLES
        missing = [name for name in names if name not in task_vars]
        if missing:
            raise AnsibleActionFail("sglang_compare runs inside the role gpufleet.inference.sglang; undefined: %s"
                                    % ", ".join(missing))
        return self._templar.template(dict((name, task_vars[name]) for name in names))

    @staticmethod
    def _managed(task_vars):
        return str(task_vars.get("ansible_managed") or C.config.get_config_value("DEFAULT_MANAGED_STR"))

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        del tmp
        task_vars = task_vars or {}
        dummy, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        values = self._variables(task_vars)
        settings = dict((name, values[name]) for name in _args.SETTINGS)
        host = task_vars.get("inventory_hostname")

        # 1. What the argument spec cannot check (nothing is asked of the host before they are valid), and the
        #    serving group the host is a node of (judged whole, with the variables of its other nodes).
        try:
            _args.validate(settings)
            groups = _serving.groups_of_host(task_vars)
        except (_args.SettingsError, _groups.GroupError) as exc:
            what = "serving group: " if isinstance(exc, _groups.GroupError) else ""
            result.update(failed=True, msg="%s: %s%s (nothing on the host was asked or changed)" % (host, what, exc),
                          step="validate")
            return result
        group = _groups.group_of(groups, host)
        node = _groups.node_args(groups, host)

        # 2. The host's SGLang version (package metadata; SGLang is not imported), unless it is given.
        version = str(values["sglang_version"] or "").strip()
        detected = None
        if not version:
            detected = self._preflight(settings["sglang_python"], settings["sglang_environment"] or {}, task_vars)
            if detected.get("failed"):
                detected.update(step="version")
                result.update(detected)
                return result
            version = detected["version"]

        # 3. What the host must run: intent, /server_info, the unit and journald files, where it answers.
        try:
            intent = _args.build_intent(settings, version, node)
            server_info = _args.intended_server_info(settings, version, node)
            endpoint = _args.server_endpoints(settings["sglang_host"], settings["sglang_port"],
                                              task_vars.get("ansible_host") or host, settings["sglang_extra_args"])
            unit_text = _args.render_unit(settings, version, self._managed(task_vars), node)
        except (_args.SettingsError, TypeError, ValueError) as exc:
            result.update(failed=True, msg="%s: %s" % (host, exc), step="intent", version=version)
            return result
        if values["sglang_router_worker_url"]:
            endpoint["worker_url"] = values["sglang_router_worker_url"]
        journald_text = _args.render_journald(settings, self._managed(task_vars))
        paths = _args.unit_paths(settings)

        # 4. The host against the intent (changes nothing).
        drift_args = dict(
            unit=settings["sglang_unit_name"], url=endpoint["url"], receipt_dir=values["sglang_receipt_dir"],
            last_good_dir=values["sglang_last_good_dir"], fleet_dir=values["sglang_fleet_dir"],
            accounts={"user": settings["sglang_user"], "group": settings["sglang_group"]},
            files=[dict(path=paths["unit"], content=unit_text, mode="0644", owner="root", group="root"),
                   dict(path=paths["journald"], content=journald_text, mode="0644", owner="root",
                        group="root", restart_on_change=False)],
            secret_files=_args.secret_files(settings), expect=intent["expect"], config_line=intent["config_line"],
            command=intent["command"], environment=intent["environment"], server_info=server_info,
            prompt=values["sglang_probe_prompt"], max_new_tokens=values["sglang_probe_max_new_tokens"],
            # a follower serves nothing to probe: its head's /generate is the group's
            probe=not intent.get("follower"))
        if settings.get("sglang_api_key"):
            drift_args["api_key"] = settings["sglang_api_key"]
        drift = self._module(DRIFT_MODULE, drift_args, task_vars)
        result.update(drift)
        config = _args.config_file(settings)
        prepared = dict(
            version=version, version_source=(detected or {}).get("version_source") or "sglang_version",
            endpoint=endpoint, intent=intent, unit_text=unit_text, journald_text=journald_text, paths=paths,
            config_file=config, unit_files=[paths["unit"]] + ([config["path"]] if config else []))
        if group is not None:
            # the serving group this host is a node of: the rollout and the drift report treat it as one server
            prepared["group"] = dict(group.to_dict(), rank=group.rank_of(host))
        prepared["digest"] = intent_digest(prepared)
        # where the host's lease and record are: a play without the role (a rollout's finish) reads them here
        prepared["lease"] = {"unit": values["sglang_unit_name"], "directory": values["sglang_fleet_dir"]}
        result["prepared"] = prepared
        result["ansible_facts"] = {"sglang_endpoint": endpoint}
        if drift.get("failed"):
            result["step"] = "drift"
            return result

        # 5. A host that must change: its own SGLang checks the intended arguments (parses, starts nothing).
        if args["preflight"] and not drift.get("in_sync"):
            checked = self._preflight(settings["sglang_python"], settings["sglang_environment"] or {}, task_vars,
                                      args=intent["command"][3:], detected=detected)
            result["preflight"] = dict((key, checked.get(key)) for key in ("checked", "unchecked", "msg")
                                       if key in checked)
            if checked.get("failed"):
                result.update(failed=True, msg=checked.get("msg"), step="preflight")
                if checked.get("unreachable"):
                    result["unreachable"] = True
                return result
        result["changed"] = False
        return result
