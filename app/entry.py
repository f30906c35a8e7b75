"""The ``detstream`` command's entry point: the console script and ``python -m app``.

SIGINT/SIGTERM become a stop request (:class:`app.stop.StopRequest`) before anything heavy is imported, so a signal
in the first half second is never met by the default action (SIGTERM would end the process with 143, publishing
nothing). The process ends through :func:`app.stop.exit_now`, so the handlers stay in place to the last
instruction: interpreter finalization would reset them, and a signal in that window would end the process with
-SIGINT or 143 instead of its exit code. This module imports only :mod:`app.stop` at import time.
"""

from __future__ import annotations

from app.stop import StopRequest, exit_now


def main() -> None:
    """Install the stop request, then import and run the CLI; never returns."""
    stop = StopRequest().install()
    from app.cli import main as cli_main

    try:
        code = cli_main(stop=stop)
    except SystemExit as exit_:  # argparse's usage errors and --help
        code = exit_.code
    exit_now(code)
