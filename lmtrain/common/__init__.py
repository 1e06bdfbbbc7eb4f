"""What every layer may use: the float32 regions of mixed precision, the range metadata the options share and
constants as views (the bias column [x, 1], the uniform proposal's log q)."""
