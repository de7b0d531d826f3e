"""``fuelpipe serve`` through the official openai client on localhost: completions and chats equal the text
API's, streams join to the whole text, concurrent greedy requests equal their solo runs, bad requests are
answered 400 naming the value, a client gone mid-stream frees its row, and the CLI stops on Ctrl-C with 130.

The server runs in-process on port 0 over the tiny random GGUF Llama of the text API tests (a byte-level
tokenizer; a small chat template is added). The oracle is ``TextModel`` on a second load of the same file.
"""
from __future__ import annotations

import dataclasses
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

openai = pytest.importorskip("openai", reason="the serve tests talk to the server through the openai client: pip install -e \".[test]\" installs it")

import fuelpipe  # noqa: E402
from conftest import ROOT  # noqa: E402
from fuelpipe.api import TextModel  # noqa: E402
from fuelpipe.context import InferenceContext  # noqa: E402
from fuelpipe.oracles.faults import Fault  # noqa: E402
from fuelpipe.oracles.faulty import policy_for  # noqa: E402
from fuelpipe.serve import EngineSpec, Server  # noqa: E402
from models.registry import build_random_model  # noqa: E402
from _support.weights_helpers import write_llama_gguf  # noqa: E402

MODEL = "tiny"
ROW = 256  # positions per request
TEMPLATE = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
            "{% if add_generation_prompt %}<a>{% endif %}")
PROMPT = "Hello world"
PROMPTS = [f"Prompt {i}: " + "ab" * i for i in range(6)]


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    return write_llama_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", build_random_model("llama", "tiny", seed=5))


def with_template(tm: TextModel) -> TextModel:
    return TextModel(tm.context, dataclasses.replace(tm.tokenizer, chat_template=TEMPLATE))


@pytest.fixture(scope="module")
def oracle(tiny_gguf) -> TextModel:
    """The text API on its own load of the checkpoint (the server's model belongs to its engine thread)."""
    return with_template(fuelpipe.load(tiny_gguf, backend="eager"))


def serve(tm: TextModel, max_batch: int = 4) -> Server:
    return Server(tm, MODEL, EngineSpec(max_batch, ROW), port=0).start()


@pytest.fixture(scope="module")
def server(tiny_gguf):
    srv = serve(with_template(fuelpipe.load(tiny_gguf, backend="fx")))
    yield srv
    srv.close()


@pytest.fixture
def client(server) -> "openai.OpenAI":
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def chat_of(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


# ---- answers equal the text API's ----------------------------------------------------------
def test_models_and_health(client, server):
    assert [m.id for m in client.models.list().data] == [MODEL]
    health = json.loads(raw(server, "GET", "/health")[1])
    assert health["status"] == "ok" and health["max_batch"] == 4 and health["row_positions"] == ROW


def test_completion_is_the_text_api_generate(client, oracle):
    got = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=20)
    want = oracle.generate(PROMPT, max_new_tokens=20)
    assert got.choices[0].text == want.text and got.choices[0].finish_reason == "length"
    assert (got.usage.prompt_tokens, got.usage.completion_tokens) == (want.prompt_tokens, 20)
    stop = want.text[5:7]
    cut = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=20, stop=[stop])
    assert cut.choices[0].text == want.text[:want.text.find(stop)] and cut.choices[0].finish_reason == "stop"
    assert cut.usage.completion_tokens < 20


def test_chat_completion_is_the_text_api_chat(client, oracle):
    got = client.chat.completions.create(model=MODEL, messages=chat_of("What is 2+2?"), max_tokens=12)
    want = oracle.chat(chat_of("What is 2+2?"), max_new_tokens=12)
    assert got.choices[0].message.content == want.text and got.choices[0].message.role == "assistant"
    assert got.usage.prompt_tokens == want.prompt_tokens == len("<user>What is 2+2?<a>")
    other = client.chat.completions.create(model=MODEL, messages=chat_of("What is 3+3?"), max_tokens=12)
    assert other.choices[0].message.content != got.choices[0].message.content  # the control: the prompt matters


def test_seeded_sampling_is_the_text_api_sampler(client, oracle):
    settings = {"temperature": 1.0, "top_p": 0.9, "seed": 3}
    got = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, extra_body={"min_p": 0.02},
                                    **settings)
    want = oracle.generate(PROMPT, max_new_tokens=16, min_p=0.02, **settings)
    assert got.choices[0].text == want.text
    other = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, extra_body={"min_p": 0.02},
                                      **{**settings, "seed": 4})
    assert other.choices[0].text != want.text  # the control: another seed draws other tokens


def test_repetition_penalty_sees_the_prompt(client, oracle):
    prompt = PROMPT + oracle.generate(PROMPT, max_new_tokens=4).text  # the model's own next tokens, now penalised
    got = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0,
                                    extra_body={"repetition_penalty": 1.5})
    want = oracle.generate(prompt, max_new_tokens=12, repetition_penalty=1.5)
    assert got.choices[0].text == want.text
    assert want.text != oracle.generate(prompt, max_new_tokens=12).text  # the control: the penalty changes it


