# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""How SGLang spells each setting the collection verifies: the one table of them.

Private to this collection: no compatibility promise. Host-side and pure (the modules sent to a
host import it; so do the controller's args builder and records).

A setting has a role variable, SGLang flags (renamed across releases, with aliases), a key in the
draft runner's config line, and a key in /server_info. ``SPELLINGS`` holds them side by side, so no
other code rewrites one spelling into another.
"""
from __future__ import annotations

# The draft window's flag changed names (SGLang's srt/server_args.py, release by release): 0.5.11 has only the DFLASH one; 0.5.12
# adds the generic one (the old one a silent alias); 0.5.13-0.5.19 warn on the old one; 0.5.20+
# refuse it.
WINDOW_FLAG_OLD = "--speculative-dflash-draft-window-size"
WINDOW_FLAG_NEW = "--speculative-draft-window-size"
BLOCK_SIZE_FLAG = "--speculative-num-draft-tokens"
# DDTree exists only in an upstream pull request / private builds: the flag the simulator accepts.
TREE_BUDGET_FLAG = "--speculative-ddtree-tree-budget"

# role variable -> (config-line key, flags that set it (the role's first), /server_info keys)
SPELLINGS = {
    "sglang_speculative_draft_window_size": (
        "draft_window_size", (WINDOW_FLAG_NEW, WINDOW_FLAG_OLD),
        ("speculative_draft_window_size", "speculative_dflash_draft_window_size")),
    "sglang_speculative_num_draft_tokens": (
        "block_size", (BLOCK_SIZE_FLAG, "--speculative-dflash-block-size"), ("speculative_num_draft_tokens",)),
    "sglang_speculative_tree_budget": ("tree_budget", (TREE_BUDGET_FLAG,), ("speculative_ddtree_tree_budget",)),
}
# compact_cache is logged True exactly when a window is set: the window's flags decide it.
_DERIVED_KEYS = {"compact_cache": "sglang_speculative_draft_window_size"}

# Config-line keys that describe the settings (attention_backend and model describe the build).
SETTING_KEYS = ("draft_window_size", "block_size", "tree_budget", "compact_cache")

# SGLang's option that merges a YAML file into its argv in-process (0.5.10 and later); the role
# passes the API key that way, never on the command line.
CONFIG_FLAG = "--config"


def flags_for_key(key):
    """Unit flags that determine config-line key `key` (empty tuple when none is known)."""
    variable = _DERIVED_KEYS.get(key) or next((name for name, spelled in SPELLINGS.items() if spelled[0] == key), None)
    return SPELLINGS[variable][1] if variable else ()


def server_info_key(variable, flag):
    """The /server_info key SGLang reports the value of `flag` under (an alias shares its flag's key)."""
    dummy, flags, keys = SPELLINGS[variable]
    return keys[min(flags.index(flag), len(keys) - 1)]
