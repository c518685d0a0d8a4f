# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment(object):

    # The attributes of the host-side modules that only read.
    DOCUMENTATION = r"""
options: {}
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    platforms: posix
"""

    # Modules that run on the controller through an action plugin of the same name
    # (with ansible.builtin.action_common_attributes.flow, which describes action/async/bypass_host_loop).
    CONTROLLER = r"""
options: {}
attributes:
  action:
    support: full
  async:
    support: none
  bypass_host_loop:
    support: none
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    platforms: all
"""

    # Action plugins that run on the controller and send the collection's modules to the host.
    CONTROLLER_TO_HOST = r"""
options: {}
attributes:
  action:
    support: full
  async:
    support: none
  bypass_host_loop:
    support: none
  check_mode:
    support: full
  diff_mode:
    support: none
  platform:
    platforms: posix
"""
