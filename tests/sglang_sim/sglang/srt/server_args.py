"""Simulated ``sglang.srt.server_args``: the real CLI surface, no heavy imports.

The flag table of each release was dumped from the real wheel by
``tests/sglang_sim/tools/extract_flags.py`` (flags_0_5_11.json, flags_0_5_23.json);
releases in between are derived from them (see ``_specs_for``).
"""
from __future__ import annotations

import argparse
import json
import logging
import os

from sglang._sim_profile import at_least, selected_version

logger = logging.getLogger(__name__)

_HERE = os.path.dirname(os.path.abspath(__file__))
OLD_WINDOW_FLAG = "--speculative-dflash-draft-window-size"
NEW_WINDOW_FLAG = "--speculative-draft-window-size"
DDTREE_BUDGET_FLAG = "--speculative-ddtree-tree-budget"


def window_key(version=None):
    """server_info / ServerArgs key of the DFlash draft window for a release."""
    if at_least("0.5.12", version):
        return "speculative_draft_window_size"
    return "speculative_dflash_draft_window_size"


def window_flag(version=None):
    return NEW_WINDOW_FLAG if at_least("0.5.12", version) else OLD_WINDOW_FLAG


# ---- argparse type converters, named like SGLang's so error texts match ----
def loads(value):
    return json.loads(value)


def json_list_type(value):
    return json.loads(value)


def nullable_str(value):
    if value is None or value.lower() in ("none", "null", ""):
        return None
    return value


def human_readable_int(value):
    text = str(value).strip().lower().replace("_", "")
    scale = {"k": 1000, "m": 1000**2, "g": 1000**3}
    if text and text[-1] in scale:
        return int(float(text[:-1]) * scale[text[-1]])
    return int(text)


_TYPES = {
    "str": str,
    "int": int,
    "float": float,
    "loads": loads,
    "json_list_type": json_list_type,
    "nullable_str": nullable_str,
    "human_readable_int": human_readable_int,
}


def _print_deprecated_warning(message):
    logger.warning(message)


