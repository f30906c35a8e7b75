"""``python -m app`` is the ``detstream`` command."""

import sys

from app.cli import main

sys.exit(main())
