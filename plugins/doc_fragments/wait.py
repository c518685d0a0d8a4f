# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment(object):

    # Waiting with a monotonic clock; the timeout must fit 10-minute model loads.
    # Argument spec: plugins/module_utils/_argspec.py WAIT.
    DOCUMENTATION = r"""
options:
  timeout:
    description:
      - Seconds to wait in total, measured with a monotonic clock.
      - Loading a large model takes minutes; the default allows for a 10-minute load.
      - On timeout the task fails with the last phase reached and the last journal line seen.
    type: float
    default: 900
  poll_interval:
    description:
      - Seconds of one tick of the wait. Each tick blocks in the journal of the invocation (a new
        line is seen at once), checks that the main process lives, and tries a TCP connect to the
        port; C(/generate) is sent as soon as the port accepts connections.
      - systemd's own state is read at most once a second, and at once when the journal shows
        systemd's messages about the invocation (exit, restart).
    type: float
    default: 0.25
  request_timeout:
    description:
      - Seconds one HTTP request may take; always bounded by the time left of O(timeout),
        so a hanging server cannot hold the task past O(timeout).
    type: float
    default: 60
"""
