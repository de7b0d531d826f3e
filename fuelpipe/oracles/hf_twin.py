"""Hugging Face transformers twins of fuelpipe models: the external reference of ``vs_transformers``.

Each family states its twin in its own folder (``models/<family>/twin.py``,
registered as ``FamilyEntry.twin``), so an installed family can have one
too; here the twin is looked up by family name, built and loaded. For a
fuelpipe config, the family's twin writes the matching transformers config
from the config's *inputs* (window, ``max_window_layers``,
``sliding_window_pattern``, RoPE bases and scaling), so transformers derives
each layer's kind, window and RoPE frequencies on its own; nothing is copied
from the fuelpipe model's ``mask_plan`` or ``rope_plan``, and no fuelpipe RoPE
or mask code runs on the twin's side. Weights cross by checkpoint name
(``model.X`` there is ``X`` here).

transformers is optional: it is imported inside functions only, and
``unavailable_reason`` says why a twin cannot be built (not installed, too
old for ``rope_parameters``, or a family with no twin).
"""
from __future__ import annotations

import contextlib
import importlib
from typing import Optional

import torch

from fuelpipe.errors import FuelpipeError
from fuelpipe.family import TransformersTwin
from fuelpipe.rope import RopeScaling
from models.registry import families

MIN_TRANSFORMERS = 5  # rope_parameters (per-layer-kind RoPE) is the transformers-5 config layout
HF_COMMON = dict(attn_implementation="eager", pad_token_id=None, bos_token_id=1, eos_token_id=2)


class TwinError(FuelpipeError, ValueError):
    """A fuelpipe model has no faithful transformers twin (family, config value or weight name)."""


def _transformers():
    import transformers

    return transformers


def unavailable_reason(family_name: Optional[str] = None) -> Optional[str]:
    """Why no twin can be built here (None: it can)."""
    try:
        tf = _transformers()
    except ImportError as err:
        return f"transformers is not installed ({err}); pip install -e '.[test]' to compare against it"
    major = int(tf.__version__.split(".")[0])
    if major < MIN_TRANSFORMERS:
        return f"transformers {tf.__version__} is too old: the twin needs >= {MIN_TRANSFORMERS} (rope_parameters)"
    if family_name is not None:
        try:
            _twin(family_name)
        except TwinError as err:
            return str(err)
    return None


def rope_parameters(theta: float, scaling: RopeScaling = RopeScaling(), **extra) -> dict:
    """A transformers ``rope_parameters`` entry for one RoPE spec."""
    if scaling.kind == "none":
        params = {"rope_type": "default"}
    elif scaling.kind == "linear":
        params = {"rope_type": "linear", "factor": scaling.factor}
    elif scaling.kind == "llama3":
        params = {
            "rope_type": "llama3",
            "factor": scaling.factor,
            "low_freq_factor": scaling.low_freq_factor,
            "high_freq_factor": scaling.high_freq_factor,
            "original_max_position_embeddings": scaling.original_max_position_embeddings,
        }
    elif scaling.kind == "yarn":
        params = {
            "rope_type": "yarn",
            "factor": scaling.factor,
            "original_max_position_embeddings": scaling.original_max_position_embeddings,
            "beta_fast": scaling.beta_fast,
            "beta_slow": scaling.beta_slow,
            "truncate": scaling.truncate,
        }
        # transformers reads 0/absent alike for these; write only what is set
        params.update({k: getattr(scaling, k) for k in ("mscale", "mscale_all_dim") if getattr(scaling, k)})
        if scaling.attention_factor is not None:
            params["attention_factor"] = scaling.attention_factor
    else:
        raise TwinError(f"RoPE scaling kind {scaling.kind!r} has no transformers rope_type mapping")
    return {**params, "rope_theta": theta, **extra}


def geometry(c) -> dict:
    """The transformers config fields every Llama-shaped family spells the same way."""
    return dict(
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_hidden_layers,
        num_attention_heads=c.num_attention_heads,
        num_key_value_heads=c.num_key_value_heads,
        rms_norm_eps=c.rms_norm_eps,
        max_position_embeddings=c.max_position_embeddings,
    )


def twins() -> dict[str, TransformersTwin]:
    """Every registered family's twin (built-in and installed), by family name: each family's ``FamilyEntry.twin``."""
    return {name: entry.twin for name, entry in families().items() if entry.twin is not None}


