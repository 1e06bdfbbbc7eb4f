"""The command line around the app: what Hydra or the config checks refuse, and known failures, as one line."""
