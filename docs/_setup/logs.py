# Other tools' logs in the working directory: metrics.csv (columns step, train_loss, grad_norm).
import numpy as np
import pandas as pd

_t = np.arange(300)
_loss = np.r_[2.0 * np.exp(-_t[:200] / 80) + 0.3, (0.33 * 1.1 ** np.arange(100))]
pd.DataFrame({"step": _t, "train_loss": _loss, "grad_norm": 1.0 + 0.1 * np.sin(_t)}).to_csv("metrics.csv", index=False)
