"""lmtrain's Hydra sweeper (``hydra/sweeper=lmtrain``, conf/train.yaml's default): Hydra finds sweepers only in
the ``hydra_plugins`` package."""
