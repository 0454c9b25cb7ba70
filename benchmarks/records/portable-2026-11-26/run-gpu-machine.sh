# Portable files on another kind of machine: the GPU machine's Intel Xeon (AVX-512, AMX) under
# its own torch (2.11.0+cu130), decoding what an AMD EPYC (AVX2) under torch 2.13.0 wrote.
set -o pipefail
export PYTHONUNBUFFERED=1 OUT=${OUT:?set OUT to an output folder}
mkdir -p $OUT
SITE=$(mktemp -d)  # the wheels the machine lacked, installed for this run only
python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .devwhl/*.whl
export PYTHONPATH=$PWD/src:$PWD/.devsite:$SITE:$PWD/tests
{ python3 -c "import torch,sys;print(sys.version.split()[0], torch.__version__, torch.backends.cpu.get_cpu_capability(), torch.cuda.get_device_name())"; lscpu | grep "Model name"; } > $OUT/env.txt 2>&1
cat $OUT/env.txt
echo "== pytest tests/test_portable.py (the slow cross-setting test included)"
timeout 300 python3 -m pytest -q -p no:cacheprovider -o addopts="" -rs tests/test_portable.py 2>&1 | tee $OUT/pytest-portable.log | tail -15
echo "== the integer step on CUDA: the same digest?"
timeout 60 python3 - <<'PY' 2>&1 | tee $OUT/cuda-digest.log
import hashlib, torch
from test_portable import DIGEST, _patterned_model
from sharnn.models.integer_step import IntegerStep
model = _patterned_model().cuda()
step = IntegerStep(model, streams=3)
tokens = torch.tensor([10, 65, 200], device="cuda")
digest = hashlib.sha256()
for t in range(40):
    logits = step(tokens)
    probs = step.probabilities(logits)
    digest.update(logits.cpu().numpy().tobytes()); digest.update(probs.tobytes())
    tokens = torch.from_numpy(probs.argmax(1) ^ (t % 7)).cuda()
print("cuda digest", digest.hexdigest(), "equal to the CPU's:", digest.hexdigest() == DIGEST)
PY
echo "== done"
