"""Simulated ``sglang.srt.server_args``: the real CLI surface, no heavy imports.

Each release's argparse actions and ServerArgs fields come from its profile
(``profiles/<version>.json``, dumped from the real wheel by
``tests/sglang_sim/tools/extract_flags.py``).  Where validation runs follows the
real code:

- 0.5.10-0.5.17: ``ServerArgs.__post_init__`` (so inside ``prepare_server_args``);
- 0.5.18: ``__post_init__`` calls ``self._run_resolution_pipeline()``;
- 0.5.19+: ``__post_init__`` does nothing, ``prepare_server_args`` is argparse
  only, and ``ServerArgs.resolve_once()`` (called by ``run_server`` at launch)
  resolves and validates.  Fields keep the raw input; ``resolved_dict()``
  returns the resolved values.

The resolution modelled is the part that matters to the simulator: defaults of
the identity fields and the speculative-decoding handlers (DFLASH in full, with
the real error texts of each release).
"""
from __future__ import annotations

import argparse
import copy
import json
import logging
import os
import random
import re
from decimal import Decimal

from sglang._sim_profile import at_least, load_profile, selected_version, version_tuple

logger = logging.getLogger(__name__)

OLD_WINDOW_FLAG = "--speculative-dflash-draft-window-size"
NEW_WINDOW_FLAG = "--speculative-draft-window-size"
DDTREE_BUDGET_FLAG = "--speculative-ddtree-tree-budget"

# Members of SpeculativeAlgorithm (sglang/srt/speculative/spec_info.py) per release.
_ALGORITHMS = (
    ("0.5.10", ("EAGLE", "EAGLE3", "STANDALONE", "NGRAM", "NONE")),
    ("0.5.11", ("DFLASH",)),
    ("0.5.12", ("FROZEN_KV_MTP",)),
    ("0.5.16", ("DSPARK",)),
    ("0.5.20", ("UNO",)),
)


def window_key(version=None):
    """server_info / ServerArgs key of the DFlash draft window for a release."""
    if at_least("0.5.12", version):
        return "speculative_draft_window_size"
    return "speculative_dflash_draft_window_size"


def window_flag(version=None):
    return NEW_WINDOW_FLAG if at_least("0.5.12", version) else OLD_WINDOW_FLAG


def ddtree_enabled():
    """DDTREE exists only in private builds (an open upstream PR): opt in with SGLANG_SIM_DDTREE=1."""
    return os.environ.get("SGLANG_SIM_DDTREE", "").lower() in ("1", "true", "yes", "on")


def known_algorithms(version=None):
    names = []
    for since, added in _ALGORITHMS:
        if at_least(since, version):
            names.extend(added)
    if ddtree_enabled():
        names.append("DDTREE")
    return names


# ---- argparse type converters, named like SGLang's so argparse's error texts match ----
def loads(value):
    return json.loads(value)


def json_list_type(value):
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        raise argparse.ArgumentTypeError(
            f"Invalid JSON list: {value}. Please provide a valid JSON list."
        )


def nullable_str(val):
    if not val or val == "None":
        return None
    return val


def human_readable_int(value):
    value = value.strip()
    si_multiplier = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
    iec_multiplier = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)", value)
    if match:
        number, suffix = match.groups()
        if suffix in iec_multiplier:
            if "." in number:
                raise argparse.ArgumentTypeError(
                    f"Decimals are not allowed with IEC suffixes like '{suffix}'. "
                    f"Use an integer IEC value such as '{int(Decimal(number))}{suffix}', "
                    f"or an SI value such as '{number}{suffix[0]}'."
                )
            return int(number) * iec_multiplier[suffix]
        return int(Decimal(number) * si_multiplier[suffix])
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"Invalid integer value: '{value}'. "
            "Use a plain integer, SI suffixes (1k, 1M), or IEC suffixes (1Ki, 1Mi). "
            "Suffixes are case-sensitive."
        )


def parse_cuda_graph_config_arg(raw):
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"--cuda-graph-config must be JSON: {e}")
    if not isinstance(parsed, dict):
        raise argparse.ArgumentTypeError(
            f"--cuda-graph-config must be a JSON object, got {type(parsed).__name__}"
        )
    return parsed


def parse_cuda_graph_backend_arg(raw):
    if raw == "tc_piecewise":
        raise argparse.ArgumentTypeError(
            "tc_piecewise was removed; select breakable, full, or disabled"
        )
    return raw


