"""Launch the inference server (simulated)."""

import sys
import warnings

from sglang.srt.server_args import prepare_server_args


def run_server(server_args):
    # 0.5.19+: prepare_server_args returns raw input; resolution (and the DFLASH
    # checks) runs here, before anything is logged or forked.  A failure is an
    # uncaught ValueError: traceback on stderr, exit 1.
    if hasattr(server_args, "resolve_once"):
        server_args.resolve_once()
    from sglang.srt.entrypoints.http_server import launch_server

    launch_server(server_args)


if __name__ == "__main__":
    warnings.warn(
        "'python -m sglang.launch_server' is still supported, but "
        "'sglang serve' is the recommended entrypoint.\n"
        "  Example: sglang serve --model-path <model> [options]",
        UserWarning,
        stacklevel=1,
    )
    server_args = prepare_server_args(sys.argv[1:])
    run_server(server_args)
