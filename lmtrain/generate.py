"""`python -m lmtrain.generate`: the command; the tool is `lmtrain.tools.generate`."""

import sys

from lmtrain.tools.generate import main

if __name__ == "__main__":
    sys.exit(main())
