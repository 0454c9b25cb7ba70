set -o pipefail
export PYTHONUNBUFFERED=1
SITE=$(mktemp -d)  # the wheels the machine lacked, installed for this run only
python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .devwhl/*.whl
export PYTHONPATH=$PWD/src:$PWD/.devsite:$SITE
echo "== train_throughput"
timeout 150 python3 benchmarks/train_throughput.py --device cuda --presets enwik8-paper --streams 16 64 --json $OUT/train_throughput.json 2>&1 | tee $OUT/train_throughput.log
echo "== inference_throughput"
timeout 105 python3 benchmarks/inference_throughput.py --device cuda --preset enwik8-paper --paths fast eager --json $OUT/inference_throughput.json 2>&1 | tee $OUT/inference_throughput.log
echo "== done"
