"""A lean no-grad forward for Llama-family models, used by the KV-cached decoding of ``BatchedStreams``.

Why: a decode step feeds one token per row, so each of SmolLM2's 30 layers does a few tiny matmuls,
and HF's module stack (hooks, kwargs plumbing, an RMSNorm of six ops, three separate q/k/v and two
gate/up projections, mask building every call) costs a good part of each step. Measured on one AMD
EPYC core (bf16, SmolLM2, 8 rows behind ~1,500 cached tokens, one token per row per step): 135-155 ms
per decode step through HF's forward, 115-121 ms through this one; the rest is memory traffic (the
weights and the KV cache are read once per step). ``scripts/bench_step.py`` measures whole rollouts.

What differs from HF's forward, and why it is the same computation:
- on an inference copy of the weights (the bf16 decoding copy: no parameter requires grad), q/k/v and
  gate/up projections run as one matmul each over weights concatenated once per ``LeanLlama`` (the rows
  of the concatenation are exactly the separate weights). On a model being trained (float32 decoding
  reads the trained weights themselves) they stay separate matmuls: the concatenated copies would add
  ~430 MB (SmolLM2) to a rollout that runs beside the optimiser state, unless they are small
  (``FUSED_COPY_LIMIT_BYTES``: a tiny model's step is mostly per-call costs; ``fuse`` overrides);
- RMSNorm uses torch's fused ``rms_norm`` in float32, then casts and scales as HF does (one call with
  the weight when everything is float32: the same products);
- the rotary embedding comes from the model's own ``rotary_emb`` module (any RoPE scaling it
  implements), applied to q and k together, with ``roll`` and a sign-flipped sin in place of HF's
  ``rotate_half`` (the same products);
- with a shared prefix (``kv.SharedPrefix``), the decode attention's key mask is built once per forward
  (``shared_prefix_blocked``), not once per layer;
- the attention is ``gqa_sdpa_attention`` (the one the HF path uses after ``use_gqa_attention``),
  with the causal-with-holes mask built here from the streams' key mask;
- an uneven append (pieces of different lengths, or rows that feed nothing) projects and runs the MLP over
  its real tokens only, laid out flat, instead of over every padded column: the tool world's appends of
  tool responses are half padding or more. Only the attention sees the padded ``[B, heads, T, d]`` layout
  (zeros at the padding, which the mask hides as before). Each token's products are the same; measured on
  the no-bf16 EPYC (SmolLM2, fp32, 1 thread): an 8-row append of 530 real tokens in 166 columns
  6.2 -> 3.5 s, identical logits; ``bench_step``'s two rollouts replayed in one process 12-13% faster, same tokens.
Outputs equal HF's up to float rounding (``tests/unit/runtime/test_engine_kv.py``: fp32 within 1e-5, both paths).

Only models whose layers are exactly Llama's qualify (``LeanLlama.supports``: no LoRA-wrapped
projections, no forward hooks); anything else keeps the HF forward. The object is built per
``BatchedStreams`` (weights do not change during one), so its fused copies never go stale; building
it costs ~0.1 s (SmolLM2, bf16), once per rollout batch or evaluation batch.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from envace.runtime.attention import (
    DECODE_QUERY_TOKENS,
    decode_attention,
    decode_blocked,
    gqa_sdpa_attention,
    shared_prefix_blocked,
    shared_prefix_decode_attention,
)
from envace.runtime.gemm import decode_head_fn, linear_fn


class LeanLlama:
    """No-grad forward of an HF ``LlamaForCausalLM`` over a ``DynamicCache`` with explicit positions and masks."""

    @staticmethod
    def supports(model: Any) -> bool:
        """A plain HF Llama: no biases, SiLU MLP, every projection a bare ``nn.Linear`` (so no LoRA or other
        wrapped layer whose extra terms this forward would skip), and no forward hooks anywhere (a hook
        expects HF's forward to run)."""
        cfg = getattr(model, "config", None)
        inner = getattr(model, "model", None)
        if not (
            type(model).__name__ == "LlamaForCausalLM"
            and getattr(cfg, "model_type", None) == "llama"
            and not getattr(cfg, "attention_bias", False)
            and not getattr(cfg, "mlp_bias", False)
            and getattr(cfg, "hidden_act", None) == "silu"
            and getattr(cfg, "pretraining_tp", 1) in (None, 1)
            and inner is not None
            and hasattr(inner, "rotary_emb")
            and type(getattr(model, "lm_head", None)) is torch.nn.Linear
            and model.lm_head.bias is None
            and type(getattr(inner, "embed_tokens", None)) is torch.nn.Embedding
        ):
            return False
        for layer in inner.layers:
            att, mlp = layer.self_attn, layer.mlp
            projections = (att.q_proj, att.k_proj, att.v_proj, att.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj)
            if any(type(m) is not torch.nn.Linear for m in projections):
                return False
        return not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())

    # fused q/k/v and gate/up copies of a model being trained are made only below this size: they save two
    # matmuls and a cat per layer and decode step, which is what a small model's step is made of (the peer
    # workload's 0.7M-parameter Llama: ~3% of a rollout), while SmolLM2's copies would be ~430 MB
    FUSED_COPY_LIMIT_BYTES = 16 << 20

    @classmethod
    def fuse_by_default(cls, model: Any) -> bool:
        """Fuse on an inference copy (no parameter requires grad), or where the fused copies are small."""
        if not any(p.requires_grad for p in model.parameters()):
            return True
        fused = [
            m.weight
            for layer in model.model.layers
            for m in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj)
            + (layer.mlp.gate_proj, layer.mlp.up_proj)
        ]
        return sum(w.numel() * w.element_size() for w in fused) <= cls.FUSED_COPY_LIMIT_BYTES

    def __init__(self, model: Any, fuse: bool | None = None):
        if not self.supports(model):
            raise ValueError(
                f"LeanLlama: {type(model).__name__} is not a plain Llama model (see LeanLlama.supports); "
                "decode it with BatchedStreams(..., lean=False)"
            )
        cfg = model.config
        inner = model.model
        self.embed = inner.embed_tokens.weight
        self.rotary = inner.rotary_emb
        self.norm = (inner.norm.weight, inner.norm.variance_epsilon)
        self.head = model.lm_head.weight
        self.linear = linear_fn(model)  # F.linear, or oneDNN's as the model's own layers (runtime.gemm)
        # the head over a few rows is a product of its own kind (bound by reading the weights): measured apart
        self.head_linear = self.linear if self.linear is not F.linear else decode_head_fn(self.head)
        self.heads = cfg.num_attention_heads
        self.kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.fused = self.fuse_by_default(model) if fuse is None else fuse
        join = torch.cat if self.fused else tuple
        self.layers = []
        with torch.no_grad():
            for layer in inner.layers:
                att, mlp = layer.self_attn, layer.mlp
                self.layers.append(
                    (
                        (layer.input_layernorm.weight, layer.input_layernorm.variance_epsilon),
                        join([att.q_proj.weight, att.k_proj.weight, att.v_proj.weight]),
                        att.o_proj.weight,
                        (layer.post_attention_layernorm.weight, layer.post_attention_layernorm.variance_epsilon),
                        join([mlp.gate_proj.weight, mlp.up_proj.weight]),
                        mlp.down_proj.weight,
                        att.scaling,
                    )
                )

    @staticmethod
    def _rms(x: torch.Tensor, norm: tuple[torch.Tensor, float]) -> torch.Tensor:
        weight, eps = norm
        if x.dtype == torch.float32 and weight.dtype == torch.float32:  # HF's order of operations, one call
            return F.rms_norm(x, (x.shape[-1],), weight, eps=eps)
        return weight * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)

    @torch.no_grad()
    def __call__(
        self,
        ids: torch.Tensor,
        positions: torch.Tensor,
        key_mask: torch.Tensor,
        cache: Any,
        keep: torch.Tensor,
        prefix: Any = None,
    ) -> torch.Tensor:
        """Logits ``[B, len(keep), V]`` at columns ``keep`` of the ``T`` new tokens ``ids`` ``[B, T]``.

        ``key_mask`` ``[B, L]`` (bool) covers the cache *including* the new tokens (its last ``T``
        columns); new token i sees cache column j iff ``key_mask[b, j]`` and ``j <= L - T + i``.
        ``prefix`` (a ``kv.SharedPrefix``): keys/values every row sees, per group, before its cache (all
        of them, where the prefix mask is open). Decode steps read them once per group; longer appends
        copy them out per row and take the usual attention.
        """
        b, t = ids.shape
        linear = self.linear
        nq, nkv, d = self.heads, self.kv_heads, self.head_dim
        half = d // 2
        length = key_mask.shape[1]
        # padding columns (shorter pieces, rows that fed nothing) are neither projected nor put through the
        # MLP: those run over the real tokens only, laid out flat ([N, hidden]); the attention keeps the
        # [B, heads, T, d] layout, padding included (zeros there, masked as before)
        fed = key_mask[:, length - t :]
        flat = None if bool(fed.all()) else fed.reshape(-1).nonzero()[:, 0]
        if flat is not None:
            ids, positions = ids.reshape(-1)[flat][None], positions.reshape(-1)[flat][None]
        h = F.embedding(ids, self.embed)
        cos, sin = self.rotary(h, positions)
        # rotate_half(x) * sin = roll(x, d/2) * [-sin_1, sin_2] (exact: a sign flip), so the per-layer rotation
        # is a roll and three elementwise ops; the signed sin is built once per forward
        cos, sin = cos.unsqueeze(1), torch.cat((-sin[..., :half], sin[..., half:]), dim=-1).unsqueeze(1)
        if flat is not None:  # [N, 1, d] against the flat tokens' [N, heads, d]
            h, cos, sin = h[0], cos[0].transpose(0, 1), sin[0].transpose(0, 1)
        mask = key_mask[:, None, None, :]
        if t > 1:
            cols = torch.arange(length, device=ids.device)
            rows = torch.arange(length - t, length, device=ids.device)
            mask = mask & (cols[None, :] <= rows[:, None])[None, None]
        # a decode step's key mask, grouped per key head, is built once per forward for every layer
        shared, blocked = prefix is not None and t <= DECODE_QUERY_TOKENS, None
        if shared:
            blocked = shared_prefix_blocked(mask.expand(b, 1, t, length), prefix.row_mask, nq // nkv)
        elif prefix is not None:
            mask = torch.cat([prefix.row_mask[:, None, None, :].expand(b, 1, mask.shape[2], -1), mask], dim=-1)
        elif t <= DECODE_QUERY_TOKENS:  # the attention gqa_sdpa_attention runs for it (decode_attention)
            blocked = decode_blocked(mask, t, length, nq // nkv)
        for i, (ln1, qkv_w, o_w, ln2, gate_up_w, down_w, scaling) in enumerate(self.layers):
            x = self._rms(h, ln1)
            qkv = linear(x, qkv_w) if self.fused else torch.cat([linear(x, w) for w in qkv_w], dim=-1)
            if flat is not None:  # rotate the flat tokens, then lay them out with zeros at the padding
                qkv = qkv.view(-1, nq + 2 * nkv, d)
                qk = qkv[:, : nq + nkv]
                qk.copy_(qk * cos + torch.roll(qk, half, dims=-1) * sin)
                qkv = qkv.new_zeros(b * t, nq + 2 * nkv, d).index_copy_(0, flat, qkv)
            qkv = qkv.view(b, t, nq + 2 * nkv, d).transpose(1, 2)
            qk, v = qkv[:, : nq + nkv], qkv[:, nq + nkv :]
            if flat is None:
                qk = qk * cos + torch.roll(qk, half, dims=-1) * sin
            keys, values = cache.layers[i].update(qk[:, nq:], v)
            if shared:
                out = shared_prefix_decode_attention(
                    qk[:, :nq],
                    keys,
                    values,
                    blocked,
                    prefix.keys[i],
                    prefix.values[i],
                    prefix.groups,
                    scaling,
                    prefix.uniform,
                )
            elif blocked is not None:
                out = decode_attention(qk[:, :nq], keys, values, None, scaling, blocked)
            else:
                if prefix is not None:
                    pk, pv = prefix.materialise(i)
                    keys, values = torch.cat([pk, keys], dim=2), torch.cat([pv, values], dim=2)
                out, _ = gqa_sdpa_attention(None, qk[:, :nq], keys, values, mask, scaling=scaling)
            out = out.reshape(b, t, nq * d) if flat is None else out.reshape(b * t, nq * d)[flat]
            h = h + linear(out, o_w)
            x = self._rms(h, ln2)
            gate, up = linear(x, gate_up_w).chunk(2, dim=-1) if self.fused else (linear(x, w) for w in gate_up_w)
            h = h + linear(F.silu(gate) * up, down_w)
        if flat is not None:  # back to [B, T, hidden] for the kept columns (padding rows: zeros)
            h = h.new_zeros(b * t, h.shape[-1]).index_copy_(0, flat, h).view(b, t, -1)
        h = self._rms(h[:, keep], self.norm)
        return self.head_linear(h, self.head)
