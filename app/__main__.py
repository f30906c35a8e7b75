"""``python -m app`` is the ``detstream`` command."""

import sys

from app.stop import StopRequest

# Before any other import: a SIGINT/SIGTERM in the first milliseconds is a stop request, not a kill.
_stop = StopRequest().install()

from app.cli import main  # noqa: E402

sys.exit(main(stop=_stop))
