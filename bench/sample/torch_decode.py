#!/usr/bin/env python3
"""Greedy GPT-2 decoding in PyTorch eager with a KV cache: the outside baseline of
bench/sample/run.py.

    torch_decode.py --model-dir HF_DIR --prompt-ids 84,104,101 --max-tokens 128 --threads 2

Reads a Hugging Face GPT-2 export (config.json, model.safetensors: `starling export --format hf`),
runs the prompt once, then one token at a time with each layer's keys and values kept, and prints
one JSON line: the generated ids, the tokens, the seconds of the generation (loading and the first
warm-up excluded) and tokens/s. Written from transformers' GPT2LMHeadModel (Conv1D weights
x @ W + b, gelu_new, learned positions), the way a PyTorch user decodes with a cache.
"""
import argparse
import json
import math
import os
import sys
import time

sys.dont_write_bytecode = True
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import safetensors_lite as st  # noqa: E402


def attention(q, k, v, start):
    """q [1, H, T, hd] at positions start.., k and v [1, H, start + T, hd]: each query sees the keys
    up to its own position (transformers' eager attention; Debian's torch 1.13 has no fused one)."""
    T, hd = q.shape[2], q.shape[3]
    s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(hd)
    if T > 1:
        later = torch.arange(start + T)[None, :] > (torch.arange(T) + start)[:, None]
        s = s.masked_fill(later, torch.finfo(s.dtype).min)
    return torch.matmul(s.softmax(dim=-1), v)


class Gpt2:
    def __init__(self, cfg, w):
        w = {(k[len("transformer."):] if k.startswith("transformer.") else k): v for k, v in w.items()}
        self.w, self.cfg = w, cfg
        self.d, self.nh, self.eps = cfg["n_embd"], cfg["n_head"], cfg["layer_norm_epsilon"]

    def forward(self, tokens, start, cache):
        """Logits of `tokens` ([1, T]) at positions start.. with `cache` (per layer [k, v] or
        None) holding the earlier ones; the cache grows by T."""
        w, d, nh, eps = self.w, self.d, self.nh, self.eps
        hd = d // nh
        T = tokens.shape[1]
        x = w["wte.weight"][tokens] + w["wpe.weight"][start:start + T]
        for i in range(self.cfg["n_layer"]):
            p = f"h.{i}."
            a = F.layer_norm(x, (d,), w[p + "ln_1.weight"], w[p + "ln_1.bias"], eps)
            qkv = a @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]
            q, k, v = (t.view(1, T, nh, hd).transpose(1, 2) for t in qkv.split(d, dim=2))
            if cache[i] is not None:
                k = torch.cat([cache[i][0], k], dim=2)
                v = torch.cat([cache[i][1], v], dim=2)
            cache[i] = (k, v)
            y = attention(q, k, v, start)
            x = x + y.transpose(1, 2).reshape(1, T, d) @ w[p + "attn.c_proj.weight"] + \
                w[p + "attn.c_proj.bias"]
            m = F.layer_norm(x, (d,), w[p + "ln_2.weight"], w[p + "ln_2.bias"], eps)
            h = m @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"]
            h = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * h.pow(3))))
            x = x + h @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
        x = F.layer_norm(x, (d,), w["ln_f.weight"], w["ln_f.bias"], eps)
        return x @ w["wte.weight"].t()

    def generate(self, prompt, n):
        cache = [None] * self.cfg["n_layer"]
        ids = list(prompt)
        logits = self.forward(torch.tensor([ids]), 0, cache)
        for _ in range(n):
            nxt = int(logits[0, -1].argmax())
            ids.append(nxt)
            if len(ids) - len(prompt) == n:
                break
            logits = self.forward(torch.tensor([[nxt]]), len(ids) - 1, cache)
        return ids[len(prompt):]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--prompt-ids", required=True, help="comma-separated token ids")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=0, help="0 = torch's default")
    args = ap.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    with open(os.path.join(args.model_dir, "config.json")) as f:
        cfg = json.load(f)
    if cfg.get("model_type") != "gpt2":
        sys.exit(f"torch_decode.py: {args.model_dir} is a {cfg.get('model_type')} model; only gpt2")
    model = Gpt2(cfg, {k: v.float() for k, v in st.load_torch(os.path.join(args.model_dir, "model.safetensors"))[0].items()})
    prompt = [int(x) for x in args.prompt_ids.split(",")]
    with torch.inference_mode():
        model.generate(prompt, 4)  # warm-up: first-call allocations
        start = time.perf_counter()
        ids = model.generate(prompt, args.max_tokens)
        seconds = time.perf_counter() - start
    print(json.dumps({"ids": ids, "tokens": len(ids), "seconds": seconds,
                      "tokens_per_s": len(ids) / seconds, "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