class DeprecatedAction(argparse.Action):
    def __init__(self, option_strings, dest, nargs=0, **kwargs):
        super().__init__(option_strings, dest, nargs=nargs, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        _print_deprecated_warning(
            f"The command line argument '{option_string}' is deprecated and will be removed in future versions."
        )


class DeprecatedStoreTrueAction(argparse.Action):
    def __init__(self, option_strings, dest, nargs=0, const=True, default=False, **kwargs):
        super().__init__(option_strings, dest, nargs=0, const=True, default=default, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        _print_deprecated_warning(
            f"The command line argument '{option_string}' is deprecated and will be removed in future versions."
        )
        setattr(namespace, self.dest, True)


class DeprecatedStoreAction(argparse.Action):
    """Old spelling of a renamed flag: stores into the new dest and warns."""

    def __init__(self, option_strings, dest, new_flag=None, **kwargs):
        self.new_flag = new_flag
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        _print_deprecated_warning(
            f"The command line argument '{option_string}' is deprecated and will be removed in "
            f"future versions. Please use '{self.new_flag}' instead."
        )
        setattr(namespace, self.dest, values)


class LoRAPathAction(argparse.Action):
    def __init__(self, option_strings, dest, nargs="*", **kwargs):
        super().__init__(option_strings, dest, nargs=nargs, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, list(values or []))


def _load_json(name):
    with open(os.path.join(_HERE, name), encoding="utf-8") as handle:
        return json.load(handle)


def _ddtree_spec():
    # Private-build flag (DDTree lives in an open upstream PR), see README.
    return {
        "flags": [DDTREE_BUDGET_FLAG],
        "dest": "speculative_ddtree_tree_budget",
        "action": "_StoreAction",
        "nargs": None,
        "const": None,
        "default": None,
        "type": "int",
        "choices": None,
        "required": False,
    }


def _specs_for(version):
    """Flag table of a release, derived from the two dumped tables."""
    if at_least("0.5.20", version):
        specs = _load_json("flags_0_5_23.json")
    else:
        specs = _load_json("flags_0_5_11.json")
    out = []
    for spec in specs:
        spec = dict(spec)
        if spec["dest"] == "speculative_algorithm" and spec["choices"]:
            choices = list(spec["choices"])
            if not at_least("0.5.11", version):
                choices = [c for c in choices if c != "DFLASH"]
            spec["choices"] = choices + ["DDTREE"]
        if spec["dest"] in ("speculative_dflash_block_size", "speculative_dflash_draft_window_size"):
            if not at_least("0.5.11", version):
                continue  # 0.5.10 has no DFLASH
        if spec["dest"] == "speculative_dflash_draft_window_size" and at_least("0.5.12", version):
            new = dict(spec, flags=[NEW_WINDOW_FLAG], dest="speculative_draft_window_size")
            if not at_least("0.5.13", version):
                # 0.5.12: the old spelling is a silent alias.
                new["flags"] = [NEW_WINDOW_FLAG, OLD_WINDOW_FLAG]
                out.append(new)
            else:
                out.append(new)
                out.append(dict(spec, flags=[OLD_WINDOW_FLAG], dest="speculative_draft_window_size",
                                action="DeprecatedStoreAction", default=argparse.SUPPRESS))
            continue
        out.append(spec)
        if spec["dest"] in ("speculative_dflash_block_size",):
            out.append(_ddtree_spec())
    if not any(s["dest"] == "speculative_ddtree_tree_budget" for s in out):
        out.append(_ddtree_spec())
    return out


def add_cli_args(parser, version=None):
    version = version or selected_version()
    for spec in _specs_for(version):
        flags = spec["flags"]
        action = spec["action"]
        kwargs = {"dest": spec["dest"]}
        if spec["default"] is not argparse.SUPPRESS:
            kwargs["default"] = spec["default"]
        else:
            kwargs["default"] = argparse.SUPPRESS
        if action in ("_StoreTrueAction", "_StoreFalseAction"):
            kwargs["action"] = "store_true" if action == "_StoreTrueAction" else "store_false"
        elif action == "BooleanOptionalAction":
            kwargs["action"] = argparse.BooleanOptionalAction
            flags = [flags[0]]
        elif action == "_StoreConstAction":
            kwargs.update(action="store_const", const=spec["const"])
        elif action == "DeprecatedAction":
            kwargs["action"] = DeprecatedAction
        elif action == "DeprecatedStoreTrueAction":
            kwargs["action"] = DeprecatedStoreTrueAction
        elif action == "LoRAPathAction":
            kwargs["action"] = LoRAPathAction
        else:
            if action == "DeprecatedStoreAction":
                kwargs["action"] = DeprecatedStoreAction
                kwargs["new_flag"] = NEW_WINDOW_FLAG
            elif action == "DeprecatedStoreConstAction":
                kwargs["action"] = DeprecatedStoreAction
                kwargs["new_flag"] = "(see --help)"
            elif action == "_AppendAction":
                kwargs["action"] = "append"
            kwargs["type"] = _TYPES.get(spec["type"], str) if spec["type"] else None
            if kwargs["type"] is None:
                kwargs.pop("type")
            if spec["nargs"] is not None:
                kwargs["nargs"] = spec["nargs"]
            if spec["choices"] is not None:
                kwargs["choices"] = spec["choices"]
            if spec["required"]:
                kwargs["required"] = True
        parser.add_argument(*flags, **kwargs)


# dest -> ServerArgs field (0.5.11 keeps the long names on the argparse side)
_FIELD_RENAMES = {
    "tensor_parallel_size": "tp_size",
    "pipeline_parallel_size": "pp_size",
    "attention_context_parallel_size": "attn_cp_size",
    "moe_data_parallel_size": "moe_dp_size",
    "data_parallel_size": "dp_size",
    "expert_parallel_size": "ep_size",
}


class ServerArgs:
    """Flat record of the parsed flags, in the real field order."""

    def __init__(self, **kwargs):
        object.__setattr__(self, "_fields", list(kwargs))
        self.__dict__.update(kwargs)
        self.__post_init__()

    def __setattr__(self, name, value):
        if not name.startswith("_") and name not in self._fields:
            self._fields.append(name)
        object.__setattr__(self, name, value)

    @staticmethod
    def add_cli_args(parser):
        add_cli_args(parser)

    @classmethod
    def from_cli_args(cls, args):
        values = {}
        for key, value in vars(args).items():
            values[_FIELD_RENAMES.get(key, key)] = value
        return cls(**values)

    def to_dict(self):
        return {name: getattr(self, name) for name in self._fields}

    def __repr__(self):
        body = ", ".join(f"{k}={getattr(self, k)!r}" for k in self._fields)
        return f"ServerArgs({body})"

    def url(self):
        host = self.host
        if not host or host == "0.0.0.0":
            host = "127.0.0.1"
        return f"http://{host}:{self.port}"

    # ------------------------------------------------------------------
    def __post_init__(self):
        for key in ("tp_size", "pp_size", "dp_size", "ep_size"):
            if getattr(self, key, None) is None:
                object.__setattr__(self, key, 1)
        algo = getattr(self, "speculative_algorithm", None)
        if algo == "DFLASH":
            self._handle_dflash()
        elif algo == "DDTREE":
            self._handle_ddtree()
        elif algo in ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE"):
            if self.speculative_num_steps is None:
                self.speculative_num_steps = 3
            if self.speculative_eagle_topk is None:
                self.speculative_eagle_topk = 1
            if self.speculative_num_draft_tokens is None:
                self.speculative_num_draft_tokens = self.speculative_num_steps + 1
        elif algo == "NGRAM":
            if self.speculative_num_draft_tokens is None:
                self.speculative_num_draft_tokens = 8

    def _infer_block_size(self):
        path = self.speculative_draft_model_path
        try:
            with open(os.path.join(path, "config.json"), encoding="utf-8") as handle:
                config = json.load(handle)
        except Exception as exc:  # same fallback chain as SGLang
            logger.warning(
                "Failed to infer DFLASH block_size from draft model config; "
                "defaulting speculative_num_draft_tokens to 16. Error: %s",
                exc,
            )
            return None
        dflash = config.get("dflash_config") or {}
        value = dflash.get("block_size", config.get("block_size"))
        return int(value) if value is not None else None

    def _handle_dflash(self):
        version = selected_version()
        new = at_least("0.5.12", version)
        wkey = window_key(version)
        wflag = window_flag(version)
        if self.pp_size != 1:
            raise ValueError("Currently DFLASH speculative decoding only supports pp_size == 1.")
        if self.speculative_draft_model_path is None:
            raise ValueError(
                "DFLASH speculative decoding requires setting --speculative-draft-model-path."
            )
        for key in ("speculative_num_steps", "speculative_eagle_topk"):
            current = getattr(self, key)
            if current is None:
                setattr(self, key, 1)
            elif int(current) != 1:
                logger.warning(
                    "DFLASH only supports %s == 1; overriding %s=%s to 1.", key, key, current
                )
                setattr(self, key, 1)
        if self.speculative_dflash_block_size is not None:
            if int(self.speculative_dflash_block_size) <= 0:
                raise ValueError(
                    "DFLASH requires --speculative-dflash-block-size to be positive, "
                    f"got {self.speculative_dflash_block_size}."
                )
            if self.speculative_num_draft_tokens is not None and int(
                self.speculative_num_draft_tokens
            ) != int(self.speculative_dflash_block_size):
                raise ValueError(
                    "Both --speculative-num-draft-tokens and --speculative-dflash-block-size are set "
                    "but they differ. For DFLASH they must match. "
                    f"speculative_num_draft_tokens={self.speculative_num_draft_tokens}, "
                    f"speculative_dflash_block_size={self.speculative_dflash_block_size}."
                )
            self.speculative_num_draft_tokens = int(self.speculative_dflash_block_size)
        window = getattr(self, wkey, None)
        if window is not None:
            window = int(window)
            if window <= 0:
                if at_least("0.5.20", version):
                    raise ValueError(f"{wflag} must be positive, got {window}.")
                raise ValueError(f"DFLASH requires {wflag} to be positive, got {window}.")
            setattr(self, wkey, window)
        if self.speculative_num_draft_tokens is None:
            inferred = self._infer_block_size()
            if inferred is None:
                inferred = 16
                logger.warning(
                    "speculative_num_draft_tokens is not set; defaulting to %d for DFLASH.",
                    inferred,
                )
            self.speculative_num_draft_tokens = inferred
        if window is not None:
            draft_tokens = int(self.speculative_num_draft_tokens)
            if window < draft_tokens:
                prefix = "" if at_least("0.5.20", version) else "DFLASH "
                raise ValueError(
                    f"{prefix}{wflag} must be >= "
                    "--speculative-num-draft-tokens (block_size). "
                    f"window_size={window}, block_size={draft_tokens}."
                )
        del new

    def _handle_ddtree(self):
        if self.speculative_draft_model_path is None:
            raise ValueError(
                "DDTREE speculative decoding requires setting --speculative-draft-model-path."
            )
        if self.speculative_dflash_block_size is not None and self.speculative_num_draft_tokens is None:
            self.speculative_num_draft_tokens = int(self.speculative_dflash_block_size)
        if self.speculative_num_draft_tokens is None:
            self.speculative_num_draft_tokens = 16
        if self.speculative_ddtree_tree_budget is None:
            self.speculative_ddtree_tree_budget = 64
        if int(self.speculative_ddtree_tree_budget) <= 0:
            raise ValueError(
                f"DDTREE requires {DDTREE_BUDGET_FLAG} to be positive, "
                f"got {self.speculative_ddtree_tree_budget}."
            )
        self.speculative_num_steps = self.speculative_num_steps or 1
        self.speculative_eagle_topk = self.speculative_eagle_topk or 1


def build_parser(version=None):
    parser = argparse.ArgumentParser(prog="sglang serve")
    add_cli_args(parser, version)
    return parser


def prepare_server_args(argv):
    """Parse argv like ``sglang serve`` does (argparse errors exit 2)."""
    parser = build_parser()
    raw_args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, str(raw_args.log_level).upper(), logging.INFO),
        format="[%(asctime)s] %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
        force=True,
    )
    return ServerArgs.from_cli_args(raw_args)
