# GPU checks for this session, in priority order; each step bounded, logs to $OUT.
set -o pipefail
export PYTHONUNBUFFERED=1 OUT=${OUT:?set OUT to an output folder}
mkdir -p $OUT
SITE=$(mktemp -d)  # the wheels the machine lacked, installed for this run only
python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .devwhl/*.whl
export PYTHONPATH=$PWD/src:$PWD/.devsite:$SITE
START=$(date +%s)
left() { echo $(( ${BUDGET:-540} - ($(date +%s) - START) )); }
{ nvidia-smi -L; python3 -c "import torch,sys;print(sys.version.split()[0], torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'no cuda')"; lscpu | grep -E "Model name|Flags" | sed 's/Flags:.*\(avx512_bf16\|amx_bf16\).*/Flags: has \1/' ; } > $OUT/env.txt 2>&1
cat $OUT/env.txt | head -4
echo "== pytest $(left)"
timeout 150 python3 -m pytest -q -p no:cacheprovider -rs tests/test_cuda.py \
  tests/test_compress.py::test_round_trip_on_cuda tests/test_compress.py::test_cli_bf16_round_trip_records_the_cpus_features \
  tests/test_distributed.py::test_torchrun_with_one_process_on_cuda_matches_a_plain_run 2>&1 | tee $OUT/pytest.log | tail -25
echo "== check_fast_path $(left)"
timeout $(( $(left) - 200 )) python3 benchmarks/check_fast_path.py --device ${DEV:-cuda} --json $OUT/check_fast_path.json $CFP 2>&1 | tee $OUT/check_fast_path.log | tail -30
echo "== train_throughput $(left)"
timeout $(( $(left) - 80 )) python3 benchmarks/train_throughput.py --device ${DEV:-cuda} --presets ${PRE:-enwik8-paper} --streams 16 64 --json $OUT/train_throughput.json 2>&1 | tee $OUT/train_throughput.log | tail -20
echo "== inference_throughput $(left)"
timeout $(( $(left) - 5 )) python3 benchmarks/inference_throughput.py --device ${DEV:-cuda} --preset ${PRE:-enwik8-paper} --json $OUT/inference_throughput.json 2>&1 | tee $OUT/inference_throughput.log | tail -20
echo "== done $(left)"
