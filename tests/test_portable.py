"""The integer step (sharnn.models.integer_step) and the portable files it writes: its
exactly specified pieces against the float functions they stand for, its results against a
digest stored here (any machine that computes other bits fails), its size against the float
step's, and files compressed under one arithmetic setting decoded under others in separate
processes (torch's CPU capability, oneDNN's instruction set, thread counts)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import llvmlite.binding as llvm
import numpy as np
import pytest
import torch
import torch.nn.functional as F

import sharnn
import spec_integer_step as spec
from helpers import SUBPROCESS_ENV, shared_run
from sharnn.coding import arithmetic, codec
from sharnn.coding.container import read_header
from sharnn.data.corpus import load_corpus
from sharnn.errors import ConfigError
from sharnn.models import exact
from sharnn.models.build import build_model
from sharnn.models.config import SHARNNConfig
from sharnn.models.integer_step import IntegerStep
from sharnn.models.step import Step, linear

ROOT = Path(__file__).resolve().parents[1]
TEXT = load_corpus("enwik8-head").test.tobytes()[:2400]  # Wikipedia's markup, as the shipped model knows

# ---------------------------------------------------------------------------- the exact pieces


def test_tables_are_the_functions_they_stand_for():
    x = torch.linspace(-20, 20, 4001)
    assert (spec.sigmoid(x) - torch.sigmoid(x)).abs().max() <= 2.5e-4  # half a step of 1/1024, slope <= 1/4
    assert (spec.tanh(x) - torch.tanh(x)).abs().max() <= 5e-4  # half a step, slope <= 1
    assert exact.sigmoid_table()[exact.SIGMOID_RANGE * exact.TABLE_RESOLUTION] == 0.5
    assert exact.tanh_table()[exact.TANH_RANGE * exact.TABLE_RESOLUTION] == 0.0
    table = exact.exp_table()
    assert table[0] == exact.EXP_ONE and table[-1] == 1 and bool((table[1:] <= table[:-1]).all())
    gaps = torch.linspace(0, 8, 1000, dtype=torch.float64)
    relative = exact.exp_weights(gaps) / exact.EXP_ONE / torch.exp(-gaps) - 1
    assert relative.abs().max() < 2.5e-3  # a gap rounded to 1/256 nat (0.2%), the weight (>= 5,629) to an integer


def test_sigmoid_and_tanh_in_one_lookup_match_the_two():
    x = torch.randn(5, 40) * 6
    both = spec.sigmoid_and_tanh(x, 30)
    assert torch.equal(both[:, :30], spec.sigmoid(x[:, :30])) and torch.equal(both[:, 30:], spec.tanh(x[:, 30:]))


def test_layer_norm_is_the_float_one_within_its_rounding():
    torch.manual_seed(0)
    for n in (8, 512, 2048):
        x = torch.randn(6, n) * torch.tensor([1e-6, 1e-3, 1.0, 3.0, 1e3, 1e5])[:, None]
        reference = F.layer_norm(x.double(), (n,), eps=1e-5).float()
        assert (spec.layer_norm(x, 1e-5) - reference).abs().max() < 2e-4  # inputs of 16 to 17 bits
    assert torch.equal(spec.layer_norm(torch.zeros(2, 16), 1e-5), torch.zeros(2, 16))  # no NaN


def test_a_product_is_exact_and_close_to_the_float_one():
    torch.manual_seed(0)
    weight, bias, x = torch.randn(300, 700), torch.randn(300), torch.randn(9, 700)
    product = spec.ExactLinear(weight, bias)
    assert product.levels * product.weight.double().abs().sum(1).max() <= exact.FP32_EXACT
    q = torch.round(x * (spec.largest_magnitude(x).reciprocal() * product.levels))
    as_integers = q.long() @ product.weight.long().T  # the exact sums
    assert torch.equal(linear(q, product.weight).long(), as_integers)
    relative = (product(x, linear) - F.linear(x, weight, bias)).norm() / F.linear(x, weight, bias).norm()
    assert relative < 0.01
    assert torch.equal(product(torch.zeros(2, 700), linear), bias.expand(2, -1))  # a zero row: no NaN


# ---------------------------------------------------------------------------- the step's results, everywhere


def _patterned_model() -> sharnn.SHARNN:
    """A small SHA-RNN whose every parameter is set by an integer formula (no random
    generator, whose streams may change between versions): the same weights everywhere."""
    config = SHARNNConfig(d_model=32, n_layers=2, boom_dim=64, attention_span=16)
    model = build_model(config).eval()
    with torch.no_grad():
        for index, parameter in enumerate(model.parameters()):
            k = torch.arange(parameter.numel(), dtype=torch.int64) * 7919 + index * 104729
            values = ((k % 2001) - 1000).double() * 2.0**-11  # in [-0.49, 0.49], exact
            parameter.copy_(values.view(parameter.shape) + (1.0 if parameter.dim() == 1 and index % 3 == 2 else 0.0))
    return model


DIGEST = "00a01e1e51f45ae76476050775c86adc71132db89efced7d2f594e52473c3113"


def _step_digest(model) -> str:
    step = IntegerStep(model, streams=3)
    tokens = torch.tensor([10, 65, 200])
    digest = hashlib.sha256()
    for t in range(40):  # past the span: the ring wraps
        logits = step(tokens)
        probs = step.probabilities(logits)
        digest.update(logits.numpy().tobytes())
        digest.update(probs.tobytes())
        tokens = torch.from_numpy(probs.argmax(1) ^ (t % 7))
    return digest.hexdigest()


def test_the_integer_step_computes_the_same_bits_as_on_the_machines_it_was_written_on():
    """The digest of a fixed model's logits and probabilities over 40 positions. Recorded on
    an AMD EPYC (AVX2, torch 2.13.0); a machine that computes any other bit fails here."""
    assert _step_digest(_patterned_model()) == DIGEST


def test_the_integer_step_is_the_float_step_within_its_rounding(tmp_path_factory):
    """On a trained model: probabilities within 0.01 of the float step's, and the bits of
    a text within 1% of the float step's."""
    model = sharnn.load(shared_run(tmp_path_factory)).model
    data = np.frombuffer(TEXT, dtype=np.uint8)
    streams = 4
    rows = len(data) // streams
    grid = torch.from_numpy(data[: rows * streams].reshape(streams, rows).T.astype(np.int64))
    integer, float_step = IntegerStep(model, streams), Step(model, streams)
    bits = {"integer": 0.0, "fp32": 0.0}
    tokens = torch.full((streams,), 10)
    for t in range(rows):
        p_int = integer.probabilities(integer(tokens))
        p_float = arithmetic.probabilities(float_step(tokens))
        assert np.abs(p_int - p_float).max() < 0.01
        chosen = grid[t].numpy()
        bits["integer"] -= np.log2(p_int[np.arange(streams), chosen]).sum()
        bits["fp32"] -= np.log2(p_float[np.arange(streams), chosen]).sum()
        tokens = grid[t]
    assert bits["integer"] <= 1.01 * bits["fp32"], bits


