# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Compare one host with the role's intended SGLang settings, in one task (changes nothing).

Validate the settings, detect the host's SGLang version (gpufleet.inference.sglang_preflight,
package metadata), build the intent and render the role's unit and journald templates for that
version, compare the host with them (gpufleet.inference.sglang_drift), and - only when the host
must change - check the intended arguments with the host's own SGLang (sglang_preflight with
args). The role's `drift` entry point runs this; its result is the drift result, plus what the
role keeps for the host's later steps (version, endpoint, intent, rendered files).

Why one action: these were five tasks per host (assert, version, set_fact, drift, preflight), each
a controller fork and a templating of the role's settings. The modules and their arguments are
the ones those tasks sent. Documentation: plugins/modules/sglang_compare.py.
"""
from __future__ import annotations

import os
import shlex

import yaml
from ansible.errors import AnsibleActionFail, AnsibleConnectionFailure
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.plugins.action import ActionBase

# ansible-core 2.19+ (meta/runtime.yml): a file's text is templated only when marked as trusted
from ansible.template import generate_ansible_template_vars, trust_as_template

try:
    from yaml import CSafeLoader as SpecLoader
except ImportError:  # pragma: no cover - PyYAML without libyaml
    from yaml import SafeLoader as SpecLoader

from ansible_collections.gpufleet.inference.plugins.module_utils import _args
from ansible_collections.gpufleet.inference.plugins.module_utils import _preflight
from ansible_collections.gpufleet.inference.plugins.module_utils._host import COMMAND_ENV
from ansible_collections.gpufleet.inference.plugins.plugin_utils._builds import collector_paused

# The role's templates call the collection's filters, and Ansible loads every filter file of a collection
# for one of them. Imported with this plugin, in ansible-playbook's main process (its strategy loads the
# action's class there): each host's worker inherits them instead of compiling them again (~10 ms each).
from ansible_collections.gpufleet.inference.plugins.filter import sglang as _sglang_filters  # noqa: F401,E402  pylint: disable=unused-import
from ansible_collections.gpufleet.inference.plugins.filter import sweep as _sweep_filters  # noqa: F401,E402  pylint: disable=unused-import

DRIFT_MODULE = "gpufleet.inference.sglang_drift"
PREFLIGHT_MODULE = "gpufleet.inference.sglang_preflight"

ARGUMENT_SPEC = dict(
    settings=dict(type="dict", required=True, no_log=False),
    version=dict(type="str", default=""),
    address=dict(type="str"),
    worker_url=dict(type="str", default=""),
    templates=dict(type="dict", required=True, options=dict(
        unit=dict(type="str", required=True),
        journald=dict(type="str", required=True),
    )),
    paths=dict(type="dict", required=True, options=dict(
        unit=dict(type="str", required=True),
        journald=dict(type="str", required=True),
    )),
    secret_files=dict(type="list", elements="dict", no_log=True),
    receipt_dir=dict(type="str", required=True),
    last_good_dir=dict(type="str", required=True),
    prompt=dict(type="str", required=True),
    max_new_tokens=dict(type="int", required=True),
    preflight=dict(type="bool", default=True),
    role_argument_spec=dict(type="str"),
)

# The settings keys the action reads directly (the rest go to the args builder as they are).
REQUIRED_SETTINGS = ("sglang_unit_name", "sglang_python", "sglang_user", "sglang_group", "sglang_host",
                     "sglang_port", "sglang_api_key", "sglang_extra_args", "sglang_environment")


def render_template(templar, loader, path, name, task_vars, values):
    """The text of the template at `path` (`name` as the task named it), rendered as the template
    lookup renders it - its search path, ansible_managed and the template_* variables, an
    operator's own ansible_managed kept - with `values` over the host's variables. Without the
    lookup's deep copy of every variable of the host and its templating of the role's settings
    again, which the task's arguments have already templated: a fifth of the lookup's CPU, per host."""
    searchpath = [os.path.dirname(path)]
    for directory in task_vars.get("ansible_search_path") or []:
        searchpath.extend([os.path.join(directory, "templates"), directory])
    generated = generate_ansible_template_vars(name, fullpath=path)
    if "ansible_managed" in task_vars:
        del generated["ansible_managed"]
    variables = dict(task_vars)
    variables.update(generated)
    variables.update(values)
    data_templar = templar.copy_with_new_env(available_variables=variables, searchpath=searchpath)
    return data_templar.template(trust_as_template(loader.get_text_file_contents(path)), escape_backslashes=False)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def _module(self, name, module_args, task_vars):
        # The first host's worker builds the module's payload for the run (see collector_paused).
        with collector_paused():
            result = self._execute_module(module_name=name, module_args=module_args, task_vars=task_vars)
        if result.get("unreachable"):
            result["failed"] = True
        return result

    def _preflight(self, python, environment, task_vars, args=None, detected=None):
        """sglang_preflight's work and result: the version, or with `args` SGLang's own checks of them.
        Through a pipelining connection its small scripts run as commands with their input on stdin: no
        module payload is built in the run or sent per host (~0.2 MB each), and a check does not detect
        the version again. Without pipelining (pipelining off, a become that needs a tty) the module runs,
        as it does for a play that calls it."""
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

    def _role_argument_errors(self, entry_point, task_vars, settings):
        """The role's variables checked against one entry point of its argument spec, as the task
        Ansible puts in front of an entry point would (for a tasks file that is not one: one task
        instead of two). The spec is plain YAML, parsed with libyaml (2.4 ms here; Ansible's loader 18 ms).
        A variable that `settings` holds (keys are the role's variable names) is checked with the value
        this task's arguments templated already; only the others are templated here (each costs ~0.5 ms)."""
        role = getattr(self._task, "_role", None)
        if role is None:
            raise AnsibleActionFail("sglang_compare: role_argument_spec needs the task to be in a role")
        with open(os.path.join(role._role_path, "meta", "argument_specs.yml")) as handle:
            specs = yaml.load(handle, Loader=SpecLoader)  # nosec B506 - a safe loader
        spec = ((specs or {}).get("argument_specs") or {}).get(entry_point)
        if not isinstance(spec, dict):
            raise AnsibleActionFail("sglang_compare: the role has no entry point %r in meta/argument_specs.yml"
                                    % entry_point)
        options = spec.get("options") or {}
        provided = self._templar.template(dict((name, task_vars[name]) for name in options
                                               if name in task_vars and name not in settings))
        provided.update((name, settings[name]) for name in options if name in settings)
        validated = ArgumentSpecValidator(options).validate(provided, validate_role_argument_spec=True)
        return validated.error_messages

    def _render(self, template, task_vars, values):
        """One of the role's templates, as ansible.builtin.template's lookup renders it in a task (see
        render_template), with `values` (the settings this task's arguments already hold, the version)."""
        return render_template(self._templar, self._loader, self._find_needle("templates", template), template,
                               task_vars, values)

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        del tmp
        task_vars = task_vars or {}
        dummy, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        if args["role_argument_spec"]:
            errors = self._role_argument_errors(args["role_argument_spec"], task_vars, args["settings"])
            if errors:
                result.update(failed=True, step="validate", argument_errors=errors,
                              msg="%s: the role's variables are not valid (nothing on the host was asked or "
                                  "changed): %s" % (task_vars.get("inventory_hostname"), "; ".join(errors)))
                return result
        settings = args["settings"]
        missing = [key for key in REQUIRED_SETTINGS if key not in settings]
        if missing:
            raise AnsibleActionFail("sglang_compare: settings lack %s" % ", ".join(missing))

        # 1. The settings alone (version-independent): nothing is asked of the host before they are valid.
        try:
            _args.validate(settings)
        except _args.SettingsError as exc:
            result.update(failed=True, msg=str(exc), step="validate")
            return result

        # 2. The host's SGLang version (package metadata; SGLang is not imported), unless it is given.
        version = str(args["version"] or "").strip()
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
            intent = _args.build_intent(settings, version)
            server_info = _args.intended_server_info(settings, version)
            endpoint = _args.server_endpoints(settings["sglang_host"], settings["sglang_port"],
                                              args.get("address") or task_vars.get("inventory_hostname"),
                                              settings["sglang_extra_args"])
        except (_args.SettingsError, TypeError, ValueError) as exc:
            result.update(failed=True, msg=str(exc), step="intent", version=version)
            return result
        if args["worker_url"]:
            endpoint["worker_url"] = args["worker_url"]
        # The settings, templated once for this task's arguments, are what the templates read.
        values = dict(settings, __sglang_settings=settings, __sglang_version=version)
        unit_text = self._render(args["templates"]["unit"], task_vars, values)
        journald_text = self._render(args["templates"]["journald"], task_vars, values)

        # 4. The host against the intent (changes nothing). The config file with the API key comes from the
        # settings unless the task names its secret files (no template and no filter plugin for it per host).
        api_key = settings.get("sglang_api_key") or None
        secret_files = args["secret_files"] if args["secret_files"] is not None else _args.secret_files(settings)
        drift_args = dict(
            unit=settings["sglang_unit_name"], url=endpoint["url"], receipt_dir=args["receipt_dir"],
            last_good_dir=args["last_good_dir"],
            accounts={"user": settings["sglang_user"], "group": settings["sglang_group"]},
            files=[dict(path=args["paths"]["unit"], content=unit_text, mode="0644", owner="root", group="root"),
                   dict(path=args["paths"]["journald"], content=journald_text, mode="0644", owner="root",
                        group="root", restart_on_change=False)],
            secret_files=secret_files, expect=intent["expect"], config_line=intent["config_line"],
            command=intent["command"], environment=intent["environment"], server_info=server_info,
            prompt=args["prompt"], max_new_tokens=args["max_new_tokens"])
        if api_key:
            drift_args["api_key"] = api_key
        drift = self._module(DRIFT_MODULE, drift_args, task_vars)
        result.update(drift)
        # What the host's later steps need besides the secrets (the config file's content is never here).
        config = _args.config_file(settings)
        prepared = dict(version=version, version_source=(detected or {}).get("version_source") or "sglang_version",
                        endpoint=endpoint, intent=intent, unit_text=unit_text, journald_text=journald_text,
                        paths=dict(args["paths"]), config_file=config,
                        unit_files=[args["paths"]["unit"]] + ([config["path"]] if config else []))
        result["prepared"] = prepared
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
