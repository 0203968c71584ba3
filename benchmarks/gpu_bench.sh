#!/usr/bin/env bash
# The PyTorch watcher's overhead benchmark on a GPU, in one prepared run: for a session that is
# lent a GPU machine (its image has torch, Lightning, NumPy and SciPy, and nothing can be
# fetched there). Installs this checkout without its dependencies into a scratch folder,
# prints the GPU, then runs benchmarks/bench_torch.py on every model, twice the GPT-2-like
# batch of the CPU run. Outputs land in $OUT (or the current folder) as gpu.txt and
# bench_torch_gpu.txt. About 3-5 minutes on an H200.
#
#   bash benchmarks/gpu_bench.sh                 # the GPU run
#   DEVICE=cpu STEPS=6 REPEATS=1 MODELS=cnn bash benchmarks/gpu_bench.sh   # a smoke test anywhere
set -euo pipefail
out="${OUT:-.}"
device="${DEVICE:-cuda}"
site="$(mktemp -d)"
python3 -m pip install -q --no-deps --no-build-isolation --no-compile --target "$site" . >/dev/null
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$out/gpu.txt"
fi
python3 - <<'EOF' | tee -a "$out/gpu.txt"
import torch, trainsignals
print("torch", torch.__version__, "cuda", torch.version.cuda, "trainsignals", trainsignals.__version__,
      "gpu", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none")
EOF
python3 benchmarks/bench_torch.py --device "$device" --models "${MODELS:-mlp,mlp256,cnn,gpt2}" \
    --steps "${STEPS:-50}" --repeats "${REPEATS:-3}" --gpt2-batch "${GPT2_BATCH:-2}" 2>&1 \
    | tee "$out/bench_torch_gpu.txt"
