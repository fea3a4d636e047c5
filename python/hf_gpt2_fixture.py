#!/usr/bin/env python3
"""A small GPT-2 checkpoint in Hugging Face's layout, with the loss it gives on a batch.

    hf_gpt2_fixture.py --out-dir DIR [--n-layer 2 --n-head 4 --d-model 64 --vocab-size 256
                       --n-positions 32 --seed 0 --batch-size 2 --batch B.safetensors
                       --prefix transformer. --attn-buffers --lm-head]

Writes, into DIR:
  model.safetensors     HF GPT-2 names and layouts: wte.weight [V, d], wpe.weight [P, d],
                        h.<i>.ln_1.{weight,bias}, h.<i>.attn.c_attn.{weight [d, 3d], bias [3d]},
                        h.<i>.attn.c_proj.{weight [d, d], bias}, h.<i>.ln_2.*,
                        h.<i>.mlp.c_fc.{weight [d, 4d], bias}, h.<i>.mlp.c_proj.{weight [4d, d],
                        bias}, ln_f.{weight,bias}; __metadata__ {"format": "pt"}. The weights are
                        Conv1D: y = x @ W + b, i.e. transposed against nn.Linear (and Starling).
                        --prefix prepends e.g. "transformer." to every name (GPT2LMHeadModel
                        exports); --attn-buffers adds the h.<i>.attn.bias causal masks
                        [1, 1, P, P] and h.<i>.attn.masked_bias scalars that older exports carry
                        (an importer must skip them); --lm-head adds lm_head.weight, a copy of wte.
  config.json           the HF config (model_type gpt2, n_embd, n_layer, n_head, n_positions,
                        vocab_size, layer_norm_epsilon, activation_function gelu_new).
  expected.safetensors  "tokens", "targets" (I64 [B, T]) and "loss" (F32 []): the mean
                        cross-entropy of the HF-style forward's logits for tokens against targets
                        (Starling's convention: targets given, no internal shift).

Norm gains and all biases are drawn random (not 1 and 0) so that a swapped or dropped tensor in an
importer changes the loss. The HF-style forward here is written from HF's GPT-2 (Conv1D, the
attn.bias mask buffer, gelu_new), independently of reference_model.py.

The name mapping an importer needs is `to_starling` below; `--check` runs it and confirms the
reference model gives the same loss.
"""

import argparse
import json
import math
import os
import sys

# Tests run these scripts from the source tree; keep it free of __pycache__.
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import safetensors_lite as st  # noqa: E402

EPS = 1e-5  # GPT-2's layer_norm_epsilon


def make_weights(n_layer, n_head, d, vocab, n_positions, seed):
    """name -> tensor in HF GPT-2 naming (no prefix, no buffers)."""
    del n_head  # shapes do not depend on it; kept for a symmetric signature
    g = torch.Generator().manual_seed(seed)

    def normal(*shape, std=0.02, mean=0.0):
        return torch.empty(*shape).normal_(mean, std, generator=g)

    w = {"wte.weight": normal(vocab, d), "wpe.weight": normal(n_positions, d, std=0.01)}
    for i in range(n_layer):
        p = f"h.{i}."
        w[p + "ln_1.weight"] = normal(d, std=0.1, mean=1.0)
        w[p + "ln_1.bias"] = normal(d, std=0.05)
        w[p + "attn.c_attn.weight"] = normal(d, 3 * d)
        w[p + "attn.c_attn.bias"] = normal(3 * d, std=0.05)
        w[p + "attn.c_proj.weight"] = normal(d, d)
        w[p + "attn.c_proj.bias"] = normal(d, std=0.05)
        w[p + "ln_2.weight"] = normal(d, std=0.1, mean=1.0)
        w[p + "ln_2.bias"] = normal(d, std=0.05)
        w[p + "mlp.c_fc.weight"] = normal(d, 4 * d)
        w[p + "mlp.c_fc.bias"] = normal(4 * d, std=0.05)
        w[p + "mlp.c_proj.weight"] = normal(4 * d, d)
        w[p + "mlp.c_proj.bias"] = normal(d, std=0.05)
    w["ln_f.weight"] = normal(d, std=0.1, mean=1.0)
    w["ln_f.bias"] = normal(d, std=0.05)
    return w


