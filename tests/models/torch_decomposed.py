"""The same attention block written twice in torch: the reference with fused ops, the
candidate decomposed (layer_norm -> mean/var/rsqrt, linear -> matmul + add, scaled dot
product attention -> explicit softmax(q k^T) v, chunk -> split, masked_fill -> where,
transpose -> permute), with its q/k/v projections in another order, other module
names and extra contiguous/clone/cast calls. The aligner must pair them op by op."""

D, HEADS, SEQ = 16, 2, 6


def _weights():
    import torch

    torch.manual_seed(0)
    return {name: torch.randn(shape) * 0.3 for name, shape in {
        "ln_w": (D,), "ln_b": (D,), "wq": (D, D), "bq": (D,), "wk": (D, D), "bk": (D,),
        "wv": (D, D), "bv": (D,), "wo": (D, D), "bo": (D,)}.items()}


def _inputs():
    import torch

    torch.manual_seed(1)
    return torch.randn(2, SEQ, D)


def reference():
    import torch
    import torch.nn.functional as F

    w = _weights()

    class FusedBlock(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.LayerNorm(D)
            self.q_proj, self.k_proj, self.v_proj, self.out_proj = (torch.nn.Linear(D, D) for _ in range(4))
            with torch.no_grad():
                self.norm.weight.copy_(w["ln_w"]); self.norm.bias.copy_(w["ln_b"])
                for layer, name in ((self.q_proj, "q"), (self.k_proj, "k"), (self.v_proj, "v"), (self.out_proj, "o")):
                    layer.weight.copy_(w[f"w{name}"]); layer.bias.copy_(w[f"b{name}"])

        def heads(self, t):
            return t.reshape(2, SEQ, HEADS, D // HEADS).transpose(1, 2)

        def forward(self, x, pad):
            h = self.norm(x)
            q, k, v = self.heads(self.q_proj(h)), self.heads(self.k_proj(h)), self.heads(self.v_proj(h))
            mask = torch.zeros(2, 1, SEQ, SEQ).masked_fill(pad[:, None, None, :], -1e4)
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            a = a.transpose(1, 2).reshape(2, SEQ, D)
            left, right = a.chunk(2, dim=-1)
            a = torch.cat([right, left], dim=-1)
            return x + self.out_proj(a)

    pad = torch.zeros(2, SEQ, dtype=torch.bool)
    pad[1, -2:] = True
    return FusedBlock().eval(), (_inputs(), pad)


def candidate(eps: float = 1e-5):
    import math

    import torch

    w = _weights()

    class DecomposedBlock(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gamma = torch.nn.Parameter(w["ln_w"].clone())
            self.beta = torch.nn.Parameter(w["ln_b"].clone())
            for name in "qkvo":
                self.register_parameter(f"w_{name}", torch.nn.Parameter(w[f"w{name}"].T.contiguous()))
                self.register_parameter(f"b_{name}", torch.nn.Parameter(w[f"b{name}"].clone()))

        def heads(self, t):
            return t.reshape(2, SEQ, HEADS, D // HEADS).permute(0, 2, 1, 3).contiguous()

        def forward(self, x, pad):
            mean = x.mean(-1, keepdim=True)
            var = ((x - mean) ** 2).mean(-1, keepdim=True)
            h = (x - mean) * torch.rsqrt(var + eps) * self.gamma + self.beta  # @eps
            v = self.heads(h @ self.w_v + self.b_v)
            q = self.heads(h @ self.w_q + self.b_q)
            k = self.heads(h @ self.w_k + self.b_k)
            scores = q @ k.transpose(-1, -2) / math.sqrt(D // HEADS)
            mask = torch.where(pad[:, None, None, :], torch.tensor(-1e4), torch.tensor(0.0))
            probs = (scores + mask).float().softmax(-1)
            a = (probs @ v).permute(0, 2, 1, 3).reshape(2, SEQ, D).clone()
            left, right = a.split(D // 2, dim=-1)
            a = torch.cat([right, left], dim=-1)
            return x + (a @ self.w_o + self.b_o)

    pad = torch.zeros(2, SEQ, dtype=torch.bool)
    pad[1, -2:] = True
    return DecomposedBlock().eval(), (_inputs(), pad)


def wrong_eps():
    """The candidate with its layer norm epsilon at 1e-3 against nn.LayerNorm's 1e-5."""
    return candidate(eps=1e-3)
