"""``python -m rlbuf``: the same as the ``rlbuf`` command (see ``rlbuf.cli``)."""

import sys

from rlbuf.cli import main

if __name__ == "__main__":
    sys.exit(main())
