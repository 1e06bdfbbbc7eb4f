"""The run folder, the one owner of every file a run writes and reads: ``ckpt_path.py`` (the checkpoint a run resumes
and the folder it goes on in), ``checkpoints.py`` (checkpoint files: atomic writes, safe reads, compatibility),
``resume.py`` (what a checkpoint carries beyond the weights, and how a fit takes it back), ``rng.py`` (the random
states), ``folder.py`` (config.yaml, vocab.tsv, run.json and the run's name and result line)."""
