#!/usr/bin/env bash
# Every GPU check in one run, for a session that is lent a GPU node for a few minutes:
#   benchmarks/gpu_node.sh OUT SHARD... (kohakuclip and its dependencies importable; torch with CUDA)
# the CUDA tests, gpu_check.py (synthetic samples, then the shards), the loader alone
# (loader_bench.py --cuda: in-process thread use, prefetch depths, workers) and training fed by
# it (gpu_train.py). Tables go to stdout and OUT/*.txt; each step has its own time limit, so a
# slow step costs only its own rows. Give it shards of real footage (a few MB are enough).
set -u
out=$1
shift
mkdir -p "$out"
export PYTHONUNBUFFERED=1
here=$(cd "$(dirname "$0")" && pwd)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
lscpu | grep -E "^(Model name|Thread|Core|Socket|CPU\(s\))"
python3 -c "import sys, torch, numba, numpy, av; print(sys.version.split()[0], 'torch', torch.__version__, 'numba', numba.__version__, 'numpy', numpy.__version__, 'av', av.__version__)"
# numba compiles the decoders once (about a minute), beside the tests
python3 -c "import sys, kohakuclip; kohakuclip.Reader(sys.argv[1:], size=256).read([(0, [0, 6, 12])])" "$@" &
echo "== CUDA tests"
timeout 120 python3 -m pytest -q -p no:cacheprovider -rs "$here/../tests/test_yuv_torch.py" "$here/../tests/test_torch.py" -k "cuda or interpreter or pinned" 2>&1 | tail -n 6
wait
echo "== gpu_check"
timeout 120 python3 "$here/gpu_check.py" --json "$out/gpu_check_synthetic.json" 2>&1 | tee "$out/gpu_check_synthetic.txt"
timeout 90 python3 "$here/gpu_check.py" "$@" --json "$out/gpu_check.json" 2>&1 | tee "$out/gpu_check.txt"
echo "== loader alone"
timeout 150 python3 "$here/loader_bench.py" "$@" --cuda --batches 25 --warmup 3 --setups 0x15 0x15p2 0x7 3x5 15x1 2>&1 | tee "$out/loader.txt"
echo "== training fed by the loader"
timeout 150 python3 "$here/gpu_train.py" "$@" --setups 0x7 0x15 3x5 --modes yuv_resized --gil 2>&1 | tee "$out/train.txt"
