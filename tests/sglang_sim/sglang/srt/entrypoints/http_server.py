"""Simulated SGLang HTTP server: process tree, startup logs, HTTP API, shutdown.

Stdlib only.  Structure mirrors the real server: the main process (tokenizer
manager + HTTP) forks one "scheduler" child per local TP rank; the children
"load" the model and log the scheduler lines; the main process opens the port
only once every child reported ready, warms up with /model_info + /generate
and then logs "The server is fired up and ready to roll!".
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import math
import os
import random
import re
import signal
import socket
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from sglang._sim_profile import at_least, selected_version
from sglang.srt.server_args import window_key
from sglang.srt.utils.common import format_line, log, rank_prefix, write_line

# --------------------------------------------------------------------------
# configuration from the environment
# --------------------------------------------------------------------------


def _env_float(name, default):
    try:
        return float(os.environ.get(name, default))
    except ValueError:
        return float(default)


def parse_faults(text=None):
    """SGLANG_SIM_FAULT="a,b=3" -> {"a": None, "b": "3"}."""
    text = os.environ.get("SGLANG_SIM_FAULT", "") if text is None else text
    faults = {}
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        name, _sep, value = item.partition("=")
        faults[name.strip()] = value.strip() or None
    return faults


WORDS = (
    "the of and to in is was for on that with as by at from it an be this which or are "
    "model token server cache draft window block tree batch decode prefill kernel graph "
    "memory rank tensor expert layer weight shard request stream router health latency"
).split()


def count_tokens(text):
    return len(re.findall(r"\w+|[^\w\s]", text)) + 1  # + BOS


# --------------------------------------------------------------------------
# speculative decoding model (deterministic, plausible)
# --------------------------------------------------------------------------


class SpecModel:
    """Expected accept length per verify step from the settings.

    Per-token draft acceptance alpha; a verify of a block of B tokens accepts
    (1 - alpha**B) / (1 - alpha) tokens on average (geometric run + bonus).
    A draft window W narrows what the draft sees: small windows lose quality.
    """

    def __init__(self, server_args, effective_window):
        self.algorithm = server_args.speculative_algorithm
        self.block_size = int(server_args.speculative_num_draft_tokens or 1)
        self.window = effective_window
        self.tree_budget = getattr(server_args, "speculative_ddtree_tree_budget", None)
        self.enabled = self.algorithm not in (None, "NONE")

    def alpha(self):
        alpha = 0.80
        if self.algorithm in ("EAGLE", "EAGLE3", "NEXTN"):
            alpha = 0.72
        elif self.algorithm in ("NGRAM", "STANDALONE"):
            alpha = 0.55
        if self.window is not None:
            alpha -= 0.30 * math.exp(-float(self.window) / 512.0)
        if self.algorithm == "DDTREE" and self.tree_budget:
            alpha = 1.0 - (1.0 - alpha) / (1.0 + math.log2(max(1, int(self.tree_budget))) / 4.0)
        return max(0.05, min(alpha, 0.97))

    def accept_length(self, key=""):
        if not self.enabled:
            return 1.0
        alpha = self.alpha()
        blocks = self.block_size
        length = (1.0 - alpha**blocks) / (1.0 - alpha)
        # small deterministic per-prompt variation (+-4%)
        jitter = (int(hashlib.sha256(key.encode()).hexdigest()[:4], 16) / 65535.0 - 0.5) * 0.08
        return max(1.0, min(float(blocks), length * (1.0 + jitter)))

    def step_seconds(self, token_seconds, context=0):
        """One verify step at a context of ``context`` tokens (before noise and faults)."""
        if not self.enabled:
            return token_seconds
        # a bigger block/tree makes each verify a bit more expensive
        extra = self.block_size / 64.0
        if self.algorithm == "DDTREE" and self.tree_budget:
            extra += int(self.tree_budget) / 512.0
        # the draft attends to the whole context, or to the window only (why windows exist)
        attended = context if self.window is None else min(context, int(self.window))
        extra += DRAFT_ATTENTION_COST * attended / 8192.0
        return token_seconds * (1.0 + extra)


DRAFT_ATTENTION_COST = 0.2  # extra verify time per 8192 tokens the draft attends to


def _sleep_until(deadline):
    delay = deadline - time.monotonic()
    if delay > 0:
        time.sleep(delay)


class Timing:
    """How long this process takes for a prefill and a decode step: the settings' cost (SpecModel), made
    noisy like a real server's run-to-run variation, and slowed by the slow_decode fault.

    Noise (off with SGLANG_SIM_NOISE=0): a per-process speed factor drawn once at start
    (lognormal, SGLANG_SIM_DRIFT, default 0.015: two processes of the same settings differ by about
    2 %, as two real servers do), a per-request factor (0.03: where a request sits in the batch)
    and a per-step / per-prefill jitter (0.10: kernel and scheduling variation). SGLANG_SIM_NOISE_SEED
    makes the draws repeatable.
    """

    REQUEST_SIGMA = 0.03
    STEP_SIGMA = 0.10
    BATCH_TOKENS = 256.0  # a running request adds 1/256 to every step (batched decode)

    def __init__(self, token_seconds, faults):
        self.token_seconds = token_seconds
        self.noise = os.environ.get("SGLANG_SIM_NOISE", "1") != "0"
        seed = os.environ.get("SGLANG_SIM_NOISE_SEED")
        self.rng = random.Random(seed) if seed else random.Random()
        self.process_factor = self._lognormal(_env_float("SGLANG_SIM_DRIFT", 0.015))
        self.slow = float(faults.get("slow_decode") or 2.0) if "slow_decode" in faults else 1.0
        if not self.slow > 0:
            raise ValueError("SGLANG_SIM_FAULT slow_decode=F needs F > 0, got %r" % faults.get("slow_decode"))

    def _lognormal(self, sigma):
        # normalvariate, not gauss: request threads draw concurrently
        return math.exp(self.rng.normalvariate(0.0, sigma)) if self.noise and sigma > 0 else 1.0

    def request_factor(self):
        return self._lognormal(self.REQUEST_SIGMA)

    def prefill_seconds(self, new_tokens, request_factor):
        """Time to the first token: one step plus the uncached prompt (256 tokens cost one more step)."""
        return (self.token_seconds * (1.0 + new_tokens / 256.0) * self.process_factor * request_factor
                * self._lognormal(self.STEP_SIGMA))

    def decode(self, accept_length):
        """(accept length, step time factor) under slow_decode=F: decode throughput / F, split between a
        lower accept length (/ sqrt(F), at least 1) and a slower step, so verification is untouched."""
        if self.slow == 1.0:
            return accept_length, 1.0
        slower = max(1.0, accept_length / math.sqrt(self.slow))
        return slower, self.slow * slower / accept_length

    def step_seconds(self, base, request_factor, running):
        return (base * self.process_factor * request_factor * (1.0 + running / self.BATCH_TOKENS)
                * self._lognormal(self.STEP_SIGMA))


# --------------------------------------------------------------------------
# scheduler child processes
# --------------------------------------------------------------------------

PR_SET_PDEATHSIG = 1


def _die_with_parent():
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except Exception:
        pass


class Resolved:
    """The values the running server uses.

    Up to 0.5.18 ServerArgs.__post_init__ resolved the fields themselves; from
    0.5.19 the fields keep the raw input and resolved_dict() has the result.
    Fields a release does not have read as None.
    """

    def __init__(self, server_args):
        values = server_args.resolved_dict() if hasattr(server_args, "resolved_dict") \
            else server_args.field_values()
        self.__dict__.update(values)

    def __getattr__(self, name):
        return None


class Rank:
    """One scheduler process: its ranks in every parallel dimension."""

    def __init__(self, dp_rank, pp_rank, tp_rank, attn_cp_rank, moe_dp_rank, ep_rank):
        self.dp_rank = dp_rank
        self.pp_rank = pp_rank
        self.tp_rank = tp_rank
        self.attn_cp_rank = attn_cp_rank
        self.moe_dp_rank = moe_dp_rank
        self.ep_rank = ep_rank

    @property
    def logs_draft_config(self):
        # dflash_worker: `if tp_rank == 0` -- once per DP replica (attention DP shares one TP group)
        return self.tp_rank == 0 and self.pp_rank == 0


def node_rank_ranges(tp, pp, nnodes, node_rank):
    """engine.py _calculate_rank_ranges: the PP and TP ranks a node runs."""
    pp_per_node = max(pp // nnodes, 1)
    nodes_per_pp_rank = max(nnodes // pp, 1)
    first_pp = pp_per_node * (node_rank // nodes_per_pp_rank)
    tp_per_node = tp // nodes_per_pp_rank
    first_tp = tp_per_node * (node_rank % nodes_per_pp_rank)
    return range(first_pp, first_pp + pp_per_node), range(first_tp, first_tp + tp_per_node)


class Layout:
    """Ranks hosted by this node and their log prefixes (engine.py / data_parallel_controller.py)."""

    def __init__(self, r):
        self.tp = max(1, int(r.tp_size or 1))
        self.pp = max(1, int(r.pp_size or 1))
        self.ep = max(1, int(r.ep_size or 1))
        self.attn_cp = max(1, int(r.attn_cp_size or 1))
        self.moe_dp = max(1, int(r.moe_dp_size or 1))
        dp = max(1, int(r.dp_size or 1))
        if r.attn_dp_size is not None:  # 0.5.22+: attention DP has its own size
            self.attn_dp = max(1, int(r.attn_dp_size or 1))
            replicas = dp
            self.replicas = replicas
        else:
            self.attn_dp = dp if r.enable_dp_attention else 1
            replicas = 1 if r.enable_dp_attention else dp
        self.replicas = replicas
        self.nnodes = max(1, int(r.nnodes or 1))
        self.node_rank = int(r.node_rank or 0)
        attn_tp = max(1, self.tp // self.attn_dp // self.attn_cp)
        moe_group = max(1, self.tp // self.moe_dp)
        ranks = []
        pp_ranks, tp_ranks = node_rank_ranges(self.tp, self.pp, self.nnodes, self.node_rank)
        self.ranks_per_node = replicas * len(pp_ranks) * len(tp_ranks)
        for replica in range(replicas):
            for pp_rank, tp_rank in ((pp, tp) for pp in pp_ranks for tp in tp_ranks):
                if self.attn_dp > 1:
                    dp_rank = tp_rank // (attn_tp * self.attn_cp)
                elif replicas > 1:
                    dp_rank = replica
                else:
                    dp_rank = None
                ranks.append(Rank(
                    dp_rank, pp_rank, tp_rank,
                    attn_cp_rank=(tp_rank // attn_tp) % self.attn_cp,
                    moe_dp_rank=tp_rank // moe_group,
                    ep_rank=tp_rank % moe_group // max(1, moe_group // self.ep),
                ))
        self.ranks = ranks[:16]

    def prefix(self, rank):
        return rank_prefix(dp_rank=rank.dp_rank, pp_size=self.pp, pp_rank=rank.pp_rank,
                           attn_cp_size=self.attn_cp, attn_cp_rank=rank.attn_cp_rank,
                           moe_dp_size=self.moe_dp, moe_dp_rank=rank.moe_dp_rank,
                           tp_size=self.tp, tp_rank=rank.tp_rank, ep_size=self.ep, ep_rank=rank.ep_rank)

    @property
    def rank0(self):
        return self.ranks[0]

    @property
    def rank0_prefix(self):
        return self.prefix(self.rank0)


def draft_attention_backend(r):
    backend = r.speculative_draft_attention_backend or r.attention_backend
    if backend not in ("flashinfer", "fa3", "fa4", "triton"):
        backend = "flashinfer"
    return backend


def max_total_num_tokens(sa):
    if getattr(sa, "max_total_tokens", None):
        return int(sa.max_total_tokens)
    fraction = sa.mem_fraction_static or 0.88
    return int(400000 * fraction) // 16 * 16


def config_line(r, window):
    return ("Initialized DFLASH draft runner. attention_backend=%s, model=%s, block_size=%s, "
            "draft_window_size=%s, compact_cache=%s"
            % (draft_attention_backend(r), "DFlashDraftModel", int(r.speculative_num_draft_tokens),
               window, window is not None))


def ready_line():
    text = "DFLASH draft runner ready. mask_token=%s, mask_token_id=%s, mask_token_id_override=%s" % (
        "<|MASK|>", 163838, None)
    if at_least("0.5.18"):
        text += ", noise_embed_scale=%s" % 1.0
    return text


def init_lines(elapsed):
    """The scheduler's distributed-init lines (bootstrap.py / model_runner.py per release)."""
    if at_least("0.5.21"):
        return "Init parallel begin.", f"Init parallel ends. elapsed={elapsed:.2f} s"
    return ("Init torch distributed begin.",
            f"Init torch distributed ends. elapsed={elapsed:.2f} s, mem usage=0.31 GB")


