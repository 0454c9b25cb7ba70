# Third GPU call: the fast path's generation after the bf16-step fix, and training at 64 streams.
set -o pipefail
export PYTHONUNBUFFERED=1 OUT=${OUT:?set OUT to an output folder}
mkdir -p $OUT
SITE=$(mktemp -d)  # the wheels the machine lacked, installed for this run only
python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .devwhl/*.whl
export PYTHONPATH=$PWD/src:$PWD/.devsite:$SITE
{ nvidia-smi -L; python3 -c "import torch,sys;print(sys.version.split()[0], torch.__version__, torch.cuda.get_device_name())"; } > $OUT/env.txt 2>&1
echo "== pytest"
timeout 120 python3 -m pytest -q -p no:cacheprovider -o addopts="" -rs tests/test_cuda.py 2>&1 | tee $OUT/pytest-3.log | tail -8
echo "== inference_throughput"
timeout 150 python3 benchmarks/inference_throughput.py --device cuda --preset enwik8-paper --paths fast eager --eval-streams 64 --json $OUT/inference_throughput-3.json 2>&1 | tee $OUT/inference_throughput-3.log | tail -20
echo "== train_throughput"
timeout 170 python3 benchmarks/train_throughput.py --device cuda --presets enwik8-paper --streams 64 --paths fast eager --json $OUT/train_throughput-3.json 2>&1 | tee $OUT/train_throughput-3.log | tail -20
echo "== done"
