"""The args lists the conformance tests feed to the real SGLang and to the simulator.

Built at collection time from the project's own builder (plugins/module_utils/_args.py), with
placeholders for the model directories that the session fixture creates (write_models).
"""
import itertools
import json

from ansible_collections.gpufleet.inference.plugins.module_utils import _args

VERSION = "0.5.23"
TARGET, DRAFT = "@TARGET@", "@DRAFT@"
# The draft's own block size (its config.json), what SGLang uses when no block size is given.
DRAFT_BLOCK_SIZE = 16
API_KEY = "conformance-KEY-0123456789"


CONFIG = "/@CONFIG@.yaml"  # sglang_config_file, substituted like the model directories


def api_key_settings():
    """The K2.6 settings with an API key: build_args ends with --config CONFIG."""
    return base(sglang_speculative_algorithm="DFLASH", sglang_speculative_draft_model_path=DRAFT,
                sglang_speculative_num_draft_tokens=16, sglang_speculative_draft_window_size=2048,
                sglang_api_key=API_KEY, sglang_config_file=CONFIG)


def write_models(root):
    """Placeholder model directories (config.json only): what resolution reads of a model; and
    the config file the role would install for the API key (_args.config_file_text)."""
    target, draft = root / "target", root / "draft"
    target.mkdir()
    draft.mkdir()
    (target / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
        "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 4,
        "num_hidden_layers": 2, "vocab_size": 1024, "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16"}))
    (draft / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
        "intermediate_size": 512, "num_attention_heads": 4, "num_key_value_heads": 4,
        "num_hidden_layers": 1, "vocab_size": 1024, "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16",
        "dflash_config": {"block_size": DRAFT_BLOCK_SIZE}}))
    config = root / "sglang.yaml"
    config.write_text(_args.config_file_text(api_key_settings()))
    return {TARGET: str(target), DRAFT: str(draft), CONFIG: str(config)}


def substitute(args, models):
    return [models.get(arg, arg) for arg in args]


def base(**overrides):
    settings = {"sglang_model_path": TARGET, "sglang_served_model_name": "k26", "sglang_tp_size": 8,
                "sglang_host": "127.0.0.1", "sglang_port": 30000}
    settings.update(overrides)
    return settings


def _name(settings):
    keys = (("sglang_speculative_algorithm", ""), ("sglang_speculative_num_draft_tokens", "block"),
            ("sglang_speculative_draft_window_size", "window"), ("sglang_speculative_eagle_topk", "topk"),
            ("sglang_speculative_num_steps", "steps"))
    parts = ["%s%s" % (label, settings[key]) for key, label in keys if settings.get(key) is not None]
    if settings.get("sglang_tp_size") != 8:
        parts.append("tp%s" % settings.get("sglang_tp_size"))
    if settings.get("sglang_extra_args"):
        parts.append("extra")
    if settings.get("sglang_speculative_tree_budget") is not None:
        parts.append("budget%s" % settings["sglang_speculative_tree_budget"])
    return "-".join(parts) or "plain"


# Algorithms that run without a draft model (NGRAM matches n-grams; UNO reuses the target
# model and refuses --speculative-draft-model-path). Every other one gets a draft model.
NO_DRAFT_MODEL = ("NGRAM", "UNO")


def spec_settings(algorithm):
    """Settings combinations for one algorithm of _args.ALGORITHMS (valid for the project)."""
    if algorithm == "none":
        return [base(), base(sglang_tp_size=1)]
    common = {"sglang_speculative_algorithm": algorithm}
    if algorithm not in NO_DRAFT_MODEL:
        common["sglang_speculative_draft_model_path"] = DRAFT
    if algorithm == "DFLASH":
        out = []
        for block, window in itertools.product((None, 8, 16), (None, 16, 2048)):
            if block is not None and window is not None and window < block:
                continue  # the project refuses these: see the DFLASH rules tests
            out.append(base(**common, sglang_speculative_num_draft_tokens=block,
                            sglang_speculative_draft_window_size=window))
        out.append(base(**common, sglang_speculative_num_draft_tokens=16,
                        sglang_speculative_draft_window_size=2048,
                        sglang_speculative_eagle_topk=1, sglang_speculative_num_steps=1))
        return out
    if algorithm == "NGRAM":
        return [base(**common), base(**common, sglang_speculative_num_draft_tokens=8)]
    if algorithm == "UNO":
        # UNO: one GPU (TP=PP=1), a LoRA of its own, FA3 attention, a verify width Q; tree mode
        # (top-k > 1) needs Q >= steps + 1.
        uno = dict(common, sglang_tp_size=1,
                   sglang_extra_args={"--uno-lora-path": DRAFT, "--attention-backend": "fa3"})
        return [base(**uno, sglang_speculative_num_draft_tokens=4),
                base(**uno, sglang_speculative_num_draft_tokens=4, sglang_speculative_num_steps=3,
                     sglang_speculative_eagle_topk=2)]
    if algorithm == "DSPARK":
        # DSpark verifies gamma + 1 tokens, gamma being the draft's block size.
        return [base(**common), base(**common, sglang_speculative_num_draft_tokens=DRAFT_BLOCK_SIZE + 1)]
    if algorithm == "DDTREE":
        return [base(**common, sglang_speculative_num_draft_tokens=16,
                     sglang_speculative_tree_budget=64)]
    # EAGLE, EAGLE3, NEXTN, STANDALONE, FROZEN_KV_MTP and any added later.
    out = [base(**common)]
    for steps, topk, tokens in ((3, 1, 4), (5, 4, 8), (1, 1, 2)):
        out.append(base(**common, sglang_speculative_num_steps=steps,
                        sglang_speculative_eagle_topk=topk,
                        sglang_speculative_num_draft_tokens=tokens))
    return out


