"""`python -m lmtrain.plot RUN_OR_SWEEP...`: the command; the tool is `lmtrain.tools.plot`."""

from lmtrain.tools.plot import main

if __name__ == "__main__":
    main()