_TYPES = {
    "str": str,
    "int": int,
    "float": float,
    "loads": loads,
    "json_list_type": json_list_type,
    "nullable_str": nullable_str,
    "human_readable_int": human_readable_int,
    "parse_cuda_graph_config_arg": parse_cuda_graph_config_arg,
    "parse_cuda_graph_backend_arg": parse_cuda_graph_backend_arg,
}


# ---- SGLang's own argparse actions (server_args.py <= 0.5.12, arg_groups/argparse_actions.py after) ----
def print_deprecated_warning(message):
    # No handler is configured yet while argparse runs: logging's last resort
    # prints the bare message to stderr, as with the real package.
    name = "sglang.srt.arg_groups.argparse_actions" if at_least("0.5.13") else __name__
    logging.getLogger(name).warning(f"\033[1;33m{message}\033[0m")  # pylint: disable=logging-fstring-interpolation  # as SGLang


class DeprecatedAction(argparse.Action):
    def __init__(self, option_strings, dest, error_message=None, nargs=0, **kwargs):
        self.error_message = error_message
        super().__init__(option_strings, dest, nargs=nargs, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        if self.error_message is not None:
            parser.error(self.error_message)
        print_deprecated_warning(
            f"The command line argument '{option_string}' is deprecated and will be removed in future versions."
        )


class DeprecatedStoreTrueAction(argparse.Action):
    def __init__(self, option_strings, dest, new_flag=None, nargs=0, const=True, default=False, **kwargs):
        self.new_flag = new_flag
        super().__init__(option_strings, dest, nargs=nargs, const=const, default=default, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        replacement = f" Use '{self.new_flag}' instead." if self.new_flag else ""
        print_deprecated_warning(
            f"'{option_string}' is deprecated and will be removed in a future release.{replacement}"
        )
        setattr(namespace, self.dest, True)


class DeprecatedStoreConstAction(argparse.Action):
    def __init__(self, option_strings, dest, new_flag=None, const_value=None, nargs=0, default=None, **kwargs):
        self.new_flag = new_flag
        self.const_value = const_value
        super().__init__(option_strings, dest, nargs=nargs, default=default, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        replacement = f" Use '{self.new_flag}' instead." if self.new_flag else ""
        print_deprecated_warning(
            f"'{option_string}' is deprecated and will be removed in a future release.{replacement}"
        )
        setattr(namespace, self.dest, self.const_value)


class DeprecatedAliasStoreAction(argparse.Action):
    """Old spelling of a renamed valued flag: stores into the new dest and warns."""

    def __init__(self, option_strings, dest, new_flag=None, **kwargs):
        self.new_flag = new_flag
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        replacement = f" Use '{self.new_flag}' instead." if self.new_flag else ""
        print_deprecated_warning(
            f"'{option_string}' is deprecated and will be removed in a future release.{replacement}"
        )
        setattr(namespace, self.dest, values)


class LoRAPathAction(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        lora_paths = []
        if values:
            assert isinstance(values, list), "Expected a list of LoRA paths."
            for lora_path in values:
                lora_path = lora_path.strip()
                if lora_path.startswith("{") and lora_path.endswith("}"):
                    obj = json.loads(lora_path)
                    assert "lora_path" in obj and "lora_name" in obj, (
                        f"{repr(lora_path)} looks like a JSON str, "
                        "but it does not contain 'lora_name' and 'lora_path' keys."
                    )
                    lora_paths.append(obj)
                else:
                    lora_paths.append(lora_path)
        setattr(namespace, self.dest, lora_paths)


_CUSTOM_ACTIONS = {
    "DeprecatedAction": DeprecatedAction,
    "DeprecatedStoreTrueAction": DeprecatedStoreTrueAction,
    "DeprecatedStoreConstAction": DeprecatedStoreConstAction,
    "DeprecatedAliasStoreAction": DeprecatedAliasStoreAction,
    "LoRAPathAction": LoRAPathAction,
}


def _ddtree_spec():
    # Private-build flag (DDTree lives in an open upstream PR), see README.
    return {"flags": [DDTREE_BUDGET_FLAG], "dest": "speculative_ddtree_tree_budget",
            "action": "_StoreAction", "nargs": None, "const": None, "default": None,
            "type": "int", "choices": None, "required": False}


def flag_specs(version=None):
    """The argparse actions of a release (plus the DDTREE ones of a private build)."""
    specs = [dict(spec) for spec in load_profile(version)["flags"]]
    if not ddtree_enabled():
        return specs
    out = []
    for spec in specs:
        if spec["dest"] == "speculative_algorithm" and spec["choices"]:
            spec["choices"] = list(spec["choices"]) + ["DDTREE"]
        out.append(spec)
        if spec["dest"] == "speculative_dflash_block_size":
            out.append(_ddtree_spec())
    if not any(s["dest"] == "speculative_ddtree_tree_budget" for s in out):
        out.append(_ddtree_spec())
    return out


def _field_specs(version=None):
    fields = list(load_profile(version)["fields"])
    if ddtree_enabled():
        fields.append({"name": "speculative_ddtree_tree_budget", "default": None})
    return fields


def add_cli_args(parser, version=None):
    for spec in flag_specs(version):
        flags = list(spec["flags"])
        action = spec["action"]
        kwargs = {"dest": spec["dest"]}
        default = spec["default"]
        kwargs["default"] = argparse.SUPPRESS if default == argparse.SUPPRESS else copy.deepcopy(default)
        if action == "_StoreTrueAction":
            kwargs["action"] = "store_true"
        elif action == "_StoreFalseAction":
            kwargs["action"] = "store_false"
        elif action == "_StoreConstAction":
            kwargs.update(action="store_const", const=spec["const"])
        elif action == "BooleanOptionalAction":
            kwargs["action"] = argparse.BooleanOptionalAction
            # argparse adds the --no- spelling itself
            flags = [f for f in flags if not (f.startswith("--no-") and "--" + f[5:] in flags)]
        else:
            if action in _CUSTOM_ACTIONS:
                kwargs["action"] = _CUSTOM_ACTIONS[action]
                for attr in ("new_flag", "error_message", "const_value"):
                    if attr in spec:
                        kwargs[attr] = spec[attr]
            elif action == "_AppendAction":
                kwargs["action"] = "append"
            if spec.get("type"):
                kwargs["type"] = _TYPES.get(spec["type"], str)
            if spec["nargs"] is not None or action in _CUSTOM_ACTIONS:
                # a custom action's own default nargs is not argparse's: pass what the real parser has
                kwargs["nargs"] = spec["nargs"]
            if spec["nargs"] == "?" and action == "_StoreAction":
                kwargs["const"] = spec["const"]
            if spec["choices"] is not None:
                kwargs["choices"] = spec["choices"]
            if spec["required"]:
                kwargs["required"] = True
        parser.add_argument(*flags, **kwargs)


# ---- resolution -------------------------------------------------------------
def _after(version):
    """True when the selected release is later than ``version``."""
    return version_tuple(selected_version()) > version_tuple(version)


class _Since:
    """A ServerArgs attribute that only exists from a given release on (so hasattr() tells)."""

    def __init__(self, version, func, is_property=False, until=None):
        self.version = version
        self.until = until  # last release that has it
        self.func = func
        self.is_property = is_property

    def __set_name__(self, owner, name):
        self.name = name

    def __get__(self, obj, owner=None):
        if not at_least(self.version) or (self.until and _after(self.until)):
            if obj is None:
                raise AttributeError(f"type object 'ServerArgs' has no attribute '{self.name}'")
            raise AttributeError(f"'ServerArgs' object has no attribute '{self.name}'")
        if self.is_property:
            return self if obj is None else self.func(obj)
        return self.func.__get__(obj, owner)


class _View:
    """What resolution reads (declared values over the fields) and where it writes.

    Up to 0.5.18 the handlers assign the fields; from 0.5.19 they declare into
    a stash and the fields keep the operator's input.
    """

    def __init__(self, server_args, into_fields):
        object.__setattr__(self, "_sa", server_args)
        object.__setattr__(self, "_into_fields", into_fields)

    def __getattr__(self, name):
        stash = object.__getattribute__(self._sa, "__dict__").get("_resolved", {})
        if name in stash:
            return stash[name]
        return getattr(self._sa, name, None)

    def __setattr__(self, name, value):
        if self._into_fields:
            object.__setattr__(self._sa, name, value)
        else:
            self._sa.__dict__.setdefault("_resolved", {})[name] = value


def _draft_attention_backend(cfg):
    backend = cfg.speculative_draft_attention_backend or cfg.attention_backend
    if backend not in ("flashinfer", "fa3", "fa4", "triton"):
        backend = "flashinfer"
    return backend


def _infer_block_size(path):
    """block_size of a DFlash draft model from its config.json (None when unknown)."""
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


def _handle_dflash(cfg):
    device = cfg.device or "cuda"
    if at_least("0.5.21"):
        if not (device.startswith("cuda") or device in ("npu", "xpu")):
            raise ValueError("DFLASH speculative decoding is not supported by "
                             f"CudaSRTPlatform on device {device!r}.")
    elif at_least("0.5.20"):
        if not (device.startswith("cuda") or device in ("npu", "xpu")):
            raise ValueError("DFLASH speculative decoding only supports CUDA, NPU and XPU devices.")
    elif at_least("0.5.17"):
        if not (device.startswith("cuda") or device == "npu"):
            raise ValueError("DFLASH speculative decoding only supports CUDA and NPU devices.")
    elif at_least("0.5.16"):
        if not device.startswith("cuda"):
            raise ValueError("DFLASH speculative decoding only supports CUDA device.")

    attn_dp = _attn_dp_enabled(cfg)
    if attn_dp and at_least("0.5.23"):
        if device != "npu":
            if not device.startswith("cuda"):
                raise ValueError("DFLASH with dp attention requires CUDA or NPU.")
            if not cfg.enable_dp_lm_head:
                raise ValueError("DFLASH with dp attention requires --enable-dp-lm-head.")
            if int(cfg.attn_cp_size or 1) != 1:
                raise ValueError("DFLASH with dp attention does not support context parallel.")
    elif attn_dp and at_least("0.5.20"):
        if device != "npu":
            raise ValueError("Currently DFLASH speculative decoding does not support dp "
                             "attention on non-NPU devices.")
    elif attn_dp:
        raise ValueError("Currently DFLASH speculative decoding does not support dp attention.")

    if int(cfg.pp_size or 1) != 1:
        raise ValueError("Currently DFLASH speculative decoding only supports pp_size == 1.")
    if cfg.speculative_draft_model_path is None:
        raise ValueError(
            "DFLASH speculative decoding requires setting --speculative-draft-model-path."
        )
    for key in ("speculative_num_steps", "speculative_eagle_topk"):
        current = getattr(cfg, key)
        if current is None:
            setattr(cfg, key, 1)
        elif int(current) != 1:
            logger.warning("DFLASH only supports %s == 1; overriding %s=%s to 1.", key, key, current)
            setattr(cfg, key, 1)
    if cfg.speculative_dflash_block_size is not None:
        if int(cfg.speculative_dflash_block_size) <= 0:
            raise ValueError(
                "DFLASH requires --speculative-dflash-block-size to be positive, "
                f"got {cfg.speculative_dflash_block_size}."
            )
        if cfg.speculative_num_draft_tokens is not None and int(
            cfg.speculative_num_draft_tokens
        ) != int(cfg.speculative_dflash_block_size):
            raise ValueError(
                "Both --speculative-num-draft-tokens and --speculative-dflash-block-size are set "
                "but they differ. For DFLASH they must match. "
                f"speculative_num_draft_tokens={cfg.speculative_num_draft_tokens}, "
                f"speculative_dflash_block_size={cfg.speculative_dflash_block_size}."
            )
        cfg.speculative_num_draft_tokens = int(cfg.speculative_dflash_block_size)

    wkey = window_key()
    window = getattr(cfg, wkey)
    if window is not None and not at_least("0.5.13"):
        # 0.5.11/0.5.12 check the window inside the DFLASH branch.
        window = int(window)
        if window <= 0:
            if at_least("0.5.12"):
                raise ValueError(f"--speculative-draft-window-size must be positive, got {window}.")
            raise ValueError(
                "DFLASH requires --speculative-dflash-draft-window-size "
                f"to be positive, got {window}."
            )
        setattr(cfg, wkey, window)

    if cfg.speculative_num_draft_tokens is None:
        inferred = _infer_block_size(cfg.speculative_draft_model_path)
        if inferred is None:
            inferred = 16
            logger.warning(
                "speculative_num_draft_tokens is not set; defaulting to %d for DFLASH.", inferred
            )
        cfg.speculative_num_draft_tokens = inferred

    window = getattr(cfg, wkey)
    if window is not None:
        draft_tokens = int(cfg.speculative_num_draft_tokens)
        if int(window) < draft_tokens:
            prefix = "" if at_least("0.5.12") else "DFLASH "
            flag = window_flag()
            raise ValueError(
                f"{prefix}{flag} must be >= "
                "--speculative-num-draft-tokens (block_size). "
                f"window_size={window}, block_size={draft_tokens}."
            )

    if at_least("0.5.15"):
        cfg.speculative_draft_attention_backend = _draft_attention_backend(cfg)
    if cfg.max_running_requests is None:
        cfg.max_running_requests = 48
        logger.warning(
            "Max running requests is reset to 48 for speculative decoding. You can override "
            "this by explicitly setting --max-running-requests."
        )
    if not at_least("0.5.14"):
        cfg.disable_overlap_schedule = True
        logger.warning(
            "Overlap scheduler is disabled when using DFLASH speculative decoding "
            "(spec v2 is not supported yet)."
        )
    if not at_least("0.5.19") and cfg.enable_mixed_chunk:
        cfg.enable_mixed_chunk = False
        logger.warning(
            "Mixed chunked prefill is disabled because of using dflash speculative decoding."
        )


def _handle_ddtree(cfg):
    if cfg.speculative_draft_model_path is None:
        raise ValueError(
            "DDTREE speculative decoding requires setting --speculative-draft-model-path."
        )
    if cfg.speculative_dflash_block_size is not None and cfg.speculative_num_draft_tokens is None:
        cfg.speculative_num_draft_tokens = int(cfg.speculative_dflash_block_size)
    if cfg.speculative_num_draft_tokens is None:
        cfg.speculative_num_draft_tokens = 16
    if cfg.speculative_ddtree_tree_budget is None:
        cfg.speculative_ddtree_tree_budget = 64
    if int(cfg.speculative_ddtree_tree_budget) <= 0:
        raise ValueError(
            f"DDTREE requires {DDTREE_BUDGET_FLAG} to be positive, "
            f"got {cfg.speculative_ddtree_tree_budget}."
        )
    cfg.speculative_num_steps = cfg.speculative_num_steps or 1
    cfg.speculative_eagle_topk = cfg.speculative_eagle_topk or 1


def _attn_dp_enabled(cfg):
    if at_least("0.5.22"):
        return int(cfg.attn_dp_size or 1) > 1
    return bool(cfg.enable_dp_attention)


def _handle_speculative_decoding(cfg):
    if cfg.speculative_draft_model_path is not None and cfg.speculative_draft_model_revision is None:
        cfg.speculative_draft_model_revision = "main"
    if cfg.speculative_moe_runner_backend is None:
        # the draft's MoE runner follows the target's (0.5.11: never a trtllm one)
        backend = cfg.moe_runner_backend or "auto"
        if not at_least("0.5.12") and backend in ("flashinfer_trtllm", "flashinfer_trtllm_routed"):
            backend = "auto"
        cfg.speculative_moe_runner_backend = backend
    algorithm = cfg.speculative_algorithm
    if at_least("0.5.12"):
        if algorithm is not None:
            algorithm = algorithm.upper()
        if algorithm in ("NEXTN", "EAGLE"):
            algorithm = "EAGLE"
        cfg.speculative_algorithm = algorithm
    elif algorithm == "NEXTN":
        algorithm = cfg.speculative_algorithm = "EAGLE"

    if at_least("0.5.13") and cfg.speculative_draft_window_size is not None:
        # Checked once, whatever the algorithm (arg_groups/speculative_hook.py).
        window = int(cfg.speculative_draft_window_size)
        if window <= 0:
            raise ValueError(f"--speculative-draft-window-size must be positive, got {window}.")
        cfg.speculative_draft_window_size = window
        honored = ("EAGLE", "EAGLE3", "DFLASH") if at_least("0.5.21") else ("EAGLE3", "DFLASH")
        if algorithm not in honored:
            if at_least("0.5.21"):
                logger.warning(
                    "--speculative-draft-window-size has no effect with speculative_algorithm=%s "
                    "(honored by DFLASH, Llama EAGLE-3, and the EAGLE/MTP/NEXTN draft-decode path "
                    "on the Triton/FlashInfer draft backends).", algorithm)
            else:
                logger.warning(
                    "--speculative-draft-window-size has no effect with speculative_algorithm=%s "
                    "(honored by Llama EAGLE-3 and DFLASH only).", algorithm)

    if at_least("0.5.12") and algorithm is not None and algorithm not in known_algorithms():
        # SpeculativeAlgorithm.from_string: the flag takes any string since 0.5.12.
        raise ValueError(f"Unknown speculative algorithm name: {algorithm}")

    if algorithm == "DFLASH":
        _handle_dflash(cfg)
    elif algorithm == "DDTREE":
        _handle_ddtree(cfg)
    elif algorithm in ("EAGLE", "EAGLE3", "STANDALONE"):
        # The real defaults depend on the model architecture (auto_choose_speculative_params);
        # these are DeepseekV3's (K2.6).
        if cfg.speculative_num_steps is None:
            cfg.speculative_num_steps = 3
        if cfg.speculative_eagle_topk is None:
            cfg.speculative_eagle_topk = 1
        if cfg.speculative_num_draft_tokens is None:
            cfg.speculative_num_draft_tokens = int(cfg.speculative_num_steps) + 1
    elif algorithm == "NGRAM":
        if cfg.speculative_num_draft_tokens is None:
            cfg.speculative_num_draft_tokens = 8


def _run_resolution(server_args, into_fields):
    cfg = _View(server_args, into_fields)
    if str(cfg.model_path).lower() in ("none", "dummy"):
        return  # the real handlers skip dummy models too
    if cfg.tokenizer_path is None:
        cfg.tokenizer_path = cfg.model_path
    if cfg.served_model_name is None:
        cfg.served_model_name = cfg.model_path
    cfg.device = (cfg.device or "cuda").split(":")[0]  # the simulator plays a CUDA host
    if cfg.random_seed is None:
        cfg.random_seed = random.randint(0, 1 << 30)
    if at_least("0.5.22") and cfg.enable_dp_attention:
        # _handle_deprecated_dp_attention: --dp-size N --enable-dp-attention -> --attn-dp-size N
        if int(cfg.attn_dp_size or 1) == 1:
            cfg.attn_dp_size = cfg.dp_size
            cfg.dp_size = 1
        cfg.enable_dp_attention = False
    _handle_speculative_decoding(cfg)


# dest -> ServerArgs field, for the releases whose argparse dests keep the long names
_FIELD_RENAMES = {
    "tensor_parallel_size": "tp_size",
    "pipeline_parallel_size": "pp_size",
    "attention_context_parallel_size": "attn_cp_size",
    "moe_data_parallel_size": "moe_dp_size",
    "data_parallel_size": "dp_size",
    "expert_parallel_size": "ep_size",
}


class ServerArgs:
    """The release's ServerArgs fields, in declaration order."""

    def __init__(self, **kwargs):
        fields = _field_specs()
        names = [field["name"] for field in fields]
        unknown = [key for key in kwargs if key not in names]
        if unknown:
            raise TypeError(f"ServerArgs.__init__() got an unexpected keyword argument '{unknown[0]}'")
        if "model_path" not in kwargs:
            raise TypeError("ServerArgs.__init__() missing 1 required positional argument: 'model_path'")
        object.__setattr__(self, "_fields", names)
        for field in fields:
            value = kwargs[field["name"]] if field["name"] in kwargs else copy.deepcopy(field["default"])
            object.__setattr__(self, field["name"], value)
        self.__post_init__()

    def __post_init__(self):
        if at_least("0.5.19"):
            return  # construction leaves the record raw; see resolve_once
        if at_least("0.5.18"):
            self._run_resolution_pipeline()
        else:
            _run_resolution(self, into_fields=True)

    def _run_resolution_pipeline(self):
        _run_resolution(self, into_fields=True)

    _run_resolution_pipeline = _Since("0.5.18", _run_resolution_pipeline, until="0.5.18")  # 0.5.18 only

    def resolve_once(self):
        """Run the resolution once (0.5.19+); a failed record cannot be resolved again."""
        if self.__dict__.get("_resolution_finished"):
            return
        if self.__dict__.get("_resolution_failed"):
            raise RuntimeError(
                "resolution already failed on this ServerArgs; the handlers that "
                "ran left their writes on the record, and a second pass would "
                "read that partial output as fresh input. Build a new record "
                "from the corrected arguments."
            )
        try:
            _run_resolution(self, into_fields=False)
        except BaseException:
            self._resolution_failed = True
            raise
        self._resolution_finished = True

    def resolved_dict(self):
        """Resolved field values (0.5.19+); /server_info and the server_args= line show these."""
        stash = self.__dict__.get("_resolved", {})
        resolved = {name: copy.deepcopy(stash.get(name, getattr(self, name))) for name in self._fields}
        if at_least("0.5.22"):
            resolved["enable_dp_attention"] = int(stash.get("attn_dp_size", self.attn_dp_size) or 1) > 1
        return resolved

    def launch_command(self):
        """What was asked for (0.5.20+): the argv after the --config merge."""
        return self.__dict__.get("_launch_command")

    def check_server_args(self):
        """The launch checks of a multi-node layout (server_args.py up to 0.5.18, then
        arg_groups/validation_hook.py), run on the resolved values before anything starts.
        Not checked, as in SGLang: node_rank < nnodes, a --dist-init-addr given or well formed."""
        nnodes = int(self.effective("nnodes", 1) or 1)
        tp_size = int(self.effective("tp_size", 1) or 1)
        pp_size = int(self.effective("pp_size", 1) or 1)
        dp_size = int(self.effective("dp_size", 1) or 1)
        if self.effective("ep_join_mode") != "scale":
            assert (tp_size * pp_size) % nnodes == 0, "tp_size must be divisible by number of nodes"
        if at_least("0.5.22"):
            assert not (dp_size > 1 and nnodes != 1), (
                "multi-node data-parallel replicas are not supported; use attention DP "
                "(--attn-dp-size) across nodes"
            )
        else:
            assert not (dp_size > 1 and nnodes != 1 and not self.effective("enable_dp_attention")), (
                "multi-node data parallel is not supported unless dp attention!"
            )

    resolve_once = _Since("0.5.19", resolve_once)
    resolved_dict = _Since("0.5.19", resolved_dict)
    launch_command = _Since("0.5.20", launch_command, is_property=True)

    @staticmethod
    def add_cli_args(parser):
        add_cli_args(parser)

    @classmethod
    def from_cli_args(cls, args):
        for old, new in _FIELD_RENAMES.items():
            if hasattr(args, old):
                setattr(args, new, getattr(args, old))
        names = [field["name"] for field in _field_specs()]
        return cls(**{name: getattr(args, name) for name in names if hasattr(args, name)})

    # ---- simulator helpers (not SGLang API) ----------------------------------
    def field_values(self):
        """The fields as the record holds them (asdict order)."""
        return {name: getattr(self, name) for name in self._fields}

    def effective(self, name, default=None):
        """A resolved value: the declared one from 0.5.19, the field before."""
        stash = self.__dict__.get("_resolved", {})
        if name in stash:
            return stash[name]
        return getattr(self, name, default)

    def __repr__(self):
        hidden = {"watermark_key", "watermark_key_b", "watermark_config"} if at_least("0.5.22") else set()
        body = ", ".join(f"{k}={getattr(self, k)!r}" for k in self._fields if k not in hidden)
        return f"ServerArgs({body})"

    def url(self, port=None):
        host = self.host
        if not host or host == "0.0.0.0":
            host = "127.0.0.1"
        elif host == "::":
            host = "::1"
        return f"http://{host}:{port if port is not None else self.port}"


def build_parser(version=None):
    parser = argparse.ArgumentParser(prog="sglang serve")
    add_cli_args(parser, version)
    return parser


def prepare_server_args(argv):
    """Parse argv like ``sglang serve`` does (argparse errors exit 2).

    Up to 0.5.18 this also validates (ServerArgs.__post_init__); from 0.5.19 it
    is argparse only and ``ServerArgs.resolve_once()`` validates at launch.
    """
    parser = build_parser()
    if "--config" in argv:
        from sglang.srt.utils.server_args_config_parser import ConfigArgumentMerger

        config_merger = ConfigArgumentMerger(parser)
        argv = config_merger.merge_config_with_args(argv)
    raw_args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, raw_args.log_level.upper()),
        format="[%(asctime)s] %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
        force=True,
    )
    server_args = ServerArgs.from_cli_args(raw_args)
    if at_least("0.5.20"):
        # What was asked for, after the --config merge (0.5.22+ redact only --watermark-config).
        server_args._launch_command = " ".join(_redact_watermark(argv) if at_least("0.5.22") else argv)
    return server_args


def _redact_watermark(argv):
    out = []
    redact_next = False
    for argument in argv:
        if redact_next:
            out.append("<redacted>")
            redact_next = False
        elif argument == "--watermark-config":
            out.append(argument)
            redact_next = True
        elif argument.startswith("--watermark-config="):
            out.append("--watermark-config=<redacted>")
        else:
            out.append(argument)
    return out
