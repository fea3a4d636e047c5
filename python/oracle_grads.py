#!/usr/bin/env python3
"""Loss and parameter gradients of the reference model: the oracle Starling's C++ is tested against.

    oracle_grads.py --weights W.safetensors --batch B.safetensors --config cfg.json \\
                    --out OUT.safetensors

cfg.json   ModelConfig's fields: arch ("gpt2"/"llama"), vocab_size, seq_len, n_layer, n_head,
           n_kv_head, d_model, d_ff, norm_eps, rope_theta, tie_embeddings (all required; "name"
           and "init_std" are accepted and ignored by the computation; anything else is an error).
W          every parameter under its Starling name, F32, nothing missing, nothing extra.
B          "tokens" and "targets", int64 [B, T] with T <= seq_len.
OUT        "loss" (F32, shape []) and "grad.<name>" (F32) for every parameter.

Runs in fp32 on one CPU thread with deterministic algorithms, so repeated runs give identical
bits. Exit status 0 on success, 1 with a one-line message on stderr for bad input.
"""

import argparse
import os
import sys

# Tests run these scripts from the source tree; keep it free of __pycache__.
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import reference_model as rm  # noqa: E402
import safetensors_lite as st  # noqa: E402


def read_batch(path, cfg):
    tensors, _ = st.load_torch(path)
    for key in ("tokens", "targets"):
        if key not in tensors:
            raise ValueError(f"{path}: no tensor '{key}' (has: {', '.join(tensors) or 'none'})")
        t = tensors[key]
        if t.dtype != torch.int64 or t.dim() != 2:
            raise ValueError(f"{path}: '{key}' must be int64 [B, T], got {t.dtype} "
                             f"{list(t.shape)}")
        if t.numel() and (t.min() < 0 or t.max() >= cfg.vocab_size):
            raise ValueError(f"{path}: '{key}' has ids outside [0, {cfg.vocab_size})")
    tokens, targets = tensors["tokens"], tensors["targets"]
    if tokens.shape != targets.shape:
        raise ValueError(f"{path}: tokens {list(tokens.shape)} and targets "
                         f"{list(targets.shape)} differ in shape")
    if tokens.shape[1] > cfg.seq_len:
        raise ValueError(f"{path}: {tokens.shape[1]} tokens per sequence exceed seq_len "
                         f"{cfg.seq_len}")
    return tokens, targets


def read_weights(path):
    data = st.read(path)
    wrong = [f"{n} ({d})" for n, d in data.dtypes.items() if d != "F32"]
    if wrong:
        raise ValueError(f"{path}: the oracle runs in fp32; not F32: {', '.join(wrong)}")
    return st.to_torch(data.tensors)


def oracle(cfg, weights, tokens, targets, weights_path="weights"):
    """(loss tensor, name -> gradient) for one forward/backward of a fresh reference model."""
    model = rm.ReferenceModel(cfg)
    rm.load_weights(model, weights, where=weights_path)
    model.zero_grad(set_to_none=True)
    loss = model(tokens, targets)
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in model.named_parameters()}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--weights", required=True, help="parameters, safetensors (F32)")
    ap.add_argument("--batch", required=True, help="tokens and targets, safetensors (I64)")
    ap.add_argument("--config", required=True, help="ModelConfig as JSON")
    ap.add_argument("--out", required=True, help="where to write loss and grad.<name>")
    args = ap.parse_args(argv)

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    torch.set_default_dtype(torch.float32)
    try:
        cfg = rm.ModelConfig.load(args.config)
        weights = read_weights(args.weights)
        tokens, targets = read_batch(args.batch, cfg)
        loss, grads = oracle(cfg, weights, tokens, targets, args.weights)
    except (ValueError, OSError) as e:
        print(f"oracle_grads: {e}", file=sys.stderr)
        return 1

    out = {"loss": loss.float().reshape(())}
    for name, g in grads.items():
        # A parameter no path reaches would have no gradient; its true gradient is zero.
        out["grad." + name] = torch.zeros_like(weights[name]) if g is None else g.float()
    st.save_torch(args.out, out, metadata={"producer": "oracle_grads.py",
                                           "torch": torch.__version__})
    return 0


if __name__ == "__main__":
    sys.exit(main())
