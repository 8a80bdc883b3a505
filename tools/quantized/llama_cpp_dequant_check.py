#!/usr/bin/python3
"""Holds kvrm's quantized-checkpoint fixtures to llama.cpp's own dequantization.

llama.cpp's converter (convert_hf_to_gguf.py, conversion/base.py: ModelBase.dequant_model)
unpacks GPTQ (dequant_gptq) and compressed-tensors pack-quantized (dequant_packed) checkpoints
into float weights. This script runs that code, unchanged, on checkpoints written by
`make_model --quantize=... --quantize_out=Q --quantize_twin_out=T` and checks that every weight
it yields equals the float32 twin T (the values kvrm's loader is held to by
//tests:quantized_checkpoint_test), exactly.

Needs Debian's python3-torch and python3-numpy (apt) and a llama.cpp source tree; not run by CI
(torch is 230 packages). Usage:

  /usr/bin/python3 tools/quantized/llama_cpp_dequant_check.py LLAMA_CPP_DIR Q T [Q T ...]
"""
import __future__
import inspect
import json
import struct
import sys
import textwrap
import types

import numpy as np
import torch


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    types_ = {"F32": np.float32, "F16": np.float16, "I32": np.int32, "I64": np.int64}
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        if e["dtype"] == "BF16":
            raw = np.frombuffer(data[b:end], dtype=np.uint16).astype(np.uint32) << 16
            arr = raw.view(np.float32)
            t = torch.from_numpy(arr.copy()).reshape(e["shape"]).to(torch.bfloat16)
        else:
            arr = np.frombuffer(data[b:end], dtype=types_[e["dtype"]]).copy()
            t = torch.from_numpy(arr).reshape(e["shape"])
        out[name] = t
    return out


def llama_cpp_dequantized(model_base, quantized_dir):
    with open(quantized_dir + "/config.json") as f:
        hparams = json.load(f)
    tensors = read_safetensors(quantized_dir + "/model.safetensors")
    # torch 1.13 indexes with int64 tensors only (newer torch also takes the file's int32).
    for name in tensors:
        if name.endswith("g_idx"):
            tensors[name] = tensors[name].long()
    fake = types.SimpleNamespace(
        _is_nvfp4=False, _fp8_as_q8=False, _fp8_dequantized=set(), lazy=False,
        hparams=hparams, model_tensors={k: (lambda v=v: v) for k, v in tensors.items()})
    model_base.dequant_model(fake)
    return {k: gen() for k, gen in fake.model_tensors.items()}


def main(argv):
    llama_cpp = argv[1]
    sys.modules["transformers"] = types.SimpleNamespace(AutoConfig=None)  # only imported
    # Debian 12's torch (1.13) predates the float8 dtypes the module's tables name at import;
    # stand-ins keep them importable (no tensor here is float8).
    for name in ("float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu", "float8_e4m3fnuz",
                 "float8_e5m2fnuz", "uint16", "uint32", "uint64"):
        if not hasattr(torch, name):
            setattr(torch, name, object())
    sys.path[:0] = [llama_cpp, llama_cpp + "/gguf-py"]
    import conversion.base as base  # noqa: E402
    # And its dtype.itemsize (torch 2.1): the same number as element_size(). dequant_model is
    # compiled again from its own source with that one substitution, in its own module.
    source = textwrap.dedent(inspect.getsource(base.ModelBase.dequant_model))
    assert source.count("qweight.dtype.itemsize") == 1
    source = source.replace("qweight.dtype.itemsize", "qweight.element_size()")
    namespace = {}
    flags = __future__.annotations.compiler_flag  # as base.py compiles itself
    exec(compile(source, base.__file__, "exec", flags, True), base.__dict__, namespace)
    ModelBase = types.SimpleNamespace(dequant_model=namespace["dequant_model"])
    failures = 0
    for quantized, twin in zip(argv[2::2], argv[3::2]):
        got = llama_cpp_dequantized(ModelBase, quantized)
        want = read_safetensors(twin + "/model.safetensors")
        checked = worst = 0
        for name, w in want.items():
            if name not in got:
                print(f"{quantized}: llama.cpp yields no {name}")
                failures += 1
                continue
            g = got[name].float()
            if tuple(g.shape) != tuple(w.shape):
                print(f"{quantized}: {name} shape {tuple(g.shape)} != {tuple(w.shape)}")
                failures += 1
                continue
            diff = (g - w.float()).abs().max().item()
            worst = max(worst, diff)
            checked += 1
            if diff != 0:
                failures += 1
                print(f"{quantized}: {name} differs by up to {diff}")
        print(f"{quantized}: {checked} tensors, max |llama.cpp - twin| = {worst}")
    print("FAILED" if failures else "OK: every weight equal")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