def test_stream_chunks_join_to_the_whole_text(client):
    whole = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24)
    chunks = list(client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24, stream=True,
                                            stream_options={"include_usage": True}))
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert len([t for t in texts if t]) > 1 and "".join(texts) == whole.choices[0].text
    assert chunks[-2].choices[0].finish_reason == "length" and chunks[-1].usage == whole.usage
    messages = chat_of("Count")
    reply = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=24)
    deltas = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=24, stream=True))
    assert deltas[0].choices[0].delta.role == "assistant"
    assert "".join(d.choices[0].delta.content or "" for d in deltas) == reply.choices[0].message.content
    assert deltas[-1].choices[0].finish_reason == "length"


# ---- concurrency ---------------------------------------------------------------------------
def concurrent_texts(url: str, bad: bool = False) -> list[str]:
    """PROMPTS sent at once from threads (each 96 greedy tokens), with bad requests among them when ``bad``."""
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
    out: list = [None] * len(PROMPTS)
    gate = threading.Barrier(len(PROMPTS) + bad)

    def one(i: int) -> None:
        gate.wait()
        out[i] = client.completions.create(model=MODEL, prompt=PROMPTS[i], max_tokens=96).choices[0].text

    def refused() -> None:
        gate.wait()
        for _ in range(3):
            with pytest.raises(openai.BadRequestError):
                client.completions.create(model=MODEL, prompt="x" * (ROW + 1), max_tokens=4)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(PROMPTS))]
    threads += [threading.Thread(target=refused)] if bad else []
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_concurrent_greedy_requests_equal_their_solo_runs(server, client, oracle):
    solo = [client.completions.create(model=MODEL, prompt=p, max_tokens=96).choices[0].text for p in PROMPTS]
    assert solo == [oracle.generate(p, max_new_tokens=96).text for p in PROMPTS]
    before = server.engine.counts["refused"]
    assert concurrent_texts(server.url, bad=True) == solo
    assert server.engine.counts["peak_batch"] >= 2  # they did share batched steps
    assert server.engine.counts["refused"] == before + 3


def test_batch_vs_solo_catches_rows_sharing_a_position(tiny_gguf, oracle):
    """The negative control: a batched step whose rows all read row 0's position answers differently."""
    tm = with_template(fuelpipe.load(tiny_gguf, backend="fx"))
    faulty = TextModel(InferenceContext(tm.model, "fx", policy=policy_for(Fault.SHARED_BATCH_POSITION)), tm.tokenizer)
    srv = serve(faulty)
    try:
        got = concurrent_texts(srv.url)
    finally:
        srv.close()
    assert srv.engine.counts["peak_batch"] >= 2
    assert got != [oracle.generate(p, max_new_tokens=96).text for p in PROMPTS]


# ---- refusals ------------------------------------------------------------------------------
def raw(server: Server, method: str, path: str, body: bytes | None = None) -> tuple[int, str]:
    host, port = server.httpd.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=60)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, response.read().decode()
    finally:
        conn.close()


OK = {"model": MODEL, "prompt": PROMPT, "max_tokens": 4}
OK_CHAT = {"model": MODEL, "messages": chat_of("hi"), "max_tokens": 4}


@pytest.mark.parametrize("path, body, status, param, message", [
    ("/v1/completions", {**OK, "temperature": -1}, 400, "temperature",
     "temperature must be >= 0 (0 = greedy), got -1"),
    ("/v1/completions", {**OK, "max_tokens": 0}, 400, "max_tokens", "max_tokens must be an integer >= 1, got 0"),
    ("/v1/completions", {**OK, "max_tokens": "8"}, 400, "max_tokens", 'must be an integer >= 1, got "8"'),
    ("/v1/completions", {**OK, "top_p": 1.5}, 400, "top_p", "top_p must lie in (0, 1] (1 = off), got 1.5"),
    ("/v1/completions", {**OK, "n": 2}, 400, "n", "n=2 is not supported by fuelpipe serve (only 1)"),
    ("/v1/completions", {**OK, "frequency_penalty": 0.5}, 400, "frequency_penalty", "frequency_penalty=0.5 is not"),
    ("/v1/completions", {**OK, "stop": [""]}, 400, "stop",
     'stop must be a non-empty string or a list of them, got [""]'),
    ("/v1/completions", {**OK, "colour": "red"}, 400, "colour", "unrecognized request argument supplied: colour"),
    ("/v1/completions", {**OK, "prompt": 7}, 400, "prompt", "prompt must be a string (one prompt), got int 7"),
    ("/v1/completions", {k: v for k, v in OK.items() if k != "prompt"}, 400, "prompt", "prompt is required"),
    ("/v1/completions", {**OK, "prompt": "x" * ROW}, 400, "max_tokens",
     f"{ROW + 3} positions ({ROW}-token prompt + max_new_tokens 4 - 1), more than a batch row holds ({ROW} positions)"),
    ("/v1/completions", {**OK, "model": "gpt-4"}, 404, "model",
     "the model 'gpt-4' does not exist; this server serves 'tiny'"),
    ("/v1/chat/completions", {**OK_CHAT, "messages": []}, 400, "messages", "messages must be a non-empty list, got []"),
    ("/v1/chat/completions", {**OK_CHAT, "messages": [{"content": "hi"}]}, 400, "messages[0]",
     'messages[0] must be an object with a string role, got {"content": "hi"}'),
    ("/v1/chat/completions", {**OK_CHAT, "max_completion_tokens": -3}, 400, "max_completion_tokens",
     "max_completion_tokens must be an integer >= 1, got -3"),
    ("/v1/chat/completions", {**OK_CHAT, "messages": chat_of("x" * ROW)}, 400, "max_tokens",
     "more than a batch row holds"),
])
def test_bad_requests_are_answered_with_the_value(server, path, body, status, param, message):
    code, text = raw(server, "POST", path, json.dumps(body).encode())
    error = json.loads(text)["error"]
    assert (code, error["param"]) == (status, param), error
    assert message in error["message"] and error["type"] == "invalid_request_error"


