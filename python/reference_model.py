"""Starling's two architectures in plain PyTorch eager: the correctness oracle and the baseline.

This is an independent implementation of the model that src/starling/model builds as an OP-DAG,
written the usual nanoGPT way (one nn.Module, q @ k^T with a masked_fill causal mask, softmax,
@ v) rather than transcribed from the C++. What must agree with the C++ is the *definition*:

- ModelConfig mirrors src/starling/model/config.h, presets and the ff_dim default rule included.
- Parameter names and layouts are those build.h documents: embed.tok.weight [V, d],
  embed.pos.weight [T, d] (gpt2), layers.<i>.attn.{norm,qkv,proj}.*, layers.<i>.mlp.{norm,fc,
  proj}.*, final_norm.*, head.weight [V, d] (untied only). Biases and LayerNorm biases for gpt2
  only. qkv.weight is [(n_head + 2*kv_heads) * head_dim, d] with q, k, v stacked in that order;
  llama's mlp.fc.weight is [2*d_ff, d] with the gate half first, then the up half.
- gpt2: learned positions, LayerNorm with bias, GELU (tanh approximation), tied embeddings.
- llama: RMSNorm x * rsqrt(mean(x^2) + eps) * w, rotary positions in the rotate-half convention
  with cos/sin of cat(freqs, freqs), SwiGLU, no biases, grouped-query attention in which query
  head j reads key/value head j // (n_head / kv_heads) (repeat_interleave).
- Loss: mean cross-entropy of logits against targets given as a separate [B, T] tensor.
"""

import dataclasses
import json
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

ARCHS = ("gpt2", "llama")


