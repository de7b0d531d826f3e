"""The systems the peers benchmark times: fuelpipe configurations and the peers users would pick instead.

Each system turns (prompt ids, number of new tokens) into a ``RunTrace``
through its own public generation loop, greedy, on the threads the process
was given. ``setup`` loads what the system needs (its weights, a held plan
is built lazily on its first token, as a user would see it); ``details``
reports build and compile costs, kept apart from per-token time.
"""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from fuelpipe.bench.peers.trace import RunTrace, TokenClock
from fuelpipe.context import InferenceContext
from fuelpipe.modes import PlanMode
from fuelpipe.kv.spec import KvSpec
from fuelpipe.plan.backends import BackendSpec


class PeerSystem:
    name: str = ""
    group: str = ""  # fuelpipe | transformers | llama.cpp
    weights: str = "f32"  # the arithmetic the system runs: f32 (dequantized from the GGUF) or q4_1
    missing: Optional[str] = None  # why the system cannot run here (reported, never an error)
    max_new_tokens: Optional[int] = None  # a cap on new tokens (replan rows: building every token is slow)

    def setup(self) -> None:
        """Load what the system needs; called once, before any timed run."""

    def run(self, prompt: list[int], new_tokens: int) -> RunTrace:
        raise NotImplementedError

    def details(self) -> dict:
        return {}


def _kernel_path(path: Optional[str]):
    if path is None:
        return contextlib.nullcontext()
    from fuelpipe.kernels.build import forced_vector_path

    return forced_vector_path(path)


def _prefetch(nbytes: Optional[int]):
    if nbytes is None:
        return contextlib.nullcontext()
    from fuelpipe.kernels.build import forced_f32_prefetch

    return forced_f32_prefetch(nbytes)


class FuelpipeSystem(PeerSystem):
    group = "fuelpipe"

    def __init__(self, model, backend: BackendSpec, plan: str, kv: KvSpec, max_new_tokens: Optional[int] = None,
                 vector_path: Optional[str] = None, f32_prefetch: Optional[int] = None) -> None:
        self.model, self.backend, self.plan, self.kv = model, backend, plan, kv
        self.vector_path = vector_path  # the kernels' path forced while this row runs (None: their own choice)
        self.f32_prefetch = f32_prefetch  # the f32 kernel's prefetch bytes forced while it runs (None: measured)
        self.name = f"fuelpipe {backend.name} {plan} {kv.layout}"
        self.max_new_tokens = max_new_tokens
        self.ctx = InferenceContext(model, backend, PlanMode.parse(plan))

    def run(self, prompt: list[int], new_tokens: int) -> RunTrace:
        clock = TokenClock()
        cache = self.kv.new_cache(self.ctx, len(prompt) + new_tokens - 1)  # a new allocation per request
        with _kernel_path(self.vector_path), _prefetch(self.f32_prefetch):
            clock.start()
            self.ctx.generate(prompt, new_tokens, cache=cache, on_token=clock.token)
        return clock.trace()

    def details(self) -> dict:
        s = self.ctx.plan.stats
        session = self.ctx.plan.session
        return {
            "plan_builds": s.builds,
            "plan_rebinds": s.rebinds,
            "plan_build_ms": 1000.0 * s.build_s / max(1, s.builds),
            "plan_nodes": None if session is None else session.node_count,
            "fx_passes": list(self.backend.fx_passes) if self.backend.name != "eager" else [],
            "f32_prefetch_bytes": self.f32_prefetch if self.f32_prefetch is not None else _measured_prefetch(),
        }


def _measured_prefetch() -> Optional[int]:
    from fuelpipe.kernels.build import KernelBuildError, f32_prefetch_bytes

    try:
        return f32_prefetch_bytes()
    except KernelBuildError:  # no compiler here: the f32 rows ran on torch's own linears
        return None


