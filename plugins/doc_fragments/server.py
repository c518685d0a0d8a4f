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
      - The role M(gpufleet.inference.sglang) derives it from C(sglang_host) and C(sglang_port)
        (fact C(sglang_endpoint.url)); a wildcard bind is probed on loopback.
    type: str
    default: http://127.0.0.1:30000
  api_key:
    description:
      - "The server's C(--api-key), sent as C(Authorization: Bearer <api_key>). Never logged or returned."
    type: str
  validate_certs:
    description:
      - Whether to validate TLS certificates when O(url) is C(https).
    type: bool
    default: true
"""
