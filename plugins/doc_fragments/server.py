# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment(object):

    # How modules reach the SGLang HTTP server of a unit.
    # Argument spec: plugins/module_utils/_argspec.py SERVER.
    DOCUMENTATION = r"""
options:
  url:
    description:
      - Base URL of the SGLang HTTP server, as clients on the managed host reach it.
      - Its host and port also name the listening socket whose owner must belong to the unit.
      - The role P(gpufleet.inference.sglang#role) derives it from C(sglang_host) and C(sglang_port)
        (fact C(sglang_endpoint.url)); a wildcard bind is probed on loopback.
    type: str
    default: http://127.0.0.1:30000
  api_key:
    description:
      - "The server's C(--api-key), sent as C(Authorization: Bearer <api_key>). Never logged or returned."
      - Mutually exclusive with O(api_key_file).
    type: str
  api_key_file:
    description:
      - An SGLang config file on the managed host (YAML, its C(api-key)) to read the key from, instead of
        O(api_key) - the key of the files on the host, for example after a revert restored an older config file.
      - A file that does not exist means no key. The key is masked in every output, like O(api_key).
    type: path
  validate_certs:
    description:
      - Whether to validate TLS certificates when O(url) is C(https).
    type: bool
    default: true
"""
