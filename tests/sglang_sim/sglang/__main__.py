"""`python -m sglang serve ...` behaves like the `sglang serve` console script."""
import sys

from sglang.launch_server import run_server
from sglang.srt.server_args import prepare_server_args

if __name__ == "__main__":
    argv = sys.argv[1:]
    if argv and argv[0] == "serve":
        argv = argv[1:]
    run_server(prepare_server_args(argv))
