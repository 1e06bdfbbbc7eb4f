"""What every layer may use: the execution switch (CPU or GPU code paths) and the float32 regions of mixed
precision."""
