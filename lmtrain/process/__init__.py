"""The training process: what it sets before it builds anything (``prepare.py``: its compute threads, ``threads.py``;
matmul precision and subnormals; the allocator, ``memory.py``), the library messages it silences
(``library_logs.py``) and its signals (``signals.py``: a stop at a step boundary)."""
