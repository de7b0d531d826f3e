"""Load real checkpoints, offline: GGUF files and HF safetensors directories.

API::

    from fuelpipe.weights import load_model, load_named

    model, tokenizer, report = load_named("smollm2_135m")           # or "gemma3_270m"
    model, tokenizer, report = load_model("path/to/model.gguf", dtype=torch.bfloat16)
    model, tokenizer, report = load_model("path/to/hf_dir")          # config.json + *.safetensors

    ids = tokenizer.encode("The capital of France is")                # BOS as the checkpoint asks
    out = InferenceContext(model, "fx").generate(ids, 32, stop_ids=tokenizer.stop_ids)
    print(tokenizer.decode(out.tokens), report.summary())

``load_model(source, dtype=torch.float32, device="cpu", with_tokenizer=True)``
returns a ``LoadedModel`` named tuple ``(model, tokenizer, report)``:

* ``model``: the registered family's model (``models.registry``), built on
  the meta device and filled with ``load_state_dict(assign=True)``;
* ``tokenizer``: a ``TextTokenizer`` (``encode``, ``decode``, ``stop_ids``,
  ``render_chat``/``encode_chat``), or None if not requested or the HF
  directory has no ``tokenizer.json``;
* ``report``: a ``LoadReport`` with per-phase times, total ``load_s``, the
  resident-memory peak during the load and the stored tensor types.

Accepted: ``.gguf`` files (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
Q4_K, Q5_K, Q6_K tensors, dequantized by ``fuelpipe.weights.dequant``) and
HF directories (``config.json`` naming one supported architecture, plus
``*.safetensors``). Pickle checkpoints (``.bin``, ``.pt``, ``.pth``,
``.ckpt``) are refused unread. Every refusal is a ``WeightsError`` subclass
(``fuelpipe.weights.errors``) naming the file and the problem.
"""
from fuelpipe.weights.errors import WeightsError
from fuelpipe.weights.load_report import LoadedModel, LoadReport
from fuelpipe.weights.loader import load_model, load_named
from fuelpipe.weights.named import NAMED, named_path
from fuelpipe.weights.tokenizer import TextTokenizer

__all__ = ["LoadReport", "LoadedModel", "NAMED", "TextTokenizer", "WeightsError", "load_model", "load_named",
           "named_path"]
