# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Run gpufleet.inference.sglang_ready in slices (plugin_utils/_slices.py): live progress, and a wait that
survives SSH drops. Documentation: plugins/modules/sglang_ready.py."""
from __future__ import annotations

from ansible.plugins.action import ActionBase

from ansible_collections.gpufleet.inference.plugins.plugin_utils._slices import (
    execute_slice,
    reset_connection,
    wait_in_slices,
)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        del tmp
        host = (task_vars or {}).get("inventory_hostname", "?")
        result.update(wait_in_slices(execute_slice(self, task_vars), reset_connection(self), self._task.args, host,
                                     self._task.check_mode))
        return result
