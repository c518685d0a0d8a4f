# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment(object):

    # What the running process must run. Argument spec: plugins/module_utils/_argspec.py INTENT.
    DOCUMENTATION = r"""
options:
  expect:
    description:
      - "Intended values of keys of the config line, for example C({draft_window_size: 2048, compact_cache: true, block_size: 16})."
      - Values are compared with coercion, since Jinja renders them as strings; C("2048") equals C(2048),
        C("None") and C(null) equal C(None), C("true") equals C(True); C(True) never equals C(1).
      - Every config line the invocation logs (rank 0) is compared; a re-initialised worker that logs a
        second line with other values is a mismatch.
    type: dict
    default: {}
  config_line:
    description:
      - Whether the invocation must log a draft-runner config line.
      - V(required) (default when O(expect) is not empty) - the line must be there and agree. Without it the
        verdict is V(missing_config_line) when the journal is complete around where the line belongs, and
        V(unverified) when journald lost it (rate limit, retention) and no receipt of this invocation exists.
      - V(absent) - speculative decoding is meant to be off, or its algorithm logs no such line; any
        draft-runner line is a mismatch.
      - V(optional) (default when O(expect) is empty) - compare the lines if there are any.
    type: str
    choices: [required, absent, optional]
  command:
    description:
      - The command line the main process must run (interpreter, C(-m sglang.launch_server), arguments),
        compared flag by flag with C(/proc/MAINPID/cmdline). Values of secret-looking flags are masked.
      - Catches a drop-in that replaced C(ExecStart=), and a process started before its unit changed.
    type: list
    elements: str
  environment:
    description:
      - The environment the unit must give the process (its C(Environment=) assignments), compared with
        systemd's effective C(Environment=) (drop-ins included) and with the main process's environment
        (only these names are read from it).
    type: dict
"""