def scheduler_failed(exc, prefix, parent):
    """run_scheduler_process's last words: the traceback, SIGQUIT to the parent.  Never returns."""
    kind = type(exc)
    name = kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"
    log(
        "Scheduler hit an exception: Traceback (most recent call last):\n"
        '  File "/usr/lib/python3/dist-packages/sglang/srt/managers/scheduler.py", line 3930, in run_scheduler_process\n'
        "    scheduler.event_loop_overlap()\n"
        f"{name}: {exc}\n",
        prefix,
    )
    try:
        os.kill(parent, signal.SIGQUIT)
    except OSError:
        pass
    os._exit(1)


def scheduler_main(sa, layout, rank, ready_fd, faults, load_seconds, start, group=None):
    """Body of one scheduler child (``sa`` is the Resolved view).  Never returns.

    ``group`` (multi-node): the scheduler joins the other nodes' ranks at init, reports its
    load, and from then on fails when the group breaks.
    """
    _die_with_parent()
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    prefix = layout.prefix(rank)
    is_rank0 = rank is layout.rank0  # this node's first scheduler: where the faults strike
    logs_rank0_lines = is_rank0 and layout.node_rank == 0  # global TP rank 0's own lines
    shards = max(1, int(_env_float("SGLANG_SIM_NUM_SHARDS", 16)))
    spec = sa.speculative_algorithm
    parent = os.getppid()

    def at(fraction):
        delay = start + load_seconds * fraction - time.monotonic()
        if delay > 0:
            time.sleep(delay)

    def say(message):
        log(message, prefix)

    link = None
    try:
        avail = 78.50
        init_tic = time.monotonic()
        say(init_lines(0)[0])
        if group is not None:
            link = group.join(rank, fail=lambda exc: scheduler_failed(exc, prefix, parent))
            start += time.monotonic() - init_tic  # loading starts once the group has formed
        at(0.03)
        say(init_lines(time.monotonic() - init_tic)[1])
        say(f"Load weight begin. avail mem={avail:.2f} GB")
        if "crash_during_load" in faults and is_rank0:
            at(0.30)
            raise RuntimeError(
                "CUDA error: an illegal memory access was encountered (simulated crash_during_load)"
            )
        tic = time.monotonic()
        for shard in range(1, shards + 1):
            at(0.05 + 0.60 * shard / shards)
            if logs_rank0_lines:
                elapsed = time.monotonic() - tic
                rate = shard / elapsed if elapsed > 0 else 0.0
                remaining = (shards - shard) / rate if rate > 0 else 0.0
                write_line(
                    "Loading safetensors checkpoint shards: %3.0f%% Completed | %d/%d [%s<%s, %.2fit/s]"
                    % (100.0 * shard / shards, shard, shards, _mmss(elapsed), _mmss(remaining), rate)
                )
        used = 68.12 / max(1, layout.tp)
        say(
            f"Load weight end. elapsed={time.monotonic() - tic:.2f} s, type=DeepseekV3ForCausalLM, "
            f"avail mem={avail - used:.2f} GB, mem usage={used:.2f} GB."
        )
        tokens = max_total_num_tokens(sa)
        at(0.72)
        say(f"KV Cache is allocated. #tokens: {tokens}, KV size: {tokens * 70 / 1e6:.2f} GB")
        say(f"Memory pool end. avail mem={avail - used - 4.2:.2f} GB")
        graph_tic = time.monotonic()
        say(
            "Capture cuda graph begin. This can take up to several minutes. "
            f"avail mem={avail - used - 4.2:.2f} GB"
        )
        if logs_rank0_lines:
            say("Capture cuda graph bs [1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64]")
        at(0.88)
        say(
            f"Capture cuda graph end. Time elapsed: {time.monotonic() - graph_tic:.2f} s. "
            f"mem usage=1.32 GB. avail mem={avail - used - 5.52:.2f} GB."
        )
        flood = int(faults.get("log_flood") or 0) if "log_flood" in faults else 0
        if flood and is_rank0:
            for i in range(flood):
                say(
                    "Using default W8A8 Block FP8 kernel config. Performance might be sub-optimal! "
                    f"Config file not found at fused_moe_triton/configs/E=384,N=256,device_name=NVIDIA_H200.json ({i + 1}/{flood})"
                )
        if spec in ("DFLASH", "DDTREE"):
            at(0.92)
            say(f"Load weight begin. avail mem={avail - used - 5.52:.2f} GB")
            say(
                f"Load weight end. elapsed={load_seconds * 0.03:.2f} s, type=DFlashDraftModel, "
                f"avail mem={avail - used - 7.1:.2f} GB, mem usage=1.58 GB."
            )
            if rank.logs_draft_config:
                block = int(sa.speculative_num_draft_tokens)
                if spec == "DFLASH" and "no_config_line" not in faults:
                    say(config_line(sa, configured_window(sa, faults)))
                    say(ready_line())
                if spec == "DFLASH" and "reinit_draft" in faults:
                    at(0.95)  # a re-initialised draft worker, before the port opens
                    say(config_line(sa, parse_window(faults["reinit_draft"])))
                    say(ready_line())
                elif spec == "DDTREE" and "no_config_line" not in faults:
                    budget = int(sa.speculative_ddtree_tree_budget)
                    say(
                        "Initialized DDTree worker. block_size=%s, tree_budget=%s, max_tree_nodes=%s"
                        % (block, budget, budget + 1)
                    )
        at(0.97)
        if logs_rank0_lines:
            say(
                f"max_total_num_tokens={tokens}, chunked_prefill_size={sa.chunked_prefill_size or 8192}, "
                f"max_prefill_tokens={sa.max_prefill_tokens}, "
                f"max_running_requests={sa.max_running_requests or 256}, "
                f"context_len={sa.context_length or 262144}, available_gpu_mem={avail - used - 7.1:.2f} GB"
            )
        at(1.0)
        if "hang_during_load" in faults:
            while True:
                time.sleep(3600)
        if link is not None:
            link.wait_loaded()  # the KV-cache size is agreed across every rank of the group
        os.write(ready_fd, b"r")
        os.close(ready_fd)
        crash_after = faults.get("crash_after_ready") if "crash_after_ready" in faults else None
        if crash_after is not None and is_rank0:
            time.sleep(float(crash_after or 0))
            raise RuntimeError(
                "CUDA error: unspecified launch failure (simulated crash_after_ready)"
            )
        while True:
            time.sleep(3600)
    except Exception as exc:  # the real scheduler's last words
        scheduler_failed(exc, prefix, parent)


