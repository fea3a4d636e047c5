#!/usr/bin/env python3
"""Self test of the python reference side; run before trusting the oracle.

    /usr/bin/python3 python/selftest_oracle.py

Checks, all on CPU in a few seconds:
  - safetensors_lite: every dtype round-trips, bf16 rounds to nearest even like torch does,
    metadata survives, malformed files are refused with the file named;
  - ModelConfig: parameter count formula and ff_dim rule against the instantiated model;
  - oracle_grads.py end to end (files in, files out, in a subprocess) against a second, in-process
    pass with torch.autograd.grad on a fresh model, for gpt2 tied/untied and llama MHA/GQA;
  - oracle_grads.py refuses missing, extra and misshapen weights and unknown config fields;
  - grouped-query attention equals full attention with each k/v head repeated for its group;
  - hf_gpt2_fixture.py: the HF-layout checkpoint mapped to Starling names gives the HF loss.
Exit status 0 when everything passes.
"""

import dataclasses
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
# Tests run these scripts from the source tree; keep it free of __pycache__.
sys.dont_write_bytecode = True
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402
import torch  # noqa: E402

import reference_model as rm  # noqa: E402
import safetensors_lite as st  # noqa: E402

FAILURES = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        FAILURES.append(what)


def test_safetensors(tmp):
    path = os.path.join(tmp, "all.safetensors")
    rng = np.random.default_rng(0)
    tensors = {
        "f64": rng.standard_normal((2, 3)),
        "f32": rng.standard_normal((4,)).astype(np.float32),
        "f16": rng.standard_normal((3, 1)).astype(np.float16),
        "i64": np.arange(6, dtype=np.int64).reshape(2, 3) - 3,
        "i32": np.array([-(2**31), 2**31 - 1], dtype=np.int32),
        "i16": np.array([-7], dtype=np.int16),
        "i8": np.array([-128, 127], dtype=np.int8),
        "u8": np.array([0, 255], dtype=np.uint8),
        "bool": np.array([True, False]),
        "scalar": np.array(2.5, dtype=np.float32),
        "empty": np.zeros((0, 4), dtype=np.float32),
        "bf16": rng.standard_normal((5, 2)).astype(np.float32),
    }
    st.save(path, tensors, {"format": "pt", "note": "x"}, dtypes={"bf16": "BF16"})
    d = st.read(path)
    check(d.metadata == {"format": "pt", "note": "x"}, "safetensors: metadata round-trips")
    check(list(d.tensors) == list(tensors), "safetensors: order kept")
    same = all(np.array_equal(d.tensors[k], v) and d.tensors[k].dtype == v.dtype
               for k, v in tensors.items() if k != "bf16")
    check(same, "safetensors: F64 F32 F16 I64 I32 I16 I8 U8 BOOL, scalar and empty round-trip")
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
    check((8 + n) % 8 == 0, "safetensors: data starts 8-byte aligned")

    # bf16: torch's float32 -> bfloat16 conversion rounds to nearest even; ours must agree bit
    # for bit, including halfway cases, overflow to inf, infinities and NaN.
    special = np.array([1.0, 1.0 + 2**-8, 1.0 + 3 * 2**-8, -1.0 - 2**-8, 3.4e38, np.inf,
                        -np.inf, 0.0, -0.0, 1e-40, np.nan], dtype=np.float32)
    values = np.concatenate([special, rng.standard_normal(1000).astype(np.float32) * 100])
    ours = st.f32_to_bf16_bits(values)
    theirs = torch.from_numpy(values).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    finite = ~np.isnan(values)
    check(np.array_equal(ours[finite], theirs[finite]), "bf16: rounding matches torch bit for bit")
    check(bool(np.isnan(st.bf16_bits_to_f32(ours[~finite])).all()), "bf16: NaN stays NaN")
    check(np.array_equal(d.tensors["bf16"], st.bf16_bits_to_f32(st.f32_to_bf16_bits(
        tensors["bf16"]))) and d.dtypes["bf16"] == "BF16", "bf16: file round trip")

    tpath = os.path.join(tmp, "torch.safetensors")
    src = {"a": torch.randn(3, 2).to(torch.bfloat16), "b": torch.randn(2).half(),
           "c": torch.arange(4)}
    st.save_torch(tpath, src)
    back, _ = st.load_torch(tpath)
    check(all(back[k].dtype == v.dtype and torch.equal(back[k], v) for k, v in src.items()),
          "torch helpers: bf16, f16, i64 round-trip with dtypes kept")

    blob = open(path, "rb").read()
    bad = os.path.join(tmp, "bad.safetensors")
    for what, data in [("truncated data", blob[:-3]), ("short file", blob[:5]),
                       ("header length beyond file", (10**6).to_bytes(8, "little") + blob[8:]),
                       ("malformed JSON", blob[:8] + b"{" * n + blob[8 + n:])]:
        with open(bad, "wb") as f:
            f.write(data)
        try:
            st.read(bad)
            check(False, f"safetensors: refuses {what}")
        except st.SafetensorsError as e:
            check(bad in str(e), f"safetensors: refuses {what} naming the file")


