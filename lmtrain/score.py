"""`python -m lmtrain.score`: the command; the tool is `lmtrain.tools.score`."""

import sys

from lmtrain.tools.score import main

if __name__ == "__main__":
    sys.exit(main())