# ---------------------------------------------------------------------------- files across settings


@pytest.mark.slow  # a few seconds: out of the working loop
def test_a_portable_file_from_another_machine_decodes_here_byte_for_byte():
    """tests/data/v5-shipped.shz was compressed by the shipped model, mixed with its context
    models (3 streams, 1 thread) on an AMD EPYC with AVX2 under torch 2.13.0: whatever
    machine runs this decodes it. Format 5, before line ends were folded: its CRs (17 of its
    34 line ends are CRLF) were coded as they are, and its header reads as nothing folded."""
    blob = (ROOT / "tests" / "data" / "v5-shipped.shz").read_bytes()
    header = read_header(blob)[0]
    assert header.portable and header.environment["cpu_capability"] == "AVX2" and header.environment["threads"] == 1
    assert header.mixing == 1 and int.from_bytes(blob[8:10], "little") == 5 and header.crlf == 0
    original = (ROOT / "tests" / "data" / "v5-shipped.txt").read_bytes()
    assert original.count(b"\r\n") == 17 and codec.decompress(blob, sharnn.load().model) == original


SETTINGS = {  # name: (environment variables, decompress's --threads): each unlike the encoders' in some way
    "capability default, 4 threads": ({"ATEN_CPU_CAPABILITY": "default"}, 4),
    "onednn sse41, 1 thread": ({"ONEDNN_MAX_CPU_ISA": "SSE41"}, 1),
    "capability avx2, 3 threads": ({"ATEN_CPU_CAPABILITY": "avx2"}, 3),
}
# Asking torch for more than the CPU has kills it (SIGILL): AVX-512 only where the CPU has it.
if torch.backends.cpu.get_cpu_capability().startswith("AVX512"):
    SETTINGS["capability avx512, 2 threads"] = ({"ATEN_CPU_CAPABILITY": "avx512"}, 2)
# The kernels compiled for another CPU than this one (numba's target; the encoders' is the
# host's): x86-64 without any vector extension past SSE2, and, where this CPU has AVX-512,
# AVX2 without it (NUMBA_CPU_FEATURES unset: the named CPU's own).
SETTINGS["numba generic, 2 threads"] = ({"NUMBA_CPU_NAME": "generic"}, 2)
if llvm.get_host_cpu_features().get("avx512f", False):
    SETTINGS["numba haswell, 1 thread"] = ({"NUMBA_CPU_NAME": "haswell"}, 1)


