# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""gpufleet.inference.sglang_router_worker on the controller, in-process.

The router is the controller's business: its API is called from here, whatever host the task
is for, without sending the module anywhere (no fork of a Python interpreter per host and step,
and no ``delegate_to: localhost`` needed). The module file keeps the documentation and the logic.
"""
from __future__ import annotations

from ansible.plugins.action import ActionBase

from ansible_collections.gpufleet.inference.plugins.module_utils import _http
from ansible_collections.gpufleet.inference.plugins.module_utils._argspec import ROUTER_WORKER
from ansible_collections.gpufleet.inference.plugins.module_utils._router import RouterError, worker_change

# urllib and ssl loaded with this plugin, in ansible-playbook's main process: each worker inherits them.
_http.preload()


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        del tmp
        validation, params = self.validate_argument_spec(argument_spec=ROUTER_WORKER)
        try:
            outcome = worker_change(params, self._task.check_mode)
        except RouterError as exc:
            result.update(failed=True, changed=False, msg=str(exc))
            return result
        if not self._task.diff:
            outcome.pop("diff", None)
        result.update(outcome)
        return result
