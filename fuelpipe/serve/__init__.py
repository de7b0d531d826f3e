"""``fuelpipe serve``: an OpenAI-compatible HTTP server on the continuous batcher (docs/serving.md).

engine.py owns the model on one thread; openai_request.py / openai_response.py are the wire format;
text_run.py turns a request's tokens into text; app.py and server.py answer HTTP; cli.py is the command.
"""
from fuelpipe.serve.engine import Engine, EngineSpec
from fuelpipe.serve.server import Server

__all__ = ["Engine", "EngineSpec", "Server"]