def _sharnn(*args, env: dict) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "sharnn", *map(str, args)],
        env=SUBPROCESS_ENV | env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(process: subprocess.Popen, what: str) -> None:
    out, err = process.communicate(timeout=600)
    assert process.returncode == 0, f"{what}: {err.strip().splitlines()[-1:] or out}"


@pytest.mark.slow
def test_a_portable_file_decodes_byte_for_byte_under_every_setting(tmp_path):
    """Files compressed by the shipped model (mixed with adaptive context models, the
    default) in separate processes under two settings (Wikipedia's markup and a novel's
    CRLF prose), each decoded in separate processes under every setting of
    :data:`SETTINGS`: byte for byte, every time."""
    sources = {"wikipedia": TEXT[:1200], "prose": (ROOT / "benchmarks/data/canterbury/alice29.txt").read_bytes()[:1000]}
    encodings = {"wikipedia": {"ONEDNN_MAX_CPU_ISA": "SSE41", "ATEN_CPU_CAPABILITY": "default"}, "prose": {}}
    for name, data in sources.items():
        (tmp_path / name).write_bytes(data)
    started = [
        _sharnn("compress", tmp_path / name, "-o", tmp_path / f"{name}.shz", "--streams", 4, "--threads", 2, env=env)
        for name, env in encodings.items()
    ]
    for process, name in zip(started, encodings):
        _finish(process, f"compress {name}")
    for name in sources:
        header = read_header((tmp_path / f"{name}.shz").read_bytes())[0]
        assert header.portable and header.precision == "integer" and header.storage == "coded"
        assert header.mixing == arithmetic.DEFAULT_MIXING  # the default: the model mixed with context models, exact
    for number, (setting, (env, threads)) in enumerate(SETTINGS.items()):
        if "NUMBA_CPU_NAME" in env:  # kernels for another CPU: cached apart, not beside the package
            env = env | {"NUMBA_CACHE_DIR": str(tmp_path / f"numba-{number}")}
        running = {}
        for name in sources:
            out = tmp_path / f"{name}-{number}"
            command = ("decompress", tmp_path / f"{name}.shz", "-o", out, "--quiet", "--threads", threads)
            running[name, out] = _sharnn(*command, env=env)
        for (name, out), process in running.items():
            _finish(process, f"decompress {name} under {setting}")
            assert out.read_bytes() == sources[name], f"{name} under {setting}"


def test_a_float_file_keeps_its_thread_count_and_a_portable_one_takes_any(tmp_path_factory):
    model = sharnn.load(shared_run(tmp_path_factory)).model
    portable = codec.compress(TEXT[:300], model, streams=2)
    assert codec.decompress(portable, model, threads=3) == TEXT[:300]
    float_file = codec.compress(TEXT[:300], model, streams=2, precision="fp32")
    assert codec.decompress(float_file, model, threads=1) == TEXT[:300]
    with pytest.raises(ConfigError, match="coded in fp32, not portable: it decodes with the 1 thread"):
        codec.decompress(float_file, model, threads=2)
    for wrong in (0, 2.5, "2"):
        with pytest.raises(ConfigError, match="threads must be an integer between 1 and 1024"):
            codec.decompress(portable, model, threads=wrong)


@pytest.mark.slow  # a few seconds: out of the working loop
def test_the_settings_are_real_ones():
    """Each environment variable of :data:`SETTINGS` is one torch or oneDNN reads (a typo
    would test nothing): the capability a child process reports follows it."""
    code = "import torch; print(torch.backends.cpu.get_cpu_capability())"
    reported = {
        value: subprocess.run(
            [sys.executable, "-c", code],
            env=os.environ | {"ATEN_CPU_CAPABILITY": value},
            capture_output=True,
            text=True,
        ).stdout.strip()
        for value in ("default", "avx2")
    }
    assert reported == {"default": "DEFAULT", "avx2": "AVX2"}


NUMBA_VECTOR_CODE = """
import re, numba
@numba.njit("float64(float64[::1])")
def squares(x):
    total = 0.0
    for value in x:
        total += value * value
    return total
print(" ".join(sorted(set(re.findall(r"^\\s+(v[a-z]+)\\s", squares.inspect_asm(squares.signatures[0]), re.M)))))
"""


@pytest.mark.slow  # a few seconds: out of the working loop
def test_numba_compiles_for_the_cpu_it_is_told():
    """``NUMBA_CPU_NAME`` is read: a kernel compiled for ``generic`` (x86-64, SSE2) has no
    AVX instruction (``v...``), one compiled for this CPU has them where it has AVX."""

    def instructions(**env) -> set[str]:
        command = [sys.executable, "-c", NUMBA_VECTOR_CODE]
        done = subprocess.run(command, env=os.environ | env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return set(done.stdout.split())

    assert not instructions(NUMBA_CPU_NAME="generic")
    if llvm.get_host_cpu_features().get("avx", False):
        assert instructions()
