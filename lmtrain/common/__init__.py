"""What every layer may use: the execution switch (CPU or GPU code paths), the float32 regions of mixed
precision and the range metadata the options share."""
