# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one table of a setting's spellings: role variable, flags, config-line key, /server_info key."""
import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils import _flags


@pytest.mark.parametrize("key, flags", [
    ("draft_window_size", ("--speculative-draft-window-size", "--speculative-dflash-draft-window-size")),
    ("compact_cache", ("--speculative-draft-window-size", "--speculative-dflash-draft-window-size")),
    ("block_size", ("--speculative-num-draft-tokens", "--speculative-dflash-block-size")),
    ("tree_budget", ("--speculative-ddtree-tree-budget",)),
    ("nothing", ()),
])
def test_the_flags_that_decide_a_config_line_key(key, flags):
    assert _flags.flags_for_key(key) == flags


def test_server_info_keys_follow_the_flag_a_release_takes():
    window = "sglang_speculative_draft_window_size"
    assert _flags.server_info_key(window, _flags.WINDOW_FLAG_NEW) == "speculative_draft_window_size"
    assert _flags.server_info_key(window, _flags.WINDOW_FLAG_OLD) == "speculative_dflash_draft_window_size"
    # an alias reports under its flag's key
    assert _flags.server_info_key("sglang_speculative_num_draft_tokens", "--speculative-dflash-block-size") == \
        "speculative_num_draft_tokens"
    with pytest.raises(ValueError):
        _flags.server_info_key(window, "--tp-size")


def test_every_setting_key_has_a_spelling():
    keys = set(spelled[0] for spelled in _flags.SPELLINGS.values()) | {"compact_cache"}
    assert set(_flags.SETTING_KEYS) == keys
