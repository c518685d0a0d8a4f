# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""gpufleet.inference.sglang_canary_analysis on the controller, in-process.

Benchmarks the canary and its baseline from the controller (each host's own port), judges and writes
the report; the logic is plugins/module_utils/_canary.py (benchmark _bench, judge _canary_judge), the
documentation plugins/modules/sglang_canary_analysis.py. Progress lines show with -v.
"""
from __future__ import annotations

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.gpufleet.inference.plugins.module_utils import _http
from ansible_collections.gpufleet.inference.plugins.module_utils._canary import (
    DEFAULT_ROUNDS,
    Analysis,
    AnalysisError,
    write_report,
)

# urllib and ssl loaded with this plugin, in ansible-playbook's main process: each worker inherits them.
_http.preload()

display = Display()

TARGET = dict(
    name=dict(type="str"),
    url=dict(type="str", required=True),
    api_key=dict(type="str", no_log=True),
)

ARGUMENT_SPEC = dict(
    canary=dict(type="dict", required=True, options=TARGET),
    baseline=dict(type="dict", required=True, options=TARGET),
    workload=dict(type="dict", default={}),
    rounds=dict(type="int", default=DEFAULT_ROUNDS),
    warmup_requests=dict(type="int"),
    thresholds=dict(type="dict", default={}),
    router_url=dict(type="str"),
    router_api_key=dict(type="str", no_log=True),
    report_dir=dict(type="path"),
    chart=dict(type="bool", default=True),
    timeout=dict(type="float", default=300.0),
    validate_certs=dict(type="bool", default=True),
)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        del tmp
        dummy, params = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        host = (task_vars or {}).get("inventory_hostname", "localhost")
        try:
            analysis = Analysis.prepare(params, progress=lambda line: display.v("%s: canary analysis: %s" % (host, line)))
        except AnalysisError as exc:
            raise AnsibleActionFail("sglang_canary_analysis: %s" % exc)
        outcome = analysis.run()
        if params["report_dir"]:
            try:
                outcome["report"] = write_report(outcome, params["report_dir"], params["chart"], self._task.check_mode)
            except OSError as exc:
                raise AnsibleActionFail("sglang_canary_analysis: writing the report in %s: %s"
                                        % (params["report_dir"], exc))
        result.update(outcome)
        result["msg"] = outcome["message"]
        result["changed"] = False
        return result
