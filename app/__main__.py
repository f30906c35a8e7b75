"""``python -m app`` is the ``detstream`` command (:mod:`app.entry`)."""

from app.entry import main

main()
