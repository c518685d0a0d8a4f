"""Log line writer matching SGLang's ``configure_logger`` format.

``[%(asctime)s{.mmm}{prefix}] %(message)s`` with ``%Y-%m-%d %H:%M:%S``.
Lines go straight to the fd with os.write: one unbuffered write per line, so
nothing waits in a buffer when stdout/stderr is a pipe to journald, and lines
of concurrent processes never interleave mid-line.
"""
import os
import time


def log_ms_enabled():
    return os.environ.get("SGLANG_LOG_MS", "").lower() in ("1", "true", "yes", "y", "on")


def rank_prefix(dp_rank=None, pp_size=1, pp_rank=0, attn_cp_size=1, attn_cp_rank=0,
                moe_dp_size=1, moe_dp_rank=0, tp_size=1, tp_rank=0, ep_size=1, ep_rank=0):
    """The scheduler's log prefix, as configure_scheduler_process builds it.

    DP appears whenever the scheduler has a DP rank (dp_size > 1 or attention
    DP; else SGLANG_DP_RANK, set by the router), the other dimensions only
    when their size is > 1, always in this order.
    """
    if dp_rank is None and "SGLANG_DP_RANK" in os.environ:
        dp_rank = int(os.environ["SGLANG_DP_RANK"])
    prefix = ""
    if dp_rank is not None:
        prefix += f" DP{dp_rank}"
    if pp_size > 1:
        prefix += f" PP{pp_rank}"
    if attn_cp_size > 1:
        prefix += f" ATTN_CP{attn_cp_rank}"
    if moe_dp_size > 1:
        prefix += f" MOE_DP{moe_dp_rank}"
    if tp_size > 1:
        prefix += f" TP{tp_rank}"
    if ep_size > 1:
        prefix += f" EP{ep_rank}"
    return prefix


def format_line(message, prefix="", now=None):
    now = time.time() if now is None else now
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now))
    if log_ms_enabled():
        stamp += ".%03d" % int((now - int(now)) * 1000)
    return f"[{stamp}{prefix}] {message}"


def write_line(text, fd=2):
    data = (text + "\n").encode("utf-8", "replace")
    while data:
        try:
            written = os.write(fd, data)
        except InterruptedError:
            continue
        except OSError:
            return
        data = data[written:]


def log(message, prefix=""):
    write_line(format_line(message, prefix))
