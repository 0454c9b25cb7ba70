# Second call: the two pytest runs of run-1.sh ran side by side past their limits (the CUDA one
# printed 11 passes and no summary, the CPU one 111 of 113 passes); each again with more time.
set -o pipefail
export PYTHONUNBUFFERED=1 OUT=${OUT:?set OUT to an output folder}
mkdir -p $OUT
SITE=$(mktemp -d)  # the wheels the machine lacked, installed for this run only
python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .devwhl/*.whl
export PYTHONPATH=$PWD/src:$SITE NUMBA_CACHE_DIR=$(mktemp -d)
( timeout 300 python3 -m pytest -q -p no:cacheprovider -p no:benchmark -n 8 -rs --durations=5 tests/test_portable.py \
  tests/test_integer_kernels.py tests/test_mixing.py tests/test_matching.py tests/test_compiled.py > $OUT/pytest-cpu-2.log 2>&1; echo "rc $?" >> $OUT/pytest-cpu-2.log ) &
CPU=$!
timeout 300 python3 -m pytest -q -p no:cacheprovider -p no:benchmark -rs --durations=12 tests/test_cuda.py \
  tests/test_compress.py::test_round_trip_on_cuda tests/test_compress.py::test_cli_bf16_round_trip_records_the_cpus_features \
  tests/test_compress.py::test_cli_a_bf16_file_from_a_cpu_of_other_features_is_refused_before_decoding \
  tests/test_distributed.py::test_torchrun_with_one_process_on_cuda_matches_a_plain_run > $OUT/pytest-cuda-2.log 2>&1; echo "rc $?" >> $OUT/pytest-cuda-2.log
tail -22 $OUT/pytest-cuda-2.log
wait $CPU; tail -12 $OUT/pytest-cpu-2.log
