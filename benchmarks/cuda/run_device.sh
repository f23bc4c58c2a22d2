#!/usr/bin/env bash
# The GPU session's measurements in one prepared call (issue 37): the gpu-marked tests, the
# Muon/AdamW step micro-benchmark and nanoGPT's shakespeare-char run side by side with attnlab's.
# Run from the repository root on a CUDA machine with a nanoGPT checkout (data prepared) and the
# text in .device/:   OUT=/some/dir bash benchmarks/cuda/run_device.sh [race|bench|overhead|all]
# overhead (issue 37 item 3, ~4 min, needs only .device/tinyshakespeare.txt): its gpu test, then
# attnlab at nanoGPT's shakespeare-char config, one warm-up run then 3 timed ones; the time outside
# the training steps by phase (each run's timing.json + the process's exit) in
# $OUT/overhead/NANOGPT.md, and where `attnlab train`'s imports go (python -X importtime) in
# $OUT/importtime.txt.
# profile (issue 37 item 4, ~8 min with overhead and tests: `run_device.sh profile`): the kernels of
# the gpu-char step and a candidate QK-norm change (benchmarks/cuda/profile_step.py), then the
# overhead runs (2 rounds) and the gpu-marked tests.
# lab (issue 33, ~3 min): the GPU forms of the lab's timing experiments, parallelism and complexity,
# written to docs/experiments/NAME as a full run would be and copied to $OUT/experiments/NAME (copy
# them back into docs/experiments/ and commit), then the gpu-marked tests.
set -uo pipefail
export PYTHONPATH=src PYTHONUNBUFFERED=1
OUT=${OUT:-benchmarks/cuda/out}
mkdir -p "$OUT"
what=${1:-all}
gpu_tests() {  # every gpu-marked test, within $1 seconds
  timeout "$1" python -m pytest -m gpu -n 0 -q -rs --continue-on-collection-errors tests > "$OUT/pytest_gpu.txt" 2>&1
  tail -4 "$OUT/pytest_gpu.txt"
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
python -c "import torch, transformers; print(torch.__version__, torch.version.cuda, transformers.__version__)" >> "$OUT/gpu.txt" 2>&1
if [ "$what" = all ] || [ "$what" = tests ]; then
  gpu_tests 240
  timeout 150 python -m attnlab bench --suite optim --compile --rounds 5 --json "$OUT/optim.json" \
    --report "$OUT/OPTIM.md" > "$OUT/optim.txt" 2>&1
  tail -4 "$OUT/optim.txt"
fi
if [ "$what" = all ] || [ "$what" = race ]; then
  timeout 420 python benchmarks/nanogpt_race.py --nanogpt .device/nanogpt \
    --text .device/tinyshakespeare.txt --rounds 2 --gpu-char-steps 1000,1250 --out "$OUT/race" \
    > "$OUT/race.txt" 2>&1
  tail -12 "$OUT/race.txt"
fi
if [ "$what" = overhead ]; then  # (race also breaks attnlab_same down)
  timeout 200 python -m pytest -m gpu -n 0 -q tests/train/test_train_timing.py \
    > "$OUT/pytest_overhead.txt" 2>&1
  tail -3 "$OUT/pytest_overhead.txt"
  python -X importtime -m attnlab train --help > /dev/null 2> "$OUT/importtime.txt"
  sort -t'|' -k2 -n "$OUT/importtime.txt" | tail -5
  timeout 300 python benchmarks/nanogpt_race.py --text .device/tinyshakespeare.txt \
    --only attnlab_same --rounds 3 --out "$OUT/overhead" > "$OUT/overhead.txt" 2>&1
  tail -28 "$OUT/overhead.txt"
fi
if [ "$what" = profile ]; then
  timeout 220 python benchmarks/cuda/profile_step.py --out "$OUT" > "$OUT/profile_step.txt" 2>&1
  grep -v USDT "$OUT/profile_step.txt" | tail -60
  timeout 190 python benchmarks/nanogpt_race.py --text .device/tinyshakespeare.txt \
    --only attnlab_same --rounds 2 --out "$OUT/overhead" > "$OUT/overhead.txt" 2>&1
  tail -24 "$OUT/overhead.txt"
  gpu_tests 150
fi
if [ "$what" = lab ]; then
  mkdir -p "$OUT/experiments"
  for name in parallelism complexity; do
    timeout 150 python -m attnlab experiment "$name" --seed 0 > "$OUT/experiments/$name.txt" 2>&1
    tail -3 "$OUT/experiments/$name.txt"
    cp -r "docs/experiments/$name" "$OUT/experiments/"
  done
  gpu_tests 200
fi
if [ "$what" = bench ]; then
  timeout 300 python benchmarks/cuda_bench.py --suite train --rounds 3 --min-round-s 0.5 \
    --out "$OUT/bench" > "$OUT/bench.txt" 2>&1
  tail -30 "$OUT/bench.txt"
fi