def _twin(family_name: str) -> TransformersTwin:
    known = twins()
    if family_name not in known:
        raise TwinError(f"family {family_name!r} has no transformers twin; twinned: {', '.join(sorted(known))}")
    return known[family_name]


def hf_config(family_name: str, config):
    """The transformers config matching a fuelpipe config."""
    return _twin(family_name).config(config, _transformers())


def hf_class(family_name: str) -> type:
    return getattr(_transformers(), _twin(family_name).architecture)


def hf_model(family_name: str, config, *, init_weights: bool = True) -> torch.nn.Module:
    """The twin with the eager attention kernel; ``init_weights=False`` skips the random init (weights come next)."""
    skip = _no_init_weights() if not init_weights else contextlib.nullcontext()
    with skip:
        model = hf_class(family_name)(hf_config(family_name, config)).eval()
    if not init_weights:
        model.tie_weights()  # skipped with the initialisation; a tied head must share its embedding
    if model.config._attn_implementation != "eager":
        raise TwinError(f"the twin must run eager attention, got {model.config._attn_implementation!r}")
    return model


def _no_init_weights():
    """transformers' own switch that skips random initialisation (its home moved between versions)."""
    for owner in ("transformers.initialization", "transformers.modeling_utils"):
        try:
            mod = importlib.import_module(owner)
        except ImportError:
            continue
        if hasattr(mod, "no_init_weights"):
            return mod.no_init_weights()
    return contextlib.nullcontext()


def _tied_head(hf: torch.nn.Module) -> bool:
    out = hf.get_output_embeddings()
    return out is not None and out.weight.data_ptr() == hf.get_input_embeddings().weight.data_ptr()


@torch.no_grad()
def load_from_hf(model: torch.nn.Module, hf: torch.nn.Module) -> None:
    """Copy the twin's weights into a fuelpipe model by checkpoint name; a tied ``lm_head`` it does not own is dropped."""
    ours = model.state_dict()
    mapped = {}
    for name, t in hf.state_dict().items():
        name = name.removeprefix("model.")
        if name == "lm_head.weight" and name not in ours:
            if not _tied_head(hf):
                raise TwinError("the twin's lm_head is untied but the fuelpipe model has no lm_head to hold it")
            continue
        mapped[name] = t.clone()
    model.load_state_dict(mapped, strict=True)


@torch.no_grad()
def load_into_hf(hf: torch.nn.Module, model: torch.nn.Module) -> None:
    """Copy a fuelpipe model's weights into its twin; every tensor on both sides must find its counterpart."""
    from fuelpipe.quant.modules import dense_state_dict

    ours = dense_state_dict(model)  # a low-bit model's matrices as the f32 values they stand for
    theirs = hf.state_dict()
    mapped, unused = {}, set(ours)
    for name, t in theirs.items():
        key = name.removeprefix("model.")
        if key in ours:
            if ours[key].shape != t.shape:
                raise TwinError(f"weight {key!r}: fuelpipe shape {list(ours[key].shape)}, twin {list(t.shape)}")
            mapped[name] = ours[key]
            unused.discard(key)
        elif name == "lm_head.weight" and _tied_head(hf):
            continue  # tied to the embedding, which is copied
        else:
            raise TwinError(f"the twin's weight {name!r} has no fuelpipe counterpart {key!r}")
    if unused:
        raise TwinError(f"fuelpipe weights the twin would not read: {sorted(unused)}")
    tied = _tied_head(hf)
    # Tensors already in the twin's dtype are shared, not copied: on a real checkpoint a copy doubles the
    # memory the check needs (the twin's own, never-initialised storage is never touched, so never resident).
    share = all(mapped[n].dtype == t.dtype and mapped[n].device == t.device for n, t in theirs.items() if n in mapped)
    hf.load_state_dict(mapped, strict=False, assign=share)
    if tied and share:
        hf.tie_weights()  # the head follows the embedding it was tied to


def twin_of(model) -> torch.nn.Module:
    """The transformers twin of a fuelpipe model: its config, its weights, on its device, computing in float32.

    A bfloat16 model's weights upcast to float32 exactly, so the twin computes the exact math of the very
    same weights and a comparison measures the fuelpipe side's rounding alone (a bfloat16 twin would add
    its own, about as large, on a real checkpoint).
    """
    device = next(model.parameters()).device
    hf = hf_model(model.family, model.config, init_weights=False).to(device=device, dtype=torch.float32)
    load_into_hf(hf, model)
    return hf
