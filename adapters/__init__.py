"""Framework adapters, installed as ``trainsignals.adapters`` (this folder is mapped there by
``pyproject.toml``; nothing named ``adapters`` is installed at top level).

Each adapter lives in ``trainsignals.adapters.<framework>`` and imports its framework itself,
so ``import trainsignals`` stays framework-free. Raw arrays need no adapter: use
``trainsignals.scan(loss=..., grad_norm=...)`` or ``Monitor.scan``.
"""
