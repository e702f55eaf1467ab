"""`python -m gateway`: the HTTP/SSE gateway role as its own process (`threadline gateway` execs this)."""

from __future__ import annotations

import argparse
import sys

from gateway.app import run_gateway
from streams.cli import log_level_option, start_role


def main() -> int:
    """Serve the gateway with the settings of the environment until SIGINT or SIGTERM."""
    parser = argparse.ArgumentParser(prog="python -m gateway", description=__doc__)
    log_level_option(parser)
    return run_gateway(start_role(parser.parse_args().log_level))


if __name__ == "__main__":
    sys.exit(main())