def _mmss(seconds):
    seconds = int(seconds)
    return "%02d:%02d" % divmod(seconds, 60)


def parse_window(text):
    """A fault's window value: an int, or None for 'none' / empty."""
    text = (text or "").strip()
    return None if text.lower() in ("", "none") else int(text)


def configured_window(sa, faults):
    """Window the DFLASH worker is built with (None under the ignore_window fault)."""
    if "ignore_window" in faults:
        return None
    value = getattr(sa, window_key(), None)
    return int(value) if value is not None else None


def runtime_window(sa, faults):
    """Window in effect once loading ends: a reinit_draft fault's second worker wins."""
    if "reinit_draft" in faults:
        return parse_window(faults["reinit_draft"])
    return configured_window(sa, faults)


# --------------------------------------------------------------------------
# engine: generation, stats, state
# --------------------------------------------------------------------------


class Engine:
    def __init__(self, sa, server_args, faults, layout):
        self.sa = sa  # Resolved view: what the server runs with
        self.server_args = server_args  # the ServerArgs record (for /server_info and the log)
        self.faults = faults
        self.layout = layout
        self.version = selected_version()
        self.status = "Starting"
        self.gracefully_exit = False
        self.lock = threading.Lock()
        self.in_flight = {}
        self.seen_prompts = set()
        self.token_seconds = _env_float("SGLANG_SIM_TOKEN_SECONDS", 0.002)
        self.load_seconds = max(0.0, _env_float("SGLANG_SIM_LOAD_SECONDS", 3.0))
        window = runtime_window(sa, faults) if sa.speculative_algorithm == "DFLASH" else None
        self.spec = SpecModel(sa, window)
        self.timing = Timing(self.token_seconds, faults)
        self.generation_tokens_total = 0
        self.prompt_tokens_total = 0
        self.requests_total = 0
        self.spec_accepted_total = 0
        self.spec_verify_total = 0
        # decode-log accounting (every decode_log_interval verify steps)
        self.decode_steps = 0
        self.interval_accepted = 0
        self.interval_verify = 0
        self.interval_tic = time.monotonic()
        self.interval_tokens = 0
        self.decode_log_interval = int(getattr(sa, "decode_log_interval", 40) or 40)
        self.max_total_num_tokens = max_total_num_tokens(sa)
        self.worker_id = os.environ.get("SGLANG_SIM_WORKER_ID") or f"{sa.host}:{sa.port}"
        self.ready_event = threading.Event()
        self.hang_event = threading.Event()
        self.group = None  # a multi-node head's group (sglang._sim_multinode)

    @property
    def served_model_name(self):
        return self.sa.served_model_name or self.sa.model_path

    # ---- generation -------------------------------------------------------
    def generate_one(self, prompt_key, prompt_tokens, sampling, rid, stream_cb=None):
        """Generate max_new_tokens: a prefill gives the first token, then verify steps of accept-length
        tokens each. ``stream_cb(words, ids, produced, prompt_tokens, cached)`` is called after every step
        with the output so far; when it returns False (the client went away) generation stops."""
        max_new = sampling.get("max_new_tokens", 128)
        if max_new is None:
            max_new = 128
        temperature = float(sampling.get("temperature", 1.0) if sampling.get("temperature") is not None else 1.0)
        max_new = int(max_new)
        tic = time.time()
        with self.lock:
            self.in_flight[rid] = True
            cached = prompt_tokens - 1 if prompt_key in self.seen_prompts else 0
            self.seen_prompts.add(prompt_key)
        verify_ct = 0
        try:
            if temperature == 0:
                rng = random.Random(hashlib.sha256(prompt_key.encode()).hexdigest())
            else:
                rng = random.Random(rid)
            ids = [rng.randrange(100, 160000) for _i in range(max_new)]
            words = [WORDS[i % len(WORDS)] for i in ids]
            accept, step_factor = self.timing.decode(self.spec.accept_length(prompt_key))
            request_factor = self.timing.request_factor()
            produced = 0
            if max_new:
                # Steps are paced against deadlines: the model's time is the GPU's, and this process's
                # own work between steps (JSON, sockets, a busy host CPU) happens inside it, not after.
                deadline = time.monotonic() + self.timing.prefill_seconds(prompt_tokens - cached, request_factor)
                _sleep_until(deadline)
                produced = 1
                alive = stream_cb is None or stream_cb(words[:1], ids[:1], 1, prompt_tokens, cached) is not False
                remaining = max_new - 1
                steps = int(math.ceil(remaining / accept)) if alive and remaining else 0
                for n in range(steps):
                    base = self.spec.step_seconds(self.token_seconds, prompt_tokens + produced) * step_factor
                    deadline += self.timing.step_seconds(base, request_factor, len(self.in_flight))
                    _sleep_until(deadline)
                    previous = produced
                    produced = 1 + min(remaining, int(round((n + 1) * remaining / steps)))
                    verify_ct += 1
                    self._count_step(produced - previous)
                    if stream_cb is not None and stream_cb(words[:produced], ids[:produced], produced,
                                                           prompt_tokens, cached) is False:
                        break
        finally:
            with self.lock:
                self.in_flight.pop(rid, None)
        text = " " + " ".join(words) if words else ""
        meta = {
            "id": rid,
            "finish_reason": {"type": "length", "length": max_new},
            "prompt_tokens": prompt_tokens,
            "weight_version": "default",
            "completion_tokens": max_new,
            "cached_tokens": cached,
            "e2e_latency": round(time.time() - tic, 6),
        }
        if self.spec.enabled and verify_ct > 0:
            # tokenizer_manager: completion_tokens / verify steps (the prefill's token included)
            length = max_new / verify_ct
            meta["spec_verify_ct"] = verify_ct
            meta["spec_accept_length"] = round(length, 4)
            drafts = max(1, int(self.sa.speculative_num_draft_tokens or 1) - 1)
            meta["spec_accept_rate"] = round(max(0.0, (length - 1.0) / drafts), 4)
            meta["spec_accept_token_num"] = max(0, max_new - verify_ct)
            meta["spec_draft_token_num"] = verify_ct * drafts
        meta["sim_worker"] = self.worker_id
        with self.lock:
            self.generation_tokens_total += max_new
            self.prompt_tokens_total += prompt_tokens
            self.requests_total += 1
            if self.spec.enabled:
                self.spec_accepted_total += max_new
                self.spec_verify_total += verify_ct
        return {"text": text, "output_ids": ids, "meta_info": meta}

    def _count_step(self, tokens):
        line = None
        with self.lock:
            self.decode_steps += 1
            self.interval_verify += 1
            self.interval_accepted += tokens
            self.interval_tokens += tokens
            if self.decode_steps % self.decode_log_interval == 0:
                gap = max(1e-6, time.monotonic() - self.interval_tic)
                running = len(self.in_flight)
                used = min(self.max_total_num_tokens, running * 600)
                msg = (f"Decode batch, #running-req: {running}, #token: {used}, "
                       f"token usage: {used / self.max_total_num_tokens:.2f}, ")
                if self.spec.enabled:
                    acc_len = self.interval_accepted / max(1, self.interval_verify)
                    drafts = max(1, int(self.sa.speculative_num_draft_tokens or 1) - 1)
                    rate = max(0.0, (self.interval_accepted - self.interval_verify) / (self.interval_verify * drafts))
                    msg += f"accept len: {acc_len:.2f}, accept rate: {rate:.2f}, "
                msg += (f"cuda graph: True, gen throughput (token/s): {self.interval_tokens / gap:.2f}, "
                        f"#queue-req: 0")
                line = msg
                self.interval_accepted = self.interval_verify = self.interval_tokens = 0
                self.interval_tic = time.monotonic()
        if line:
            log(line, self.layout.rank0_prefix)

    def avg_spec_accept_length(self):
        if not self.spec.enabled or not self.spec_verify_total:
            return 0.0 if not self.spec.enabled else round(self.spec.accept_length(""), 4)
        return self.spec_accepted_total / self.spec_verify_total

    def startup_time(self):
        return {"load_weight": round(self.load_seconds * 0.63, 3),
                "kv_cache_allocation": round(self.load_seconds * 0.07, 3),
                "scheduler_e2e": round(self.load_seconds, 3),
                "cuda_graph": {"prefill": 0.0, "decode": round(self.load_seconds * 0.16, 3),
                               "target_verify": 0.0, "draft_prefill": 0.0, "draft_decode": 0.0,
                               "draft_extend": 0.0}}

    def server_info(self):
        """/server_info as the release builds it (http_server.py server_info())."""
        server_args = self.server_args
        if at_least("0.5.19"):
            fields = server_args.resolved_dict()  # resolved values
        else:
            fields = server_args.field_values()  # dataclasses.asdict, resolved by __post_init__
        info = {}
        for key, value in fields.items():
            try:
                json.dumps(value)
            except TypeError:
                value = repr(value)
            info[key] = value
        if at_least("0.5.20"):
            info["launch_command"] = server_args.launch_command
        scheduler_info = {"status": "ready", "max_total_num_tokens": self.max_total_num_tokens,
                          "max_req_input_len": self.max_total_num_tokens - 2}
        if at_least("0.5.17"):
            scheduler_info["startup_time"] = self.startup_time()
        if at_least("0.5.23"):
            scheduler_info["hicache_object_layout"] = {
                "enabled": False, "backend": None, "page_size": self.sa.page_size or 1,
                "hicache_object_layout": {"pools": []}, "reason": "Hierarchical cache is disabled"}
        info.update(scheduler_info)
        if at_least("0.5.22"):
            info["kv_events"] = None  # build_server_info() adds it before the HTTP-only keys
        if at_least("0.5.17"):
            info["startup_time"] = self.startup_time()
        info["internal_states"] = [
            {
                "speculative_algorithm": self.sa.speculative_algorithm,
                "speculative_num_draft_tokens": self.sa.speculative_num_draft_tokens,
                "dp_rank": dp,
                "avg_spec_accept_length": self.avg_spec_accept_length(),
                "last_gen_throughput": 0.0,
                "memory_usage": {"weight": 68.12 / max(1, self.layout.tp), "kvcache": 27.4,
                                 "token_capacity": self.max_total_num_tokens, "graph": 1.32},
            }
            for dp in range(self.layout.replicas * self.layout.attn_dp)
        ]
        info["version"] = self.version
        if at_least("0.5.21"):
            info["frontend"] = "python"
        if at_least("0.5.14") and not at_least("0.5.22"):
            info["kv_events"] = None
        return info

    def model_info(self):
        return {
            "model_path": self.sa.model_path,
            "tokenizer_path": self.sa.tokenizer_path or self.sa.model_path,
            "is_generation": True,
            "preferred_sampling_params": self.sa.preferred_sampling_params,
            "weight_version": "default",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": "kimi_k2",
            "architectures": ["DeepseekV3ForCausalLM"],
        }

    def metrics(self):
        name = self.served_model_name
        labels = f'model_name="{name}",engine_type="unified",tp_rank="0",pp_rank="0"'
        acc = self.avg_spec_accept_length() if self.spec.enabled else 0.0
        drafts = max(1, int(self.sa.speculative_num_draft_tokens or 1) - 1)
        rate = max(0.0, (acc - 1.0) / drafts) if self.spec.enabled else 0.0
        lines = [
            "# HELP sglang:spec_accept_length The average acceptance length of speculative decoding.",
            "# TYPE sglang:spec_accept_length gauge",
            f"sglang:spec_accept_length{{{labels}}} {acc}",
            "# HELP sglang:spec_accept_rate The average acceptance rate of speculative decoding.",
            "# TYPE sglang:spec_accept_rate gauge",
            f"sglang:spec_accept_rate{{{labels}}} {rate}",
            "# HELP sglang:num_running_reqs The number of running requests.",
            "# TYPE sglang:num_running_reqs gauge",
            f"sglang:num_running_reqs{{{labels}}} {len(self.in_flight)}",
            "# HELP sglang:generation_tokens_total Number of generation tokens processed.",
            "# TYPE sglang:generation_tokens_total counter",
            f"sglang:generation_tokens_total{{{labels}}} {float(self.generation_tokens_total)}",
            "# HELP sglang:prompt_tokens_total Number of prefill tokens processed.",
            "# TYPE sglang:prompt_tokens_total counter",
            f"sglang:prompt_tokens_total{{{labels}}} {float(self.prompt_tokens_total)}",
            "# HELP sglang:num_requests_total Number of requests processed.",
            "# TYPE sglang:num_requests_total counter",
            f"sglang:num_requests_total{{{labels}}} {float(self.requests_total)}",
        ]
        return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------
