#!/usr/bin/env bash
# Run ON THE GPU MACHINE: checkpoints written by fla 0.5.2 / transformers themselves,
# with fla's fp32 log-probs, greedy tokens and the gap analysis
# (scripts/make_fla_fixtures.py). Device run, carrying ".whl" (the fla wheels,
# scripts/gpu-prepare.sh or its pip download line) and, to get kda-cli's numbers
# in the same report, ".carry" (gpu-prepare.sh):
#     bash scripts/gpu-fixtures.sh
# Output: $OUT/fla-fixtures.tgz (fixtures/NAME/{config.json, model.safetensors,
# expected.json}, analysis/, summary.txt, log.txt) and $OUT/summary.txt.
# Unpack fixtures/* into tests/fixtures/fla/ (tests/fixtures/fla/README.md).
# Time: 3-8 minutes (Triton compiles and autotunes the chunk kernels per shape);
# KDA_FIXTURE_BUDGET_S (default 480) bounds it.
source "$(dirname "$0")/gpu-env.sh"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
python3 -c "import torch, transformers, einops; print('torch', torch.__version__, 'transformers', transformers.__version__)"
python3 scripts/make_fla_fixtures.py --out "$OUT"