def test_config():
    cases = [rm.preset(n) for n in ("gpt2-tiny", "gpt2-mini", "llama-tiny", "llama-mini")]
    cases.append(dataclasses.replace(rm.preset("gpt2-tiny"), tie_embeddings=False))
    cases.append(dataclasses.replace(rm.preset("llama-tiny"), tie_embeddings=True, d_ff=200))
    for c in cases:
        n = sum(p.numel() for p in rm.ReferenceModel(c).parameters())
        check(n == c.num_params(), f"num_params {c.name} tie={c.tie_embeddings}: {n}")
    llama = rm.ModelConfig(arch="llama")
    ff = {d: dataclasses.replace(llama, d_model=d).ff_dim for d in (128, 256, 768, 4096)}
    # 4096 -> 10944, not LLaMA-7B's 11008 (which rounds to 256 and is set explicitly in its preset).
    check(ff == {128: 384, 256: 704, 768: 2048, 4096: 10944}, f"llama ff_dim rule {ff}")
    check(rm.ModelConfig().ff_dim == 512, "gpt2 ff_dim = 4*d_model")
    try:
        rm.ModelConfig(arch="gpt2", n_kv_head=2).validate()
        check(False, "validate refuses GQA for gpt2")
    except ValueError:
        check(True, "validate refuses GQA for gpt2")


def oracle_cases():
    def small(name, **kw):
        c = rm.preset(name)
        return dataclasses.replace(c, n_layer=2, seq_len=16, **kw)

    return {
        "gpt2 tied": small("gpt2-tiny"),
        "gpt2 untied": small("gpt2-tiny", tie_embeddings=False),
        "llama gqa": small("llama-tiny"),
        "llama mha": small("llama-tiny", n_kv_head=0),
    }


def random_weights(cfg, seed):
    """Reference init plus noise on gains and biases, so none of them is a trivial 1 or 0."""
    model = rm.ReferenceModel(cfg, seed=seed)
    g = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for _, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn(p.shape, generator=g))
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def write_inputs(tmp, cfg, weights, seed, cfg_json=None):
    paths = {k: os.path.join(tmp, k + ext) for k, ext in
             [("weights", ".safetensors"), ("batch", ".safetensors"), ("config", ".json"),
              ("out", ".safetensors")]}
    st.save_torch(paths["weights"], weights)
    g = torch.Generator().manual_seed(seed)
    seq = torch.randint(cfg.vocab_size, (3, cfg.seq_len + 1), generator=g)
    batch = {"tokens": seq[:, :-1].contiguous(), "targets": seq[:, 1:].contiguous()}
    st.save_torch(paths["batch"], batch)
    with open(paths["config"], "w") as f:
        json.dump(cfg.to_json() if cfg_json is None else cfg_json, f)
    return paths, batch


def run_oracle(paths):
    cmd = [sys.executable, os.path.join(HERE, "oracle_grads.py")]
    for k in ("weights", "batch", "config", "out"):
        cmd += ["--" + k, paths[k]]
    return subprocess.run(cmd, capture_output=True, text=True)


def test_oracle(tmp):
    for i, (label, cfg) in enumerate(oracle_cases().items()):
        weights = random_weights(cfg, seed=10 + i)
        paths, batch = write_inputs(tmp, cfg, weights, seed=20 + i)
        r = run_oracle(paths)
        if r.returncode != 0:
            check(False, f"oracle {label}: exit {r.returncode}: {r.stderr.strip()}")
            continue
        out, meta = st.load_torch(paths["out"])

        # Second pass: a fresh model from the same weight file, gradients by torch.autograd.grad.
        model = rm.ReferenceModel(cfg)
        rm.load_weights(model, st.load_torch(paths["weights"])[0])
        names, params = zip(*model.named_parameters())
        loss = model(batch["tokens"], batch["targets"])
        grads = torch.autograd.grad(loss, params)

        expect = {"loss"} | {"grad." + n for n in names}
        check(set(out) == expect, f"oracle {label}: output names are loss + grad.<every param>")
        check(out["loss"].shape == () and out["loss"].dtype == torch.float32,
              f"oracle {label}: loss is an F32 scalar")
        check(abs(out["loss"].item() - loss.item()) <= 1e-6,
              f"oracle {label}: loss {out['loss'].item():.6f} matches {loss.item():.6f}")
        worst = max((out["grad." + n] - g).abs().max().item() for n, g in zip(names, grads))
        close = all(torch.allclose(out["grad." + n], g, rtol=1e-6, atol=1e-9)
                    for n, g in zip(names, grads))
        check(close, f"oracle {label}: {len(names)} gradients match (max diff {worst:.2e})")
        nonzero = all(g.abs().max() > 0 for g in grads)
        check(nonzero, f"oracle {label}: every gradient is non-zero")