@dataclasses.dataclass
class ModelConfig:
    """Mirror of starling::model::ModelConfig (config.h); same defaults, same rules."""

    name: str = "custom"
    arch: str = "gpt2"
    vocab_size: int = 256
    seq_len: int = 256
    n_layer: int = 4
    n_head: int = 4
    n_kv_head: int = 0  # llama: key/value heads; 0 = n_head
    d_model: int = 128
    d_ff: int = 0  # 0 = 4*d_model (gpt2), 8/3*d_model rounded up to a multiple of 64 (llama)
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    tie_embeddings: bool = True
    init_std: float = 0.02

    @property
    def head_dim(self):
        return self.d_model // self.n_head

    @property
    def kv_heads(self):
        return self.n_kv_head if self.n_kv_head > 0 else self.n_head

    @property
    def ff_dim(self):
        if self.d_ff > 0:
            return self.d_ff
        if self.arch == "gpt2":
            return 4 * self.d_model
        # Integer arithmetic exactly as config.cpp: ceil(8d/3), then up to a multiple of 64.
        raw = (8 * self.d_model + 2) // 3
        return (raw + 63) // 64 * 64

    def validate(self):
        """ValueError naming the first bad field, in the order config.cpp checks them."""
        if self.arch not in ARCHS:
            raise ValueError(f'model.arch: expected "gpt2" or "llama", got "{self.arch}"')
        for field in ("vocab_size", "seq_len", "n_layer", "n_head", "d_model"):
            if getattr(self, field) < 1:
                raise ValueError(f"model.{field}: must be >= 1, got {getattr(self, field)}")
        if self.d_ff < 0:
            raise ValueError(f"model.d_ff: must be >= 0 (0 = default), got {self.d_ff}")
        if self.n_kv_head < 0:
            raise ValueError("model.n_kv_head: must be >= 0 (0 = n_head)")
        if self.d_model % self.n_head != 0:
            raise ValueError(f"model.d_model ({self.d_model}) must be divisible by "
                             f"model.n_head ({self.n_head})")
        if self.n_head % self.kv_heads != 0:
            raise ValueError(f"model.n_head ({self.n_head}) must be divisible by "
                             f"model.n_kv_head ({self.kv_heads})")
        if self.arch == "gpt2" and self.n_kv_head not in (0, self.n_head):
            raise ValueError('model.n_kv_head: grouped-query attention is only for arch = "llama"')
        if self.arch == "llama" and self.head_dim % 2 != 0:
            raise ValueError("model: rotary positions need an even head size, "
                             f"d_model/n_head = {self.head_dim}")
        if not self.norm_eps > 0:
            raise ValueError("model.norm_eps: must be > 0")
        if not self.init_std > 0:
            raise ValueError("model.init_std: must be > 0")
        if not self.rope_theta > 0:
            raise ValueError("model.rope_theta: must be > 0")

    def num_params(self):
        """Parameter count, tied weights once (the formula of config.cpp)."""
        d, f, hd, v = self.d_model, self.ff_dim, self.head_dim, self.vocab_size
        n = v * d * (1 if self.tie_embeddings else 2)
        if self.arch == "gpt2":
            n += self.seq_len * d
            attn = d * 3 * d + 3 * d + d * d + d + 2 * d
            mlp = d * f + f + f * d + d + 2 * d
            return n + self.n_layer * (attn + mlp) + 2 * d
        qkv = d * (self.n_head + 2 * self.kv_heads) * hd
        attn = qkv + d * d + d
        mlp = d * 2 * f + f * d + d
        return n + self.n_layer * (attn + mlp) + d

    def train_flops_per_token(self):
        """Training FLOPs per token exactly as ModelConfig::train_flops_per_token (config.cpp).

        Kept formula-for-formula identical, so an MFU printed here and one printed by
        `starling bench compute` divide the same work by their peaks.
        """
        non_embedding = (self.num_params() - self.vocab_size * self.d_model -
                         (self.seq_len * self.d_model if self.arch == "gpt2" else 0))
        # The LM head matmul: an untied head is already among the non-embedding parameters.
        head = self.vocab_size * self.d_model if self.tie_embeddings else 0
        return 6.0 * (non_embedding + head) + 12.0 * self.n_layer * self.seq_len * self.d_model

    # --- JSON: the fields oracle_grads.py's cfg.json carries ------------------------------------

    JSON_FIELDS = ("arch", "vocab_size", "seq_len", "n_layer", "n_head", "n_kv_head", "d_model",
                   "d_ff", "norm_eps", "rope_theta", "tie_embeddings")
    OPTIONAL_JSON_FIELDS = ("name", "init_std")

    def to_json(self):
        return {k: getattr(self, k) for k in self.JSON_FIELDS}

    @classmethod
    def from_json(cls, obj, where="config"):
        """Strict: every JSON_FIELDS key required with the right type, no unknown keys."""
        if not isinstance(obj, dict):
            raise ValueError(f"{where}: expected a JSON object")
        known = set(cls.JSON_FIELDS) | set(cls.OPTIONAL_JSON_FIELDS)
        unknown = sorted(set(obj) - known)
        if unknown:
            raise ValueError(f"{where}: unknown field(s) {', '.join(unknown)}; "
                             f"expected {', '.join(cls.JSON_FIELDS)}")
        missing = [k for k in cls.JSON_FIELDS if k not in obj]
        if missing:
            raise ValueError(f"{where}: missing field(s) {', '.join(missing)}")
        kwargs = {}
        for f in dataclasses.fields(cls):
            if f.name not in obj:
                continue
            value = obj[f.name]
            is_bool = isinstance(value, bool)
            ok = {
                int: isinstance(value, int) and not is_bool,
                float: isinstance(value, (int, float)) and not is_bool,
                bool: is_bool,
                str: isinstance(value, str),
            }[f.type]
            if not ok:
                raise ValueError(f"{where}: field {f.name} must be {f.type.__name__}, "
                                 f"got {value!r}")
            kwargs[f.name] = float(value) if f.type is float else value
        cfg = cls(**kwargs)
        cfg.validate()
        return cfg

    @classmethod
    def load(cls, path):
        with open(path) as f:
            return cls.from_json(json.load(f), where=str(path))


def _gpt(name, layers, d, heads, seq, vocab):
    return ModelConfig(name=name, arch="gpt2", n_layer=layers, d_model=d, n_head=heads,
                       seq_len=seq, vocab_size=vocab, tie_embeddings=True)


def _llama(name, layers, d, heads, kv_heads, ff, seq, vocab):
    return ModelConfig(name=name, arch="llama", n_layer=layers, d_model=d, n_head=heads,
                       n_kv_head=kv_heads, d_ff=ff, seq_len=seq, vocab_size=vocab,
                       tie_embeddings=False, norm_eps=1e-6)


# The preset table of config.cpp, same names and shapes.
PRESETS = {c.name: c for c in [
    _gpt("gpt2-tiny", 4, 128, 4, 128, 256),
    _gpt("gpt2-mini", 6, 256, 8, 256, 256),
    _llama("llama-tiny", 4, 128, 4, 2, 0, 128, 256),
    _llama("llama-mini", 6, 256, 8, 4, 0, 256, 256),
    _gpt("gpt2-124m", 12, 768, 12, 1024, 50257),
    _gpt("gpt2-350m", 24, 1024, 16, 1024, 50257),
    _gpt("gpt2-774m", 36, 1280, 20, 1024, 50257),
    _gpt("gpt2-1558m", 48, 1600, 25, 1024, 50257),
    _gpt("gpt3-125m", 12, 768, 12, 2048, 50257),
    _gpt("gpt3-350m", 24, 1024, 16, 2048, 50257),
    _gpt("gpt3-760m", 24, 1536, 16, 2048, 50257),
    _gpt("gpt3-1.3b", 24, 2048, 16, 2048, 50257),
    _gpt("gpt3-2.7b", 32, 2560, 32, 2048, 50257),
    _gpt("gpt3-6.7b", 32, 4096, 32, 2048, 50257),
    _gpt("gpt3-13b", 40, 5120, 40, 2048, 50257),
    _llama("llama-125m", 12, 768, 12, 12, 2048, 2048, 32000),
    _llama("llama-350m", 24, 1024, 16, 16, 2816, 2048, 32000),
    _llama("llama-1.1b", 22, 2048, 32, 4, 5632, 2048, 32000),
    _llama("llama-7b", 32, 4096, 32, 32, 11008, 2048, 32000),
]}


