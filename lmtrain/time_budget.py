"""Strategies at equal training time: a table and a PNG of validation perplexity against training minutes.

    python -m lmtrain.time_budget RUNS_DIR [--budgets 1,2,4,7] [--out DIR] [--title TEXT]

RUNS_DIR holds run folders (a Hydra multirun, or any folder of them, searched recursively), each trained with
``max_train_seconds`` (or any run whose validations log ``train/seconds``). Writes DIR/summary.md (per run: the
exact val ppl of the last validation within each budget, in minutes of training with validation left out, the
steps, tokens/s and training minutes) and DIR/ppl_vs_time.png. DIR defaults to RUNS_DIR.

The command; the tool is `lmtrain.tools.time_budget`.
"""

import sys

from lmtrain.tools.time_budget import main

if __name__ == "__main__":
    sys.exit(main())
