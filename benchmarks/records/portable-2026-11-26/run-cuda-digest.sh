export PYTHONPATH=$PWD/src:$PWD/.devsite:$SITE:$PWD/tests
SITE=$(mktemp -d)  # the wheels the machine lacked, installed for this run only
python3 -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .devwhl/*.whl
timeout 90 python3 - <<'PY' 2>&1 | tail -5 | tee $OUT/cuda-digest.log
import hashlib, torch
from test_portable import DIGEST, _patterned_model, _step_digest
from sharnn.models.integer_step import IntegerStep
print("cpu digest equal:", _step_digest(_patterned_model()) == DIGEST)
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
