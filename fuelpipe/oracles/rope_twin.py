"""fuelpipe's RoPE tables for every scaling kind against transformers' own, at one model's rotary width.

A model's config reaches one scaling kind (most tiny configs: none), so its logits
against the transformers twin say nothing about the others: a YaRN attention factor
dropped, a llama3 band boundary moved or a linear factor applied twice would pass
every gate run that does not load such a checkpoint. This check needs no weights:
for each scaling in ``variants`` it builds fuelpipe's host tables (``rope_tables``,
what decode rebinds every token: frequencies *and* the cos/sin factor) and the
tables transformers derives from the same ``rope_parameters`` (its
``ROPE_INIT_FUNCTIONS``: inverse frequencies and attention scaling), at the model's
base and rotary width, over positions past the original context, and compares them.

Tolerance: both sides compute ``position x inverse frequency`` in float32, so the
phases differ by float rounding only: ``TABLE_ATOL`` at up to ``POSITIONS`` positions
(the angle's own rounding is ~1.5e-5 rad there), inverse frequencies to ``FREQ_RTOL``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from fuelpipe.oracles import hf_twin
from fuelpipe.rope import RopePlan, RopeScaling, RopeSpec, rope_tables

ORIGINAL = 64  # the original context the scalings stretch
POSITIONS = 4 * ORIGINAL  # positions compared: the stretched context
TABLE_ATOL = 1e-4
FREQ_RTOL = 1e-5


def variants() -> dict[str, RopeScaling]:
    """One scaling per kind and per YaRN branch (derived factor, mscale ratio, explicit factor, no truncation)."""
    return {
        "linear x4": RopeScaling("linear", 4.0),
        "llama3 x8": RopeScaling("llama3", 8.0, 1.0, 4.0, ORIGINAL),
        "yarn x4": RopeScaling("yarn", 4.0, original_max_position_embeddings=ORIGINAL),
        "yarn x4 mscale 1/0.5": RopeScaling("yarn", 4.0, original_max_position_embeddings=ORIGINAL, mscale=1.0,
                                            mscale_all_dim=0.5),
        "yarn x4 attention_factor 1.3": RopeScaling("yarn", 4.0, original_max_position_embeddings=ORIGINAL,
                                                    attention_factor=1.3),
        "yarn x8 beta 16/2 untruncated": RopeScaling("yarn", 8.0, original_max_position_embeddings=ORIGINAL,
                                                     beta_fast=16.0, beta_slow=2.0, truncate=False),
    }


@dataclass(frozen=True)
class RopeComparison:
    name: str
    ok: bool
    table_err: float  # max |cos/sin fuelpipe - transformers| over POSITIONS
    freq_err: float  # max relative inverse-frequency difference
    factor: tuple[float, float]  # (fuelpipe's cos/sin factor, transformers' attention scaling)

    def seen(self) -> str:
        return (f"{self.name}: tables {self.table_err:.2g} (allowed {TABLE_ATOL:g}), frequencies {self.freq_err:.2g} "
                f"(allowed {FREQ_RTOL:g}), factor {self.factor[0]:.6g} vs {self.factor[1]:.6g}")


def _transformers_rope(theta: float, rotary_dim: int, scaling: RopeScaling) -> tuple[torch.Tensor, float]:
    """transformers' inverse frequencies [rotary_dim / 2] and attention scaling for one scaling."""
    import transformers
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = hf_twin.rope_parameters(theta, scaling)
    config = transformers.LlamaConfig(hidden_size=2 * rotary_dim, num_attention_heads=2, num_key_value_heads=2,
                                      head_dim=rotary_dim, max_position_embeddings=max(POSITIONS, round(scaling.factor * ORIGINAL)),
                                      rope_parameters=params)
    inv_freq, attention = ROPE_INIT_FUNCTIONS[params["rope_type"]](config, torch.device("cpu"))
    return inv_freq.float(), float(attention)


def compare_scalings(theta: float, rotary_dim: int) -> list[RopeComparison]:
    """Each of ``variants()`` at this base and width: fuelpipe's tables against transformers'."""
    out = []
    for name, scaling in variants().items():
        spec = RopeSpec(theta, rotary_dim, scaling)
        cos, sin = rope_tables(RopePlan.uniform(spec, 1), POSITIONS)  # [1, P, rot]: what decode rebinds
        inv_freq, attention = _transformers_rope(theta, rotary_dim, scaling)
        freqs = torch.outer(torch.arange(POSITIONS, dtype=torch.float32), inv_freq)  # [P, rot/2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [P, rot]
        table_err = float(torch.maximum((cos[0] - emb.cos() * attention).abs().max(),
                                        (sin[0] - emb.sin() * attention).abs().max()))
        freq_err = float(((spec.inv_freq() - inv_freq).abs() / inv_freq.abs()).max())
        factor = float(cos[0, 0, 0])  # cos(0) x factor: the factor decode's rows carry
        ok = table_err <= TABLE_ATOL and freq_err <= FREQ_RTOL
        out.append(RopeComparison(name, ok, table_err, freq_err, (factor, attention)))
    return out
