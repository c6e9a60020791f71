"""``python -m racsim``: the same as the ``racsim`` command."""

from .cli import main

main()
