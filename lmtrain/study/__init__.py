"""Studies as code: a declared grid of runs over seeds, its raw records, and the table and plot rendered from them.

``python -m lmtrain.study NAME`` runs what is missing, ``--render`` rewrites the table and plot from the records and
``list`` shows every study; ``python scripts/render_docs.py --check`` tells whether the committed tables match their
records.
"""