def test_oracle_refuses(tmp):
    cfg = oracle_cases()["gpt2 tied"]
    good = random_weights(cfg, seed=1)
    cases = {
        "a missing weight": (dict(list(good.items())[1:]), None, "missing: embed.tok.weight"),
        "an extra weight": ({**good, "head.weight": good["embed.tok.weight"]}, None,
                            "unexpected: head.weight"),
        "a misshapen weight": ({**good, "final_norm.bias": torch.zeros(3)}, None,
                               "final_norm.bias: shape [3]"),
        "an unknown config field": (good, {**cfg.to_json(), "d_modle": 3}, "d_modle"),
        "a missing config field": (good, {k: v for k, v in cfg.to_json().items()
                                          if k != "rope_theta"}, "rope_theta"),
    }
    for what, (weights, cfg_json, needle) in cases.items():
        paths, _ = write_inputs(tmp, cfg, weights, seed=0, cfg_json=cfg_json)
        if os.path.exists(paths["out"]):
            os.remove(paths["out"])
        r = run_oracle(paths)
        check(r.returncode == 1 and needle in r.stderr and not os.path.exists(paths["out"]),
              f"oracle refuses {what}: {r.stderr.strip()[:110]}")


def test_gqa():
    """GQA with kv heads k_j equals MHA whose head i uses k_{i // group}: checks the grouping."""
    gqa_cfg = dataclasses.replace(rm.preset("llama-tiny"), n_layer=1, seq_len=8)  # 4 heads, 2 kv
    mha_cfg = dataclasses.replace(gqa_cfg, n_kv_head=0)
    w = random_weights(gqa_cfg, seed=3)
    hd, h, kv = gqa_cfg.head_dim, gqa_cfg.n_head, gqa_cfg.kv_heads
    qkv = w["layers.0.attn.qkv.weight"]
    q, k, v = qkv.split([h * hd, kv * hd, kv * hd])
    rep = lambda t: t.view(kv, hd, -1).repeat_interleave(h // kv, 0).reshape(h * hd, -1)  # noqa
    mha_w = {**w, "layers.0.attn.qkv.weight": torch.cat([q, rep(k), rep(v)])}
    tokens = torch.randint(gqa_cfg.vocab_size, (2, 8), generator=torch.Generator().manual_seed(0))
    losses = []
    for cfg, weights in ((gqa_cfg, w), (mha_cfg, mha_w)):
        m = rm.ReferenceModel(cfg)
        rm.load_weights(m, weights)
        losses.append(m(tokens, tokens).item())
    check(abs(losses[0] - losses[1]) < 1e-6, f"GQA equals repeated-head MHA ({losses})")


def test_hf_fixture(tmp):
    out = os.path.join(tmp, "hf")
    r = subprocess.run([sys.executable, os.path.join(HERE, "hf_gpt2_fixture.py"), "--out-dir",
                        out, "--prefix", "transformer.", "--attn-buffers", "--lm-head", "--check"],
                       capture_output=True, text=True)
    check(r.returncode == 0, f"hf fixture: HF loss equals mapped reference loss {r.stderr.strip()}")
    d = st.read(os.path.join(out, "model.safetensors"))
    check(d.metadata == {"format": "pt"} and
          tuple(d.tensors["transformer.h.0.attn.c_attn.weight"].shape) == (64, 192),
          "hf fixture: Conv1D layout [d, 3d] and format metadata")


def main():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="starling-selftest-") as tmp:
        test_safetensors(tmp)
        test_config()
        test_oracle(tmp)
        test_oracle_refuses(tmp)
        test_gqa()
        test_hf_fixture(tmp)
    print(f"\n{len(FAILURES)} failure(s)" if FAILURES else "\nall checks passed")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