def preset(name):
    """A fresh copy of the named preset; ValueError listing the known names otherwise."""
    if name not in PRESETS:
        raise ValueError(f'model.preset: unknown preset "{name}"; known presets: '
                         f"{', '.join(sorted(PRESETS))}")
    return dataclasses.replace(PRESETS[name])


# --- the model ----------------------------------------------------------------------------------


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _norm(cfg):
    if cfg.arch == "gpt2":
        return nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)
    return RMSNorm(cfg.d_model, cfg.norm_eps)


def _rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Attention(nn.Module):
    """Pre-norm causal self-attention with its residual: x + proj(attn(qkv(norm(x))))."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        # False: the materialised nanoGPT form (the oracle). True: torch's fused
        # scaled_dot_product_attention, for the benchmark's fast modes (use_sdpa()).
        self.sdpa = False
        bias = cfg.arch == "gpt2"
        self.norm = _norm(cfg)
        self.qkv = nn.Linear(cfg.d_model, (cfg.n_head + 2 * cfg.kv_heads) * cfg.head_dim,
                             bias=bias)
        self.proj = nn.Linear(cfg.n_head * cfg.head_dim, cfg.d_model, bias=bias)
        n = cfg.seq_len
        # Buffers, not parameters: they never appear in named_parameters() or a checkpoint.
        self.register_buffer("mask", torch.tril(torch.ones(n, n, dtype=torch.bool)),
                             persistent=False)
        if cfg.arch == "llama":
            # Tables in float64, rounded once: the oracle should be the most accurate party.
            hd = cfg.head_dim
            inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
            freqs = torch.outer(torch.arange(n, dtype=torch.float64), inv_freq)
            emb = torch.cat((freqs, freqs), dim=-1)  # [T, hd]
            self.register_buffer("cos", emb.cos().float(), persistent=False)
            self.register_buffer("sin", emb.sin().float(), persistent=False)

    def forward(self, x):
        cfg = self.cfg
        B, T, _ = x.shape
        h, kv, hd = cfg.n_head, cfg.kv_heads, cfg.head_dim
        q, k, v = self.qkv(self.norm(x)).split([h * hd, kv * hd, kv * hd], dim=-1)
        q = q.view(B, T, h, hd).transpose(1, 2)  # [B, h, T, hd]
        k = k.view(B, T, kv, hd).transpose(1, 2)  # [B, kv, T, hd]
        v = v.view(B, T, kv, hd).transpose(1, 2)
        if cfg.arch == "llama":
            cos, sin = self.cos[:T].to(q.dtype), self.sin[:T].to(q.dtype)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
        if kv != h:
            k = k.repeat_interleave(h // kv, dim=1)
            v = v.repeat_interleave(h // kv, dim=1)
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
            att = att.masked_fill(~self.mask[:T, :T], float("-inf"))
            att = F.softmax(att, dim=-1)
            y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, h * hd)
        return x + self.proj(y)


class Mlp(nn.Module):
    """Pre-norm MLP with its residual: GELU-tanh (gpt2) or SwiGLU with stacked gate/up (llama)."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        bias = cfg.arch == "gpt2"
        f = cfg.ff_dim
        self.norm = _norm(cfg)
        self.fc = nn.Linear(cfg.d_model, f if cfg.arch == "gpt2" else 2 * f, bias=bias)
        self.proj = nn.Linear(f, cfg.d_model, bias=bias)

    def forward(self, x):
        hidden = self.fc(self.norm(x))
        if self.cfg.arch == "gpt2":
            hidden = F.gelu(hidden, approximate="tanh")
        else:
            gate, up = hidden.chunk(2, dim=-1)
            hidden = F.silu(gate) * up
        return x + self.proj(hidden)


class Layer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.attn = Attention(cfg)
        self.mlp = Mlp(cfg)

    def forward(self, x):
        return self.mlp(self.attn(x))


