#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations

DOCUMENTATION = r"""
module: sglang_preflight
short_description: Detect the installed SGLang version, and check arguments with the host's own SGLang
version_added: 0.1.0
description:
  - Reads the version of the SGLang installed for O(python) from its package metadata, without importing SGLang (an
    import of real SGLang 0.5.23 costs about 4 seconds and 450 MB).
  - With O(args), runs what SGLang's launch runs before it needs the GPUs, in one Python process with one import -
    its argument parser (C(prepare_server_args)) and, on releases that validate at resolution (0.5.19 and later),
    that resolution as far as it runs without touching the GPUs. Fails naming the cause when SGLang rejects the
    arguments; RV(unchecked) says what could not be checked on this host.
  - Changes nothing and starts no server.
author:
  - gpufleet maintainers (@gpufleet)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - gpufleet.inference.attributes
options:
  python:
    description: The interpreter that has SGLang installed (the unit's C(ExecStart) interpreter).
    type: path
    default: /opt/sglang/venv/bin/python
  environment:
    description: Environment the server gets (C(sglang_environment)), so the check sees what the server will.
    type: dict
    default: {}
  args:
    description:
      - SGLang's arguments (after C(-m sglang.launch_server)) to check. Omit to only detect the version.
      - A C(--config FILE) pair is left out (the file holds the API key and may not be installed yet).
    type: list
    elements: str
notes:
  - Runs as the connecting user; the SGLang installation must be readable by it.
"""

EXAMPLES = r"""
- name: Which SGLang is installed?
  gpufleet.inference.sglang_preflight:
    python: /opt/sglang/venv/bin/python
  register: detected

- name: Would it accept these arguments?
  gpufleet.inference.sglang_preflight:
    python: /opt/sglang/venv/bin/python
    args: [--model-path, /models/Kimi-K2.6, --tp-size, "8", --speculative-algorithm, DFLASH]
"""

RETURN = r"""
version:
  description: The installed SGLang version.
  returned: always
  type: str
  sample: 0.5.23
version_source:
  description: V(metadata), or V(import) when the package has no metadata and had to be imported.
  returned: always
  type: str
checked:
  description: What was checked (for example V(parse), V(resolve)).
  returned: when O(args) is given
  type: list
  elements: str
unchecked:
  description: What could not be checked on this host, and why.
  returned: when O(args) is given
  type: list
  elements: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.inference.plugins.module_utils import _preflight
from ansible_collections.gpufleet.inference.plugins.module_utils._host import COMMAND_ENV


def main():
    module = AnsibleModule(
        argument_spec=dict(
            python=dict(type="path", default="/opt/sglang/venv/bin/python"),
            environment=dict(type="dict", default={}),
            args=dict(type="list", elements="str"),
        ),
        supports_check_mode=True,
    )
    result = _preflight.preflight(lambda argv, env: module.run_command(argv, environ_update=env),
                                  module.params["python"], _preflight.command_environment(COMMAND_ENV, module.params["environment"]),
                                  module.params["args"])
    if result.pop("failed", False):
        module.fail_json(**result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