def hf_logits(w, tokens, n_layer, n_head):
    """GPT-2 forward as Hugging Face's GPT2Model + tied lm head computes it (Conv1D: x @ W + b)."""
    B, T = tokens.shape
    d = w["wte.weight"].shape[1]
    hd = d // n_head
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool)).view(1, 1, T, T)  # the attn.bias buffer
    x = w["wte.weight"][tokens] + w["wpe.weight"][torch.arange(T)]
    for i in range(n_layer):
        p = f"h.{i}."
        a = F.layer_norm(x, (d,), w[p + "ln_1.weight"], w[p + "ln_1.bias"], EPS)
        qkv = a @ w[p + "attn.c_attn.weight"] + w[p + "attn.c_attn.bias"]
        q, k, v = (t.view(B, T, n_head, hd).permute(0, 2, 1, 3) for t in qkv.split(d, dim=2))
        s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(hd)
        s = torch.where(mask, s, torch.tensor(torch.finfo(s.dtype).min, dtype=s.dtype))
        y = torch.matmul(s.softmax(dim=-1), v).permute(0, 2, 1, 3).reshape(B, T, d)
        x = x + y @ w[p + "attn.c_proj.weight"] + w[p + "attn.c_proj.bias"]
        m = F.layer_norm(x, (d,), w[p + "ln_2.weight"], w[p + "ln_2.bias"], EPS)
        hidden = m @ w[p + "mlp.c_fc.weight"] + w[p + "mlp.c_fc.bias"]
        # gelu_new: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), written out as HF does.
        hidden = 0.5 * hidden * (1.0 + torch.tanh(
            math.sqrt(2.0 / math.pi) * (hidden + 0.044715 * torch.pow(hidden, 3.0))))
        x = x + hidden @ w[p + "mlp.c_proj.weight"] + w[p + "mlp.c_proj.bias"]
    x = F.layer_norm(x, (d,), w["ln_f.weight"], w["ln_f.bias"], EPS)
    return x @ w["wte.weight"].t()


def hf_loss(w, tokens, targets, n_layer, n_head):
    logits = hf_logits(w, tokens, n_layer, n_head)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def to_starling(hf, n_layer):
    """HF GPT-2 names/layouts -> Starling's (gpt2 arch, tied embeddings). Accepts the optional
    "transformer." prefix; skips attn.bias / attn.masked_bias buffers and lm_head.weight (tied)."""
    hf = {(k[len("transformer."):] if k.startswith("transformer.") else k): v
          for k, v in hf.items()}
    out = {"embed.tok.weight": hf["wte.weight"], "embed.pos.weight": hf["wpe.weight"]}
    for i in range(n_layer):
        h, s = f"h.{i}.", f"layers.{i}."
        out[s + "attn.norm.weight"] = hf[h + "ln_1.weight"]
        out[s + "attn.norm.bias"] = hf[h + "ln_1.bias"]
        out[s + "attn.qkv.weight"] = hf[h + "attn.c_attn.weight"].t().contiguous()
        out[s + "attn.qkv.bias"] = hf[h + "attn.c_attn.bias"]
        out[s + "attn.proj.weight"] = hf[h + "attn.c_proj.weight"].t().contiguous()
        out[s + "attn.proj.bias"] = hf[h + "attn.c_proj.bias"]
        out[s + "mlp.norm.weight"] = hf[h + "ln_2.weight"]
        out[s + "mlp.norm.bias"] = hf[h + "ln_2.bias"]
        out[s + "mlp.fc.weight"] = hf[h + "mlp.c_fc.weight"].t().contiguous()
        out[s + "mlp.fc.bias"] = hf[h + "mlp.c_fc.bias"]
        out[s + "mlp.proj.weight"] = hf[h + "mlp.c_proj.weight"].t().contiguous()
        out[s + "mlp.proj.bias"] = hf[h + "mlp.c_proj.bias"]
    out["final_norm.weight"] = hf["ln_f.weight"]
    out["final_norm.bias"] = hf["ln_f.bias"]
    return out


