"""`python -m lmtrain.plot RUN_OR_SWEEP...`: the command; the tool is `lmtrain.tools.curve_plot`."""

from lmtrain.tools.curve_plot import main

if __name__ == "__main__":
    main()