EXTRA_ARGS = {"--mem-fraction-static": 0.85, "--context-length": 4096, "--enable-metrics": True,
              "--log-level": "warning", "--max-running-requests": 64, "--disable-radix-cache": False}


def matrix():
    """[(id, algorithm, args)] over every algorithm the project offers (_args.ALGORITHMS)."""
    out = []
    for algorithm in _args.ALGORITHMS:
        for settings in spec_settings(algorithm):
            out.append(("%s:%s" % (algorithm, _name(settings)), algorithm, _args.build_args(settings, VERSION)))
    k26 = base(sglang_speculative_algorithm="DFLASH", sglang_speculative_draft_model_path=DRAFT,
               sglang_speculative_num_draft_tokens=16, sglang_speculative_draft_window_size=2048)
    out.append(("DFLASH:k26-extra", "DFLASH",
                _args.build_args(dict(k26, sglang_extra_args=EXTRA_ARGS), VERSION)))
    out.append(("none:extra", "none", _args.build_args(base(sglang_extra_args=EXTRA_ARGS), VERSION)))
    return out


# ------------------------------------------------------------------ the DFLASH rules

DFLASH_BLOCKS = (None, 8, 16)
DFLASH_WINDOWS = (None, 0, 8, 16, 2048)


def dflash_settings(draft, block, window):
    return base(sglang_speculative_algorithm="DFLASH",
                sglang_speculative_draft_model_path=DRAFT if draft else "",
                sglang_speculative_num_draft_tokens=block,
                sglang_speculative_draft_window_size=window)


def dflash_raw_args(draft, block, window):
    """What the unit would run for these values, built WITHOUT the project's validation."""
    args = ["--model-path", TARGET, "--tp-size", "8", "--speculative-algorithm", "DFLASH"]
    if draft:
        args += ["--speculative-draft-model-path", DRAFT]
    if block is not None:
        args += [_args.BLOCK_SIZE_FLAG, str(block)]
    if window is not None:
        args += [_args.window_flag(VERSION), str(window)]
    return args


def dflash_rules():
    """[(id, draft, block, window)]: every block x window with a draft, and a few without."""
    out = [("draft-block%s-window%s" % (b, w), True, b, w)
           for b, w in itertools.product(DFLASH_BLOCKS, DFLASH_WINDOWS)]
    out += [("nodraft-block%s-window%s" % (b, w), False, b, w) for b, w in ((16, 2048), (None, None))]
    return out


def project_accepts(draft, block, window):
    try:
        _args.validate(dflash_settings(draft, block, window), VERSION)
        return True
    except _args.SettingsError:
        return False


# ------------------------------------------------------------------ preflight: real vs simulator

def warm_args():
    """Args lists whose checks import most of what the others do (see worker.py)."""
    return [dflash_raw_args(True, 16, 2048), dflash_raw_args(True, None, None),
            _args.build_args(base(sglang_speculative_algorithm="DSPARK",
                                  sglang_speculative_draft_model_path=DRAFT), VERSION)]


def preflight_cases():
    """[(id, args)]: a few valid and invalid args lists, run as a module runs the preflight."""
    k26 = dflash_raw_args(True, 16, 2048)
    return [
        ("k26-dflash", k26),
        ("window-below-block", dflash_raw_args(True, 16, 8)),
        ("window-zero", dflash_raw_args(True, 16, 0)),
        ("old-window-flag", k26[:-2] + [_args.WINDOW_FLAG_OLD, "2048"]),
        ("unknown-algorithm", ["--model-path", TARGET, "--speculative-algorithm", "NOPE",
                               "--speculative-draft-model-path", DRAFT]),
        ("missing-model", ["--tp-size", "8"]),
    ]
