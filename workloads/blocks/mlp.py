"""The dense MLP block: pre-norm, fc1 (gate and up fused for SwiGLU), activation (GELU,
SwiGLU, squared ReLU), fc2, residual; column- then row-parallel over TP."""

from __future__ import annotations

from . import kernels as kn
from .base import Block, RankParams, mlp_matrices, mlp_params, mlp_rank_params

__all__ = ["DenseMLPBlock"]


class DenseMLPBlock(Block):
    """A dense feed-forward block of ``model.ffn_hidden_size``."""

    kind = "mlp"
    RECOMPUTE = {"mlp_norm": "layernorm", "fc1": "mlp", "mlp_act": "mlp", "fc2": "mlp"}

    def graph_scope(self, name: str) -> str:
        return "mlp"

    def params(self, *, active: bool = False) -> dict[str, int]:
        return {"mlp": mlp_params(self.model, self.model.ffn_hidden_size)}

    def rank_params(self, parallel) -> RankParams:
        p, gemm = mlp_rank_params(self.model, self.model.ffn_hidden_size, parallel.tp)
        return RankParams(0.0 + p, 0.0, 0.0 + gemm, 0.0)

    def add_kernels(self, ops, sh, args) -> None:
        model, L = self.model, self.layer
        h = model.hidden_size
        eager = args.fusion.eager
        ops.pair(kn.eager_norm("mlp_norm", L, sh.Tn, h) if eager else kn.norm("mlp_norm", L, sh.Tn, h))
        m1 = 2 if model.mlp == "swiglu" else 1
        f_local = model.ffn_hidden_size / sh.tp
        ops.linear("fc1", sh.T, int(m1 * f_local), h)
        if eager and model.mlp == "swiglu":
            ops.pair(kn.eager_activation("mlp_act", L, sh.T, int(f_local)))
        else:
            ops.pair(kn.activation("mlp_act", L, sh.T, int(f_local), model.mlp))
        ops.linear("fc2", sh.T, h, int(f_local))
        residual = kn.eager_residual if eager else kn.residual
        ops.pair(residual("mlp_residual", L, sh.Tn, h, model.dropout))

    def activation_terms(self, d, modules, out) -> None:
        m = self.model
        if "layernorm" not in modules:
            out["ffn_input"] = d.tok_sp * m.hidden_size * d.lb
        if "mlp" not in modules:
            gate = 2 if m.mlp == "swiglu" else 1
            f = m.ffn_hidden_size / d.t
            out["mlp_fc1_output"] = d.tok * gate * f * d.e
            out["mlp_fc2_input"] = d.tok * f * d.lb

    def mc_flops_per_token(self, seq_len: int) -> float:
        """``6 m h f`` (``m`` = 3 SwiGLU, 2 GELU / squared ReLU)."""
        m = self.model
        return 6 * mlp_matrices(m) * m.hidden_size * m.ffn_hidden_size

    def mc_hybrid_forward_per_token(self, seq_len: int) -> float:
        """Megatron-Core's ``hybrid_flops`` forward count per token: ``4 h f`` (x 3/2 for SwiGLU)."""
        m = self.model
        return 4 * m.hidden_size * m.ffn_hidden_size * (1.5 if m.mlp == "swiglu" else 1.0)

    def ffn_width(self) -> float:
        return self.model.ffn_hidden_size