class TransformersSystem(PeerSystem):
    """Hugging Face transformers ``generate`` on the same GGUF (its own loader, dequantized to f32).

    Modes: ``dynamic`` (DynamicCache, sdpa), ``static`` (StaticCache), ``static_compile``
    (StaticCache with generate's own torch.compile of the decode forward, forced on CPU).
    """

    group = "transformers"
    MODES = ("dynamic", "static", "static_compile")

    def __init__(self, gguf_path: Path, mode: str, shared: dict) -> None:
        if mode not in self.MODES:
            raise ValueError(f"transformers mode must be one of {self.MODES}, got {mode!r}")
        self.path, self.mode, self._shared = gguf_path, mode, shared
        self.name = f"transformers {mode.replace('_', '+')}"
        self.missing = transformers_missing()

    def setup(self) -> None:
        self.model = shared_hf_model(self.path, self._shared)

    def _generate_kwargs(self) -> dict:
        return generate_kwargs(self.mode)

    def run(self, prompt: list[int], new_tokens: int) -> RunTrace:
        from transformers.generation.streamers import BaseStreamer

        clock = TokenClock()

        class Stamps(BaseStreamer):
            seen_prompt = False

            def put(self, value):
                if not self.seen_prompt:  # generate pushes the prompt first
                    self.seen_prompt = True
                    return
                clock.token(int(value.reshape(-1)[0]))

            def end(self):
                pass

        ids = torch.tensor([prompt])
        clock.start()
        with torch.no_grad():
            self.model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                streamer=Stamps(), **self._generate_kwargs(),
            )
        return clock.trace()


class LlamaCppSystem(PeerSystem):
    """llama.cpp through llama-cpp-python: prompt eval, then one ``eval`` per token, greedy argmax."""

    group = "llama.cpp"

    def __init__(self, gguf_path: Optional[Path], label: str, weights: str, threads: int, n_ctx: int) -> None:
        self.path, self.threads, self.n_ctx = gguf_path, threads, n_ctx
        self.name, self.weights = f"llama.cpp {label}", weights
        try:
            import llama_cpp  # noqa: F401
        except ImportError:
            self.missing = "not installed: pip install llama-cpp-python (builds from source, ~9 min on 2 cores)"

    def setup(self) -> None:
        from llama_cpp import Llama

        self.llm = Llama(
            model_path=str(self.path), n_threads=self.threads, n_threads_batch=self.threads,
            n_ctx=self.n_ctx, n_batch=self.n_ctx, verbose=False,
        )

    def run(self, prompt: list[int], new_tokens: int) -> RunTrace:
        llm = self.llm
        clock = TokenClock()
        llm.reset()
        clock.start()
        llm.eval(prompt)
        n_vocab = llm.n_vocab()
        for i in range(new_tokens):
            # The last evaluated position's logits, read in place (llama-cpp-python keeps ``scores``
            # only with logits_all=True, which would copy every prompt row too).
            logits = np.ctypeslib.as_array(llm._ctx.get_logits_ith(-1), shape=(n_vocab,))
            token = int(np.argmax(logits))
            clock.token(token)
            if i < new_tokens - 1:
                llm.eval([token])
        return clock.trace()


def generate_kwargs(mode: str) -> dict:
    """Greedy ``generate`` keyword arguments for a transformers cache mode: dynamic, static, static_compile."""
    import transformers

    kw: dict = dict(do_sample=False, top_p=None, top_k=None, temperature=None)
    if mode == "dynamic":
        kw["disable_compile"] = True
    else:
        kw["cache_implementation"] = "static"
    if mode == "static":
        kw["disable_compile"] = True
    if mode == "static_compile":
        cc = transformers.CompileConfig(fullgraph=True, mode="default")
        cc._compile_all_devices = True  # generate only auto-compiles on accelerators unless told
        kw["compile_config"] = cc
    return kw


def transformers_missing() -> Optional[str]:
    """Why transformers cannot run here (its GGUF loading needs accelerate too), or None."""
    try:
        import accelerate  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as err:
        return f"not installed ({err.name}): pip install -e '.[test]'"
    return None


def shared_hf_model(gguf_path: Path, shared: dict):
    """transformers' own load of the GGUF (dequantized to f32), once per ``shared`` dict: every mode uses it."""
    if "model" not in shared:
        import transformers

        shared["model"] = transformers.AutoModelForCausalLM.from_pretrained(
            gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32, attn_implementation="sdpa").eval()
    return shared["model"]