def test_the_openai_client_sees_400_and_404(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=chat_of("hi"), max_tokens=4, temperature=-0.5)
    assert e.value.status_code == 400 and "got -0.5" in e.value.message
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="gpt-4", prompt=PROMPT, max_tokens=4)
    assert e.value.body["code"] == "model_not_found"


def test_bad_json_and_unknown_paths(server):
    code, text = raw(server, "POST", "/v1/completions", b'{"model": "tiny", "prompt": ')
    assert code == 400 and "not valid JSON" in json.loads(text)["error"]["message"]
    code, text = raw(server, "POST", "/v1/completions", b"[1, 2]")
    assert code == 400 and "must be a JSON object, got list [1, 2]" in json.loads(text)["error"]["message"]
    code, text = raw(server, "GET", "/v2/models")
    assert code == 404 and "unknown path '/v2/models'" in json.loads(text)["error"]["message"]
    assert raw(server, "POST", "/v1/embeddings", b"{}")[0] == 404
    assert raw(server, "GET", "/v1/completions")[0] == 405
    assert raw(server, "GET", "/v1/models")[0] == 200  # the control: a known path


def test_a_client_gone_mid_stream_frees_its_row(server, client, monkeypatch):
    decoder = server.engine.decoder
    step = decoder.step

    def slow_step(rows, tokens):  # 20 ms a step: the 200-token request would run 4 s
        time.sleep(0.02)
        return step(rows, tokens)

    monkeypatch.setattr(decoder, "step", slow_step)
    before = dict(server.engine.counts)
    stream = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=200, stream=True)
    pieces = iter(stream)
    next(pieces), next(pieces)
    stream.close()  # the client goes away
    left = time.monotonic() + 2.0
    while server.engine.stats()["in_flight"] and time.monotonic() < left:
        time.sleep(0.02)
    assert server.engine.stats()["in_flight"] == 0 and server.engine.counts["cancelled"] == before["cancelled"] + 1
    assert server.engine.counts["tokens"] - before["tokens"] < 100  # freed long before its 200 tokens
    after = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4)
    assert after.choices[0].finish_reason == "length"


# ---- the command ---------------------------------------------------------------------------
@pytest.mark.parametrize("sig, code, said", [(signal.SIGINT, 130, "interrupted (Ctrl-C)"),
                                             (signal.SIGTERM, 0, "terminated (SIGTERM)")], ids=["sigint", "sigterm"])
def test_the_cli_serves_and_stops_on_a_signal(tiny_gguf, tmp_path, sig, code, said):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.Popen([sys.executable, "-m", "fuelpipe", "serve", "--model", str(tiny_gguf), "--port", "0",
                             "--max-seq-len", str(ROW), "--quiet"], cwd=tmp_path, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        line = proc.stdout.readline()  # "fuelpipe serve: tiny.gguf at http://127.0.0.1:PORT/v1 ..."
        assert " at http://" in line, (line, proc.stderr.read() if proc.poll() is not None else "")
        url = line.split(" at ")[1].split()[0]
        client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=60)
        got = client.completions.create(model="tiny.gguf", prompt=PROMPT, max_tokens=5)
        assert got.usage.completion_tokens == 5
        os.killpg(proc.pid, sig)  # the whole group, as a terminal's Ctrl-C
        exit_code = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    err = proc.stderr.read()
    assert exit_code == code, err
    assert "Traceback" not in err and f"{said}; stopped after 1 requests" in err