# HTTP
# --------------------------------------------------------------------------


class BadRequest(Exception):
    pass


def _compact_json(obj):
    """As the real server's orjson: no spaces, UTF-8."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _access_log(client, method, path, status):
    # SGLang's access format (set_uvicorn_logging_configs): '[ts] INFO:     host:port - "REQUEST" STATUS'
    reason = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found",
              405: "Method Not Allowed", 503: "Service Unavailable"}.get(status, "")
    host = f"[{client[0]}]" if ":" in client[0] else client[0]
    write_line(format_line(f'INFO:     {host}:{client[1]} - "{method} {path} HTTP/1.1" {status} {reason}'), fd=1)


def _truncated(data, max_length):
    """sglang/srt/utils/request_logger.py _dataclass_to_string_truncated: strings through repr, so a
    request's text never starts a log line of its own."""
    if isinstance(data, str):
        if len(data) > max_length:
            half = max_length // 2
            return f"{data[:half]!r} ... {data[-half:]!r}"
        return repr(data)
    if isinstance(data, (list, tuple)):
        if len(data) > max_length:
            half = max_length // 2
            return str(data[:half]) + " ... " + str(data[-half:])
        return str(data)
    if isinstance(data, dict):
        return "{" + ", ".join(f"'{k}': {_truncated(v, max_length)}" for k, v in data.items()) + "}"
    return str(data)


