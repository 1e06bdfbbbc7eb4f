"""The command line around the tools: overrides checked before Hydra starts, and failures as one line."""
