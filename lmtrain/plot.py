"""`python -m lmtrain.plot RUN_OR_SWEEP...`: the command; the tool is `lmtrain.tools.plot`."""

import sys

from lmtrain.tools.plot import main

if __name__ == "__main__":
    try:
        main()
    except (ValueError, FileNotFoundError) as error:  # nothing to plot, a folder without runs: one line
        print(f"plot: {error}", file=sys.stderr)
        sys.exit(2)
