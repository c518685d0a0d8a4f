# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment(object):

    # The SGLang unit and where its verification receipts live.
    # Argument spec: plugins/module_utils/_argspec.py UNIT.
    DOCUMENTATION = r"""
options:
  unit:
    description:
      - The systemd unit running SGLang.
    type: str
    default: sglang.service
  receipt_dir:
    description:
      - Directory of the verification receipts on the managed host, one C(<unit>.json) per unit.
      - A receipt records what a passing verification saw (InvocationID, config lines, their
        journal cursors, command line). A later check of the B(same) invocation whose startup
        lines journald has rotated away uses it; a receipt of another invocation never counts.
    type: path
    default: /var/lib/gpufleet-inference/receipts
"""