class Embedding(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.seq_len, cfg.d_model) if cfg.arch == "gpt2" else None

    def forward(self, tokens):
        x = self.tok(tokens)
        if self.pos is not None:
            x = x + self.pos.weight[:tokens.shape[1]]
        return x


class ReferenceModel(nn.Module):
    """The whole model; named_parameters() gives exactly Starling's parameter names."""

    def __init__(self, cfg, seed=None):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        self.embed = Embedding(cfg)
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg.n_layer))
        self.final_norm = _norm(cfg)
        self.head = None if cfg.tie_embeddings else nn.Linear(cfg.d_model, cfg.vocab_size,
                                                              bias=False)
        self.init_weights(0 if seed is None else seed)

    @torch.no_grad()
    def init_weights(self, seed):
        """normal(0, init_std) matrices and embeddings, output projections scaled by
        1/sqrt(2*n_layer), zero biases, unit gains (build.h's rule). Draws come from one CPU
        generator in build.cpp's order (tok, pos, then per layer qkv, attn proj, fc, mlp proj,
        then head), which is what lets a shared seed give shared weights."""
        cfg = self.cfg
        g = torch.Generator().manual_seed(seed)
        std, out_std = cfg.init_std, cfg.init_std / math.sqrt(2.0 * cfg.n_layer)
        draws = [(self.embed.tok.weight, std)]
        if self.embed.pos is not None:
            draws.append((self.embed.pos.weight, std))
        for layer in self.layers:
            draws += [(layer.attn.qkv.weight, std), (layer.attn.proj.weight, out_std),
                      (layer.mlp.fc.weight, std), (layer.mlp.proj.weight, out_std)]
        if self.head is not None:
            draws.append((self.head.weight, std))
        for p, s in draws:
            p.copy_(torch.empty(p.shape).normal_(0.0, s, generator=g))
        for name, p in self.named_parameters():
            if p.dim() == 1:
                p.fill_(1.0 if name.endswith("norm.weight") else 0.0)

    def logits(self, tokens):
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        x = self.final_norm(x)
        w = self.embed.tok.weight if self.head is None else self.head.weight
        return F.linear(x, w)

    def forward(self, tokens, targets):
        """Mean cross-entropy of the logits for `tokens` [B, T] against `targets` [B, T]."""
        if tokens.shape[1] > self.cfg.seq_len:
            raise ValueError(f"sequence of {tokens.shape[1]} tokens exceeds model.seq_len "
                             f"{self.cfg.seq_len}")
        logits = self.logits(tokens)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


# --- weights and optimizer ----------------------------------------------------------------------


def load_weights(model, tensors, where="weights"):
    """Copies name -> tensor into the model. ValueError listing every missing or extra name and
    every shape mismatch: a partial load would make the oracle compare against garbage."""
    params = dict(model.named_parameters())
    missing = sorted(set(params) - set(tensors))
    extra = sorted(set(tensors) - set(params))
    problems = []
    if missing:
        problems.append(f"missing: {', '.join(missing)}")
    if extra:
        problems.append(f"unexpected: {', '.join(extra)}")
    for name in sorted(set(params) & set(tensors)):
        if tuple(tensors[name].shape) != tuple(params[name].shape):
            problems.append(f"{name}: shape {list(tensors[name].shape)}, model expects "
                            f"{list(params[name].shape)}")
    if problems:
        raise ValueError(f"{where}: does not match the model ({'; '.join(problems)})")
    with torch.no_grad():
        for name, p in params.items():
            p.copy_(torch.as_tensor(tensors[name]).to(p.dtype))


def use_sdpa(model, on=True):
    """Switches every attention block to F.scaled_dot_product_attention (flash/memory-efficient
    kernels on GPUs) or back to the materialised form."""
    for m in model.modules():
        if isinstance(m, Attention):
            m.sdpa = on


def make_adamw(model, lr=6e-4, weight_decay=0.1, betas=(0.9, 0.95), eps=1e-8, fused=None):
    """torch.optim.AdamW with two groups: weight decay for matrices and embeddings (dim >= 2),
    none for norm gains and biases, the same split as Starling's ParamStore decay flags.
    Implementation left at torch's default (foreach where available) unless `fused` is given."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    if fused is None:
        return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps)
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, fused=fused)


def train_step(model, optimizer, tokens, targets, grad_clip=0.0):
    """One full step: zero grads, forward, backward, optional global-norm clip, AdamW update.
    Returns the loss as a float."""
    optimizer.zero_grad(set_to_none=True)
    loss = model(tokens, targets)
    loss.backward()
    if grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    return loss.item()
