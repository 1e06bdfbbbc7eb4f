"""What every layer may use: the execution switch (CPU or GPU code paths)."""
