# A toy training run for the README's quickstart: least squares by minibatch gradient descent,
# whose learning rate is raised 300-fold at step 150. `loader` yields batches of row indices;
# `train_step(batch)` takes one step and returns (loss, grad_norm, lr).
import numpy as np

_rng = np.random.default_rng(0)
_X = _rng.normal(size=(256, 8))
_y = _X @ _rng.normal(size=8) + 0.1 * _rng.normal(size=256)
_state = {"w": np.zeros(8), "lr": 0.01, "step": 0}
loader = [_rng.integers(0, 256, 32) for _ in range(300)]


def train_step(batch):
    if _state["step"] == 150:
        _state["lr"] *= 300
    _state["step"] += 1
    err = _X[batch] @ _state["w"] - _y[batch]
    grad = _X[batch].T @ err / len(batch)
    _state["w"] -= _state["lr"] * grad
    return err @ err / len(batch), np.linalg.norm(grad), _state["lr"]
