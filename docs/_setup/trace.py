# A recorded run on disk: run.arrow (a synthetic diverging curve), in the working directory.
from trainsignals.curves import generate
from trainsignals.io.traces import write_trace

_c = generate("divergence", seed=3, difficulty="easy")
write_trace("run.arrow", **_c.signals(), metadata={"model": "mlp", "lr": 3e-4})