# GenerateReqInput's first fields, in the dataclass's order (sglang/srt/managers/io_struct.py).
_REQUEST_FIELDS = ("text", "input_ids", "input_embeds", "image_data", "video_data", "audio_data",
                   "sampling_params", "return_logprob", "logprob_start_len", "top_logprobs_num", "stream",
                   "log_metrics", "rid")
_SKIPPED_AT_LEVEL = {0: {"text", "input_ids", "input_embeds", "image_data", "audio_data", "video_data",
                         "sampling_params"},
                     1: {"text", "input_ids", "input_embeds", "image_data", "audio_data", "video_data"}}


def log_request(sa, event, request, out=None):
    """--log-requests (RequestLogger.log_received_request / log_finished_request): 'Receive: obj=...' and
    'Finish: obj=..., out=...' on stdout through a logger of its own - no prefix in 0.5.11, '[ts] ' from
    0.5.12 - or one JSON object per line with --log-requests-format json."""
    if not sa.log_requests:
        return
    level = 2 if sa.log_requests_level is None else int(sa.log_requests_level)
    skip = _SKIPPED_AT_LEVEL.get(level, set())
    max_length = 2048 if level == 2 else 1 << 30
    fields = dict((name, request.get(name)) for name in _REQUEST_FIELDS if name not in skip)
    if sa.log_requests_format == "json":
        data = {"timestamp": time.strftime("%Y-%m-%dT%H:%M:%S"), "event": "request.received" if out is None
                else "request.finished", "rid": request.get("rid"), "obj": fields}
        if out is not None:
            data["out"] = dict((k, v) for k, v in out.items() if level >= 2 or k not in ("text", "output_ids"))
        message = json.dumps(data, ensure_ascii=False)
    else:
        obj = "GenerateReqInput(" + ", ".join(f"{k}={_truncated(v, max_length)}" for k, v in fields.items()) + ")"
        message = f"{event}: obj={obj}"
        if out is not None:
            shown = dict((k, v) for k, v in out.items() if level >= 2 or k not in ("text", "output_ids"))
            message += f", out={_truncated(shown, max_length)}"
    write_line(format_line(message) if at_least("0.5.12") else message, fd=1)


