"""What the HTTP handlers share: the model's tokenizer, the engine, the served model's id.

``start`` turns a checked request into a running ``TextRun``: the prompt encoded (a chat through the model's
chat template, as ``TextModel.chat`` does), ``max_tokens`` resolved, the request queued on the engine and its
admission awaited, so a request that can never fit is answered 400 before any response byte is sent.
"""
from __future__ import annotations

import time

from fuelpipe.api import TextModel
from fuelpipe.batch import Request
from fuelpipe.errors import InputError
from fuelpipe.serve.engine import Engine, EngineStopped
from fuelpipe.serve.openai_request import ApiError, GenerationSpec
from fuelpipe.serve.openai_response import Responder, model_card, model_list
from fuelpipe.serve.text_run import TextRun
from fuelpipe.weights.errors import WeightsError


class ServeApp:
    def __init__(self, model: TextModel, engine: Engine, model_id: str) -> None:
        self.model, self.engine, self.model_id = model, engine, model_id
        self.created = int(time.time())

    def models(self) -> dict:
        return model_list(self.model_id, self.created)

    def model(self, model_id: str) -> dict:
        self._check_model(model_id)
        return model_card(self.model_id, self.created)

    def health(self) -> dict:
        return {"status": "ok", "model": self.model_id, **self.engine.stats()}

    def start(self, spec: GenerationSpec) -> tuple[Responder, TextRun]:
        self._check_model(spec.model)
        ids = self._encode(spec)
        max_tokens = spec.max_tokens
        if max_tokens is None:  # the rest of the row (a prompt that fills it is refused below)
            max_tokens = max(1, self.engine.width - len(ids) + 1)
        responder = Responder(spec.kind, self.model_id)
        tok = self.model.tokenizer
        ticket = self.engine.submit(Request(tuple(ids), max_tokens, tok.stop_ids, spec.sampling, responder.id))
        refusal = ticket.refusal()
        if refusal is not None:
            if isinstance(refusal.error, EngineStopped):
                raise ApiError(503, str(refusal.error), type="server_error")
            if refusal.reason == "error":
                raise ApiError(500, f"internal error: {refusal.error!r}", type="server_error")
            where = ("max_tokens" if spec.max_tokens is not None else "prompt" if spec.kind == "completion"
                     else "messages")
            raise ApiError(400, f"the request does not fit: {refusal.error}", param=where)
        return responder, TextRun(self.engine, ticket, tok.decode, spec.stop, len(ids))

    def _check_model(self, model_id: str) -> None:
        if model_id != self.model_id:  # OpenAI answers an unknown model 404, code model_not_found
            raise ApiError(404, f"the model {model_id!r} does not exist; this server serves {self.model_id!r}",
                           param="model", code="model_not_found")

    def _encode(self, spec: GenerationSpec) -> list[int]:
        tok = self.model.tokenizer
        if spec.kind == "completion":
            ids = tok.encode(spec.prompt)
            if not ids:
                raise ApiError(400, f"the prompt {spec.prompt!r} encodes to no tokens", param="prompt")
            return ids
        if not tok.chat_template:
            raise ApiError(400, f"chat needs a chat template, and the model's checkpoint ({tok.source.name}) carries "
                                "none; use /v1/completions", param="messages")
        try:
            return tok.encode_chat(list(spec.messages))
        except (InputError, WeightsError) as err:  # the template refused the messages, or failed to render
            raise ApiError(400, str(err), param="messages") from None
