"""`python -m lmtrain.summarize MULTIRUN_DIR`: the command; the tool is `lmtrain.tools.summarize`."""

import sys

from lmtrain.tools.summarize import main

if __name__ == "__main__":
    sys.exit(main())
