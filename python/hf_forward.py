#!/usr/bin/env python3
"""Logits of a Hugging Face checkpoint directory, computed the way transformers computes them.

    hf_forward.py --model-dir DIR --batch B.safetensors --out LOGITS.safetensors

Reads DIR/config.json (model_type "gpt2" or "llama") and DIR/model.safetensors in the official
names and layouts, runs the batch's "tokens" (I64 [B, T]) through a forward written from
transformers' GPT2LMHeadModel and LlamaForCausalLM, and writes "logits" (F32 [B, T, V]) and
"loss" (F32 [], mean cross-entropy against the batch's "targets").

It is independent of Starling's C++ and of reference_model.py: it reads HF's names and applies
HF's conventions itself (GPT-2: Conv1D weights x @ W + b, gelu_new, learned positions; LLaMA:
separate q/k/v/o and gate/up/down projections, RMSNorm, rotate-half rotary embeddings with
inv_freq = theta^(-2i/head_dim) and cos/sin of cat(freqs, freqs), key/value heads repeated for
consecutive query heads (repeat_kv), SiLU-gated MLP, lm_head or the tied embedding). A test of
Starling's export compares these logits with Starling's own.
"""

import argparse
import json
import math
import os
import sys

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import safetensors_lite as st  # noqa: E402


def causal_attention(q, k, v):
    """q, k, v: [B, H, T, hd]. Softmax attention with a causal mask, as eager attention does."""
    T, hd = q.shape[2], q.shape[3]
    s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(hd)
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    s = s.masked_fill(~mask, torch.finfo(s.dtype).min)
    return torch.matmul(s.softmax(dim=-1), v)


def gpt2_logits(cfg, w, tokens):
    B, T = tokens.shape
    w = {(k[len("transformer."):] if k.startswith("transformer.") else k): v for k, v in w.items()}
    d, nh, eps = cfg["n_embd"], cfg["n_head"], cfg["layer_norm_epsilon"]
    hd = d // nh
    x = w["wte.weight"][tokens] + w["wpe.weight"][torch.arange(T)]
    for i in range(cfg["n_layer"]):
        p = f"h.{i}."
        a = F.layer_norm(x, (d,), w[p + "ln_1.weight"], w[p + "ln_1.bias"], eps)
        qkv = a @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]
        q, k, v = (t.view(B, T, nh, hd).transpose(1, 2) for t in qkv.split(d, dim=2))
        y = causal_attention(q, k, v).transpose(1, 2).reshape(B, T, d)
        x = x + y @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
        m = F.layer_norm(x, (d,), w[p + "ln_2.weight"], w[p + "ln_2.bias"], eps)
        h = m @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"]
        h = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * h.pow(3))))
        x = x + h @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
    x = F.layer_norm(x, (d,), w["ln_f.weight"], w["ln_f.bias"], eps)
    head = w["wte.weight"] if cfg.get("tie_word_embeddings", True) else w["lm_head.weight"]
    return x @ head.t()


def rms_norm(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def llama_logits(cfg, w, tokens):
    B, T = tokens.shape
    d, nh, nkv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or d // nh
    eps = cfg["rms_norm_eps"]
    inv_freq = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    freqs = torch.outer(torch.arange(T, dtype=torch.float32), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    x = w["model.embed_tokens.weight"][tokens]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        a = rms_norm(x, w[p + "input_layernorm.weight"], eps)
        q = (a @ w[p + "self_attn.q_proj.weight"].t()).view(B, T, nh, hd).transpose(1, 2)
        k = (a @ w[p + "self_attn.k_proj.weight"].t()).view(B, T, nkv, hd).transpose(1, 2)
        v = (a @ w[p + "self_attn.v_proj.weight"].t()).view(B, T, nkv, hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = nh // nkv  # repeat_kv: each key/value head serves `rep` consecutive query heads
        k = k[:, :, None].expand(B, nkv, rep, T, hd).reshape(B, nh, T, hd)
        v = v[:, :, None].expand(B, nkv, rep, T, hd).reshape(B, nh, T, hd)
        y = causal_attention(q, k, v).transpose(1, 2).reshape(B, T, nh * hd)
        x = x + y @ w[p + "self_attn.o_proj.weight"].t()
        m = rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        gate = m @ w[p + "mlp.gate_proj.weight"].t()
        up = m @ w[p + "mlp.up_proj.weight"].t()
        x = x + (F.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].t()
    x = rms_norm(x, w["model.norm.weight"], eps)
    head = (w["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings", False)
            else w["lm_head.weight"])
    return x @ head.t()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--batch", required=True, help="safetensors with tokens and targets (I64)")
    ap.add_argument("--out", required=True, help="safetensors to write logits and loss into")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    with open(os.path.join(a.model_dir, "config.json")) as f:
        cfg = json.load(f)
    w, _ = st.load_torch(os.path.join(a.model_dir, "model.safetensors"))
    b, _ = st.load_torch(a.batch)
    forward = {"gpt2": gpt2_logits, "llama": llama_logits}.get(cfg.get("model_type"))
    if forward is None:
        print(f"hf_forward: model_type {cfg.get('model_type')!r} is neither gpt2 nor llama",
              file=sys.stderr)
        return 1
    with torch.no_grad():
        logits = forward(cfg, w, b["tokens"])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), b["targets"].reshape(-1))
    st.save_torch(a.out, {"logits": logits.float().contiguous(), "loss": loss.float().reshape(())})
    return 0


if __name__ == "__main__":
    sys.exit(main())
