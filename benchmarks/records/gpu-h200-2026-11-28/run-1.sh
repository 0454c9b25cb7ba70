# GPU call of 2026-11-28: the CUDA checks, the coder's bits on this machine's CPU kind (mixing 3,
# the bit stage, changed since the last record: its digests were written on an AMD Zen 5), the
# fast path against eager, and inference speed (the H100 record's one-stream generation puzzle).
set -o pipefail
export PYTHONUNBUFFERED=1 OUT=${OUT:?set OUT to an output folder}
mkdir -p $OUT
SITE=$(mktemp -d)  # the wheels the machine lacked, installed for this run only
python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .whl/*.whl
export PYTHONPATH=$PWD/src:$SITE NUMBA_CACHE_DIR=$(mktemp -d)
START=$(date +%s)
left() { echo $(( ${BUDGET:-470} - ($(date +%s) - START) )); }
{ nvidia-smi -L; python3 -c "import torch,numpy,numba,sys;print(sys.version.split()[0], 'torch', torch.__version__, 'numpy', numpy.__version__, 'numba', numba.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'no cuda'); import llvmlite.binding as b; print('numba target', b.get_host_cpu_name())"; lscpu | grep -E "^Model name|^CPU\(s\)"; grep -o -w -E "avx2|avx512f|avx512_vnni|avx512_bf16|amx_bf16|amx_int8" /proc/cpuinfo | sort -u | tr '\n' ' '; echo; } > $OUT/env.txt 2>&1
cat $OUT/env.txt
echo "== CPU kind: the coder's and the compiled core's bits (background) $(left)"
( timeout 330 python3 -m pytest -q -p no:cacheprovider -p no:benchmark -n 8 -rs --durations=5 tests/test_bitwise.py \
  tests/test_mixing.py tests/test_matching.py tests/test_portable.py tests/test_integer_kernels.py tests/test_compiled.py \
  > $OUT/pytest-cpu.log 2>&1; echo "rc $?" >> $OUT/pytest-cpu.log ) &
CPU=$!
echo "== CUDA tests $(left)"
timeout 200 python3 -m pytest -q -p no:cacheprovider -p no:benchmark -rs --durations=12 tests/test_cuda.py \
  tests/test_compress.py::test_round_trip_on_cuda tests/test_compress.py::test_cli_bf16_round_trip_records_the_cpus_features \
  tests/test_compress.py::test_cli_a_bf16_file_from_a_cpu_of_other_features_is_refused_before_decoding \
  tests/test_distributed.py::test_torchrun_with_one_process_on_cuda_matches_a_plain_run > $OUT/pytest-cuda.log 2>&1; echo "rc $?" >> $OUT/pytest-cuda.log
tail -16 $OUT/pytest-cuda.log
echo "== inference_throughput $(left)"
timeout 140 python3 benchmarks/inference_throughput.py --device cuda --preset enwik8-paper --paths fast eager \
  --eval-streams 64 --json $OUT/inference_throughput.json 2>&1 | tee $OUT/inference_throughput.log | tail -18
wait $CPU; tail -10 $OUT/pytest-cpu.log
echo "== check_fast_path $(left)"
timeout $(( $(left) - 5 )) python3 benchmarks/check_fast_path.py --device cuda --json $OUT/check_fast_path.json 2>&1 | tee $OUT/check_fast_path.log | tail -8
gzip -f $OUT/check_fast_path.json 2>/dev/null
echo "== done $(left)"
