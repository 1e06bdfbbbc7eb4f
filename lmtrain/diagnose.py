"""`python -m lmtrain.diagnose`: the command; the tool is `lmtrain.tools.diagnose`."""

import sys

from lmtrain.tools.diagnose import main

if __name__ == "__main__":
    sys.exit(main())
