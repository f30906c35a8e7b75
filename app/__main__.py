"""``python -m app`` is the ``detstream`` command."""


from app.stop import StopRequest

# Before any other import: a SIGINT/SIGTERM in the first milliseconds is a stop request, not a kill.
_stop = StopRequest().install()

from app.cli import main  # noqa: E402
from app.stop import exit_now  # noqa: E402

try:
    _code = main(stop=_stop)
except SystemExit as _exit:  # argparse's usage errors and --help
    _code = _exit.code
# The handlers stay in place to the last instruction: interpreter finalization would reset them to the default
# action, and a signal in that window would end the process with -SIGINT or 143 instead of its exit code.
exit_now(_code)