def make_handler(engine):
    sa = engine.sa
    # utils/auth.py decide_request_auth: prefixes open without the key (+ /ready from 0.5.20)
    open_paths = ("/health", "/ready", "/metrics") if at_least("0.5.20") else ("/health", "/metrics")

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "uvicorn"
        sys_version = ""

        def log_message(self, *args):  # access log is written by _send
            pass

        # ---- helpers --------------------------------------------------
        def _send(self, status, body=b"", content_type="application/json", extra=None):
            if isinstance(body, (dict, list)):
                body = json.dumps(body).encode()
            elif isinstance(body, str):
                body = body.encode()
            self.send_response(status)
            if body or status != 200 or content_type != "application/json":
                self.send_header("content-type", content_type)
            self.send_header("content-length", str(len(body)))
            self.send_header("x-sglang-sim-worker", engine.worker_id)
            for key, value in (extra or {}).items():
                self.send_header(key, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
            if sa.log_requests or os.environ.get("SGLANG_SIM_ACCESS_LOG", "1") != "0":
                _access_log(self.client_address, self.command, self.path, status)

        def _json_body(self):
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length) if length else b""
            if not raw:
                return {}
            try:
                return json.loads(raw)
            except ValueError as exc:
                raise BadRequest(f"Invalid JSON body: {exc}")

        def _authorized(self, path):
            if not sa.api_key or self.command == "OPTIONS" or path.startswith(open_paths):
                return True
            parts = (self.headers.get("authorization") or "").split(" ", 1)
            return len(parts) == 2 and parts[0].lower() == "bearer" and parts[1] == sa.api_key

        def _route(self, method):
            path = self.path.split("?", 1)[0]
            if not self._authorized(path):
                return self._send(401, {"error": "Unauthorized"})
            routes = ROUTES.get(path)
            if routes is None and path.startswith("/v1/models/"):
                routes = {"GET": Handler.model_by_id}
            if routes is None:
                return self._send(404, {"detail": "Not Found"})
            handler = routes.get(method) or (routes.get("GET") if method == "HEAD" else None)
            if handler is None:
                return self._send(405, {"detail": "Method Not Allowed"})
            try:
                return handler(self)
            except BadRequest as exc:
                return self._send(400, {"error": {"message": str(exc)}})
            except (BrokenPipeError, ConnectionResetError):
                return None

        def do_GET(self):
            self._route("GET")

        def do_POST(self):
            self._route("POST")

        def do_PUT(self):
            self._route("PUT")

        def do_HEAD(self):
            self._route("HEAD")

        def do_DELETE(self):
            self._route("DELETE")

        # ---- endpoints ------------------------------------------------
        def health(self):
            if engine.gracefully_exit:
                log("Health check request received during shutdown. Returning 503.")
                return self._send(503)
            if engine.status != "Up":
                return self._send(503)
            if engine.group is not None and not engine.group.wait_healthy():
                return self._send(503)
            return self._send(200)

        def ready(self):
            # tokenizer_manager.is_ready(): started, not shutting down, not paused; empty body
            if engine.gracefully_exit or engine.status != "Up":
                return self._send(503)
            return self._send(200)

        def model_info(self):
            return self._send(200, engine.model_info())

        def get_model_info(self):
            log("Endpoint '/get_model_info' is deprecated and will be removed in a future version. "
                "Please use '/model_info' instead.")
            return self.model_info()

        def server_info(self):
            return self._send(200, engine.server_info())

        def get_server_info(self):
            log("Endpoint '/get_server_info' is deprecated and will be removed in a future version. "
                "Please use '/server_info' instead.")
            return self.server_info()

        def models(self):
            return self._send(200, {"object": "list", "data": [self._model_card()]})

        def _model_card(self):
            return {
                "id": engine.served_model_name,
                "object": "model",
                "created": int(engine_started),
                "owned_by": "sglang",
                "root": engine.served_model_name,
                "parent": None,
                "max_model_len": int(sa.context_length or 262144),
            }

        def model_by_id(self):
            name = self.path.split("?", 1)[0][len("/v1/models/"):]
            if name != engine.served_model_name:
                return self._send(404, {"object": "error", "message": f"The model `{name}` does not exist.",
                                        "type": "NotFoundError", "param": None, "code": 404})
            return self._send(200, self._model_card())

        def metrics(self):
            if not sa.enable_metrics:
                return self._send(404, {"detail": "Not Found"})
            return self._send(200, engine.metrics(), "text/plain; version=0.0.4; charset=utf-8")

        def get_load(self):
            running = len(engine.in_flight)
            return self._send(200, [{"dp_rank": dp, "num_reqs": running, "num_waiting_reqs": 0,
                                     "num_tokens": running * 600, "num_pending_tokens": 0,
                                     "ts_tic": time.time()} for dp in range(int(sa.dp_size or 1))])

        def flush_cache(self):
            with engine.lock:
                engine.seen_prompts.clear()
            return self._send(200, "Cache flushed.\nPlease check backend logs for more details. "
                                   "(When there are running or waiting requests, the operation will not be performed.)\n",
                              "text/plain; charset=utf-8")

        def _maybe_hang(self):
            if "health_ok_generate_hangs" in engine.faults and engine.status == "Up":
                engine.hang_event.wait()
            if engine.group is not None:
                engine.group.wait_serving()

        def generate(self):
            body = self._json_body()
            if not isinstance(body, dict):
                raise BadRequest("The request body must be a JSON object.")
            text = body.get("text")
            input_ids = body.get("input_ids")
            if text is None and input_ids is None and body.get("input_embeds") is None:
                raise BadRequest("Either text, input_ids or input_embeds should be provided.")
            sampling = body.get("sampling_params") or {}
            if isinstance(sampling, list):
                sampling = sampling[0] if sampling else {}
            if not isinstance(sampling, dict):
                raise BadRequest("sampling_params must be an object.")
            max_new = sampling.get("max_new_tokens", 128)
            if max_new is not None and (not isinstance(max_new, int) or max_new < 0):
                raise BadRequest(f"max_new_tokens must be at least 0, got {max_new}.")
            temperature = sampling.get("temperature", 1.0)
            if temperature is not None and (not isinstance(temperature, (int, float)) or temperature < 0):
                raise BadRequest(f"temperature must be non-negative, got {temperature}.")
            prompts = []
            if text is not None:
                batch = isinstance(text, list)
                for item in (text if batch else [text]):
                    if not isinstance(item, str):
                        raise BadRequest("text must be a string or a list of strings.")
                    prompts.append((item, count_tokens(item)))
            else:
                batch = bool(input_ids) and isinstance(input_ids[0], list)
                for item in (input_ids if batch else [input_ids]):
                    if not isinstance(item, list) or not all(isinstance(i, int) for i in item):
                        raise BadRequest("input_ids must be a list of integers.")
                    prompts.append((json.dumps(item), max(1, len(item))))
            self._maybe_hang()
            rid = body.get("rid") or uuid.uuid4().hex
            request = dict(body, rid=rid, stream=bool(body.get("stream")))
            log_request(sa, "Receive", request)
            if body.get("stream"):
                return self._stream(prompts[0], sampling, rid if isinstance(rid, str) else uuid.uuid4().hex)
            results = []
            threads = []
            for index, (key, tokens) in enumerate(prompts):
                this_rid = rid if not batch else (rid[index] if isinstance(rid, list) else f"{rid}_{index}")
                results.append(None)

                def run(i=index, k=key, t=tokens, r=this_rid):
                    results[i] = engine.generate_one(k, t, sampling, r)

                worker = threading.Thread(target=run, daemon=True)
                worker.start()
                threads.append(worker)
            for worker in threads:
                worker.join()
            for result in results:
                log_request(sa, "Finish", request, result)
            return self._send(200, results if batch else results[0])

        def _stream(self, prompt, sampling, rid):
            # http_server.py generate_request: a StreamingResponse (text/event-stream) of
            # b"data: " + dumps_json(out) + b"\n\n" per output of the tokenizer manager, then
            # b"data: [DONE]\n\n"; uvicorn sends it with chunked transfer encoding. Every output
            # carries the whole text so far (no --incremental-streaming-output); the last one is the
            # finished request itself, with finish_reason, e2e_latency and the spec_* figures.
            self.send_response(200)
            self.send_header("content-type", "text/event-stream; charset=utf-8")
            self.send_header("transfer-encoding", "chunked")
            self.send_header("x-sglang-sim-worker", engine.worker_id)
            self.end_headers()
            max_new = sampling.get("max_new_tokens", 128)
            max_new = 128 if max_new is None else int(max_new)

            def send_event(data):
                event = b"data: " + data + b"\n\n"
                self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                self.wfile.flush()

            def chunk(words, ids, produced, prompt_tokens, cached):
                if produced >= max_new:
                    return True  # the finished output follows, carrying these tokens
                payload = {"text": " " + " ".join(words), "output_ids": ids,
                           "meta_info": {"id": rid, "finish_reason": None, "prompt_tokens": prompt_tokens,
                                         "weight_version": "default", "completion_tokens": produced,
                                         "cached_tokens": cached, "sim_worker": engine.worker_id}}
                try:
                    send_event(_compact_json(payload))
                except OSError:
                    return False  # the client went away: the real server aborts the request
                return True

            result = engine.generate_one(prompt[0], prompt[1], sampling, rid, stream_cb=chunk)
            log_request(sa, "Finish", {"text": prompt[0], "sampling_params": sampling, "rid": rid, "stream": True},
                        result)
            try:
                send_event(_compact_json(result))
                send_event(b"[DONE]")
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except OSError:
                self.close_connection = True
            if sa.log_requests or os.environ.get("SGLANG_SIM_ACCESS_LOG", "1") != "0":
                _access_log(self.client_address, "POST", self.path, 200)

        def completions(self, chat=False):
            body = self._json_body()
            if not isinstance(body, dict):
                raise BadRequest("The request body must be a JSON object.")
            if chat:
                messages = body.get("messages")
                if not isinstance(messages, list) or not messages:
                    raise BadRequest("messages must be a non-empty list.")
                prompt = json.dumps(messages)
            else:
                prompt = body.get("prompt")
                if prompt is None:
                    raise BadRequest("prompt is required.")
                prompt = prompt if isinstance(prompt, str) else json.dumps(prompt)
            max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or 16
            self._maybe_hang()
            rid = uuid.uuid4().hex
            result = engine.generate_one(prompt, count_tokens(prompt),
                                         {"max_new_tokens": int(max_tokens),
                                          "temperature": body.get("temperature", 1.0)}, rid)
            meta = result["meta_info"]
            usage = {"prompt_tokens": meta["prompt_tokens"], "completion_tokens": meta["completion_tokens"],
                     "total_tokens": meta["prompt_tokens"] + meta["completion_tokens"]}
            if chat:
                choice = {"index": 0, "message": {"role": "assistant", "content": result["text"].strip()},
                          "finish_reason": "length"}
                obj = "chat.completion"
            else:
                choice = {"index": 0, "text": result["text"], "logprobs": None, "finish_reason": "length"}
                obj = "text_completion"
            return self._send(200, {"id": rid, "object": obj, "created": int(time.time()),
                                    "model": engine.served_model_name, "choices": [choice], "usage": usage,
                                    "sim_worker": engine.worker_id})

        def chat_completions(self):
            return self.completions(chat=True)

    ROUTES = {
        "/health": {"GET": Handler.health},
        "/health_generate": {"GET": Handler.health},
        "/model_info": {"GET": Handler.model_info},
        "/get_model_info": {"GET": Handler.get_model_info},
        "/server_info": {"GET": Handler.server_info},
        "/get_server_info": {"GET": Handler.get_server_info},
        "/v1/models": {"GET": Handler.models},
        "/metrics": {"GET": Handler.metrics},
        "/get_load": {"GET": Handler.get_load},
        "/v1/loads": {"GET": Handler.get_load},
        "/flush_cache": {"GET": Handler.flush_cache, "POST": Handler.flush_cache},
        "/generate": {"POST": Handler.generate, "PUT": Handler.generate},
        "/v1/completions": {"POST": Handler.completions},
        "/v1/chat/completions": {"POST": Handler.chat_completions},
    }
    if at_least("0.5.20"):
        ROUTES["/ready"] = {"GET": Handler.ready}
    engine_started = time.time()
    return Handler


class SimHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024
    allow_reuse_address = True

    def __init__(self, address, handler):
        # uvicorn's bind_socket: AF_INET6 for an address with ':' ("::" then also takes IPv4,
        # net.ipv6.bindv6only permitting), AF_INET otherwise.
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, handler)

    def handle_error(self, request, client_address):
        pass  # client went away; uvicorn stays quiet about it too


# --------------------------------------------------------------------------
# launch
# --------------------------------------------------------------------------


class Launcher:
    def __init__(self, server_args):
        self.server_args = server_args
        self.sa = sa = Resolved(server_args)
        self.faults = parse_faults()
        marker = self.faults.get("crash_once")
        if marker and not os.path.exists(marker):
            # the first launch crashes during load (as crash_during_load) and leaves the marker; the
            # next one - systemd's restart - starts normally
            with open(marker, "w"):
                pass
            self.faults["crash_during_load"] = None
        self.layout = Layout(sa)
        self.children = []
        self.engine = Engine(sa, server_args, self.faults, self.layout)
        self.httpd = None
        self.version = selected_version()
        self.exit_code = 0
        self.group = None  # multi-node: set by sglang._sim_multinode's launchers

    # ---- process tree --------------------------------------------------
    def kill_children(self):
        for pid in self.children:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        for pid in self.children:
            try:
                os.waitpid(pid, 0)
            except OSError:
                pass
        self.children = []

    def kill_process_tree_and_self(self):
        """0.5.11's kill_process_tree(os.getpid()): children, then SIGKILL itself."""
        self.kill_children()
        os.kill(os.getpid(), signal.SIGKILL)

    def launch_phase_sigquit(self, signum, frame):
        log("Received sigquit from a child process. It usually means the child failed.")
        self.kill_process_tree_and_self()

    def running_phase_sigquit(self, signum, frame):
        log("SIGQUIT received. signum=None, frame=None. It usually means one child failed.")
        self.kill_process_tree_and_self()

    # ---- main ----------------------------------------------------------
    def log_server_args(self):
        if at_least("0.5.19"):
            # engine.py: logger.info(f"server_args={server_args.resolved_dict()}"), watermark
            # secrets redacted from 0.5.22; api_key stays in clear text.
            values = self.server_args.resolved_dict()
            if at_least("0.5.22"):
                for key in ("watermark_key", "watermark_key_b", "watermark_config"):
                    if values.get(key) is not None:
                        values[key] = "<redacted>"
            log(f"server_args={values}")
        else:
            log(f"server_args={self.server_args!r}")  # logger.info(f"{server_args=}")

    def run(self):
        sa = self.sa
        self.log_server_args()
        load_seconds = self.engine.load_seconds
        signal.signal(signal.SIGQUIT, self.launch_phase_sigquit)
        read_fd, write_fd = os.pipe()
        start = time.monotonic()
        for rank in self.layout.ranks:
            pid = os.fork()
            if pid == 0:
                os.close(read_fd)
                try:
                    scheduler_main(sa, self.layout, rank, write_fd, self.faults, load_seconds, start,
                                   self.group)
                finally:
                    os._exit(1)
            self.children.append(pid)
        os.close(write_fd)
        # Wait for every scheduler; SIGTERM here keeps its default action (die).
        got = 0
        while got < len(self.layout.ranks):
            try:
                data = os.read(read_fd, 64)
            except InterruptedError:
                continue
            if not data:
                break
            got += len(data)
        os.close(read_fd)
        if got < len(self.layout.ranks):
            time.sleep(1.0)  # a dying child signals us; give the handler time to run
            log("Received sigquit from a child process. It usually means the child failed.")
            self.kill_process_tree_and_self()
        self.serve()

    def serve(self):
        sa = self.sa
        engine = self.engine
        host = sa.host or "127.0.0.1"
        try:
            self.httpd = SimHTTPServer((host, int(sa.port)), make_handler(engine))
        except OSError as exc:
            log(f"INFO:     Started server process [{os.getpid()}]")
            log("INFO:     Waiting for application startup.")
            log("INFO:     Application startup complete.")
            log(f"ERROR:    [Errno {exc.errno}] error while attempting to bind on address "
                f"('{host}', {sa.port}): {exc.strerror.lower() if exc.strerror else exc}")
            log("INFO:     Waiting for application shutdown.")
            log("INFO:     Application shutdown complete.")
            self.kill_children()
            sys.exit(1)
        if "orphan_on_stop" in self.faults:
            self._spawn_orphan()
        signal.signal(signal.SIGQUIT, self.running_phase_sigquit)
        signal.signal(signal.SIGTERM, self.on_sigterm)
        signal.signal(signal.SIGINT, self.on_sigterm)
        log(f"INFO:     Started server process [{os.getpid()}]")
        log("INFO:     Waiting for application startup.")
        log("INFO:     Application startup complete.")
        shown = f"[{host}]" if ":" in host else host
        log(f"INFO:     Uvicorn running on http://{shown}:{sa.port} (Press CTRL+C to quit)")
        threading.Thread(target=self.warmup, daemon=True).start()
        threading.Thread(target=self.sigterm_watchdog, daemon=True).start()
        self.httpd.serve_forever(poll_interval=0.05)
        # serve_forever returned: 0.5.23-style clean stop
        log("INFO:     Shutting down")
        log("INFO:     Waiting for application shutdown.")
        log("INFO:     Application shutdown complete.")
        log(f"INFO:     Finished server process [{os.getpid()}]")
        sys.stdout.flush()
        os._exit(0)

    def warmup(self):
        import urllib.request

        sa = self.sa
        url = self.server_args.url()
        headers = {"Content-Type": "application/json"}
        if sa.api_key:
            headers["Authorization"] = f"Bearer {sa.api_key}"
        try:
            request = urllib.request.Request(url + "/model_info", headers=headers)
            urllib.request.urlopen(request, timeout=600).read()
            if not sa.skip_server_warmup:
                log("Prefill batch, #new-seq: 1, #new-token: 7, #cached-token: 0, token usage: 0.00, "
                    "#running-req: 0, #queue-req: 0, ", self.layout.rank0_prefix)
                body = json.dumps({"text": "The capital city of France is",
                                   "sampling_params": {"temperature": 0, "max_new_tokens": 8}}).encode()
                request = urllib.request.Request(url + "/generate", data=body, headers=headers, method="POST")
                urllib.request.urlopen(request, timeout=600).read()
        except Exception as exc:
            log(f"Initialization failed. warmup error: {exc}")
            self.kill_process_tree_and_self()
            return
        self.engine.status = "Up"
        log("The server is fired up and ready to roll!")
        if "reinit_draft_after_ready" in self.faults and self.sa.speculative_algorithm == "DFLASH":
            threading.Thread(target=self.reinit_draft_after_ready, daemon=True).start()

    def reinit_draft_after_ready(self):
        """Fault reinit_draft_after_ready=S:W: the draft worker is re-initialised S s after ready.

        Logged by the main process under the prefix of each scheduler that logs the
        config line (like the Decode batch lines); the runtime switches to W then.
        """
        seconds, _sep, window = (self.faults["reinit_draft_after_ready"] or "").partition(":")
        time.sleep(float(seconds or 0))
        window = parse_window(window)
        self.engine.spec.window = window
        for rank in self.layout.ranks:
            if rank.logs_draft_config:
                log(config_line(self.sa, window), self.layout.prefix(rank))
                log(ready_line(), self.layout.prefix(rank))

    def _spawn_orphan(self):
        """Fault orphan_on_stop: a grandchild that outlives us, still holding the port."""
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(write_fd)
            if os.fork() != 0:
                os._exit(0)  # re-parent the grandchild away from the main process
            try:
                while os.read(read_fd, 1):
                    pass
            except OSError:
                pass
            # main process is gone: keep answering on the inherited socket
            self.engine.status = "Up"
            self.engine.gracefully_exit = False
            try:
                self.httpd.serve_forever(poll_interval=0.05)
            finally:
                os._exit(0)
        os.close(read_fd)
        os.waitpid(pid, 0)
        self._orphan_pipe = write_fd  # closed by the kernel when we exit

    # ---- stopping ------------------------------------------------------
    def stop_schedulers(self):
        """0.5.19+ ShutdownReq: alone, the schedulers are killed right after; a group overrides."""

    def on_sigterm(self, signum=None, frame=None):
        if self.engine.gracefully_exit:
            return
        log("SIGTERM received. signum=None frame=None. Draining requests and shutting down...")
        self.engine.gracefully_exit = True

    def sigterm_watchdog(self):
        poll = _env_float("SGLANG_SIM_DRAIN_POLL_SECONDS", 5.0)
        while not self.engine.gracefully_exit:
            time.sleep(poll)
        slow = self.faults.get("slow_stop") if "slow_stop" in self.faults else None
        if slow is not None:
            # keeps answering (as if SIGTERM took effect late)
            self.engine.gracefully_exit = False
            time.sleep(float(slow or 10))
            self.engine.gracefully_exit = True
        self.engine.hang_event.set()
        while True:
            with self.engine.lock:
                remaining = list(self.engine.in_flight)
            log(f"Gracefully exiting... Remaining number of requests {len(remaining)}. "
                f"Remaining requests remaining_rids={remaining}.")
            if remaining:
                time.sleep(poll)
            else:
                break
        # tokenizer_manager.sigterm_watchdog: kill_process_tree(include_parent=True) up to
        # 0.5.18; from 0.5.19 include_parent=False, then sys.exit(0)
        if at_least("0.5.19"):
            self.stop_schedulers()
            self.kill_children()
            self.httpd.shutdown()  # serve() logs uvicorn's shutdown and exits 0
        else:
            self.kill_process_tree_and_self()


def launch_server(server_args):
    # _launch_subprocesses: check_server_args() before anything is logged or started.
    server_args.check_server_args()
    if int(server_args.effective("nnodes", 1) or 1) > 1:
        from sglang._sim_multinode import launcher_for

        launcher_for(server_args).run()
        return
    Launcher(server_args).run()