def starling_config(a):
    """The Starling ModelConfig (as reference_model.ModelConfig) this checkpoint imports as."""
    import reference_model as rm

    return rm.ModelConfig(name="hf-gpt2-fixture", arch="gpt2", vocab_size=a.vocab_size,
                          seq_len=a.n_positions, n_layer=a.n_layer, n_head=a.n_head,
                          d_model=a.d_model, norm_eps=EPS, tie_embeddings=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", required=True, help="directory to write into (created)")
    ap.add_argument("--n-layer", type=int, default=2)
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=64, help="n_embd")
    ap.add_argument("--vocab-size", type=int, default=256)
    ap.add_argument("--n-positions", type=int, default=32, help="learned positions (max T)")
    ap.add_argument("--seed", type=int, default=0, help="seed for weights and the random batch")
    ap.add_argument("--batch-size", type=int, default=2, help="sequences in the random batch")
    ap.add_argument("--seq-len", type=int, default=0,
                    help="tokens per sequence of the random batch (default: n_positions)")
    ap.add_argument("--batch", help="use this batch (tokens, targets I64) instead of a random one")
    ap.add_argument("--prefix", default="", help='name prefix, e.g. "transformer."')
    ap.add_argument("--attn-buffers", action="store_true",
                    help="add h.<i>.attn.bias / attn.masked_bias buffers as older exports do")
    ap.add_argument("--lm-head", action="store_true", help="add lm_head.weight (copy of wte)")
    ap.add_argument("--check", action="store_true",
                    help="also map to Starling names and confirm reference_model's loss agrees")
    a = ap.parse_args(argv)
    if a.d_model % a.n_head:
        ap.error("--d-model must be divisible by --n-head")

    torch.set_num_threads(1)
    w = make_weights(a.n_layer, a.n_head, a.d_model, a.vocab_size, a.n_positions, a.seed)
    if a.batch:
        b, _ = st.load_torch(a.batch)
        tokens, targets = b["tokens"], b["targets"]
    else:
        g = torch.Generator().manual_seed(a.seed + 1)
        t = a.seq_len or a.n_positions
        seq = torch.randint(a.vocab_size, (a.batch_size, t + 1), generator=g)
        tokens, targets = seq[:, :-1].contiguous(), seq[:, 1:].contiguous()
    if tokens.shape[1] > a.n_positions:
        ap.error(f"batch has {tokens.shape[1]} tokens per sequence, n_positions is {a.n_positions}")
    with torch.no_grad():
        loss = hf_loss(w, tokens, targets, a.n_layer, a.n_head)

    out = {}
    for name, t in w.items():
        out[a.prefix + name] = t
        if a.attn_buffers and name.endswith("ln_1.bias"):  # where HF's state_dict has them
            h = name[:-len("ln_1.bias")]
            P = a.n_positions
            out[a.prefix + h + "attn.bias"] = torch.tril(torch.ones(P, P)).view(1, 1, P, P)
            out[a.prefix + h + "attn.masked_bias"] = torch.tensor(-1e4)
    if a.lm_head:
        out["lm_head.weight"] = w["wte.weight"].clone()

    os.makedirs(a.out_dir, exist_ok=True)
    st.save_torch(os.path.join(a.out_dir, "model.safetensors"), out, metadata={"format": "pt"})
    st.save_torch(os.path.join(a.out_dir, "expected.safetensors"),
                  {"tokens": tokens, "targets": targets, "loss": loss.float().reshape(())})
    config = {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
        "vocab_size": a.vocab_size, "n_positions": a.n_positions, "n_ctx": a.n_positions,
        "n_embd": a.d_model, "n_layer": a.n_layer, "n_head": a.n_head, "n_inner": None,
        "activation_function": "gelu_new", "layer_norm_epsilon": EPS,
        "tie_word_embeddings": True,
    }
    with open(os.path.join(a.out_dir, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")

    if a.check:
        import reference_model as rm

        model = rm.ReferenceModel(starling_config(a))
        rm.load_weights(model, to_starling(out, a.n_layer), where="to_starling(model.safetensors)")
        with torch.no_grad():
            ref = model(tokens, targets).item()
        if abs(ref - loss.item()) > 1e-5:
            print(f"hf_gpt2_fixture: reference model loss {ref:.7f} != HF-style {loss.item():.7f}",
                  file=sys.stderr)
            return 1
    print(f"hf_gpt2_fixture: wrote {a.out_dir} (loss {loss.item():.6f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
