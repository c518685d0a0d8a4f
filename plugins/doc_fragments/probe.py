# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment(object):

    # The /generate probe. Argument spec: plugins/module_utils/_argspec.py PROBE.
    DOCUMENTATION = r"""
options:
  prompt:
    description:
      - Prompt of the C(/generate) probe (greedy decoding).
    type: str
    default: The capital of France is
  max_new_tokens:
    description:
      - C(max_new_tokens) of the C(/generate) probe.
    type: int
    default: 8
  verify_listener:
    description:
      - Check that the process listening on the host and port of O(url) belongs to the unit's cgroup
        (and is the invocation's main process or one of its children).
      - Reads C(/proc/net/tcp), C(/proc/net/tcp6) and C(/proc/*/fd), so it needs root to see the unit's processes.
      - A listener whose owner is not visible in this host's C(/proc) (another container sharing the network
        namespace, or the machine) counts as outside the unit.
    type: bool
    default: true
"""
