"""envkit train --push-to-hub is checked before the model loads: transformers creates the Hub repository only when
the trainer is built, and a missing token or an unreachable Hub then ended the run in a traceback. Through the real
huggingface_hub client, against a Hub that is not there, one that refuses the token, and offline mode."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import huggingface_hub.constants
import pytest
from helpers import free_port

from envkit.cli.app import main

# A model folder that does not exist: an error about anything but the push means the check came too late.
RUN = ["train", "--env", "guess-number", "--model", "/no/such/model", "--push-to-hub", "true"]


@pytest.fixture
def token(monkeypatch, tmp_path) -> str:
    """A token in HF_TOKEN, and no token file (the machine's login, if any, is not read)."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", str(tmp_path / "token"))
    monkeypatch.setenv("HF_TOKEN", "hf_not_a_real_token")
    return "hf_not_a_real_token"


def refused(capsys, *says: str) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and all(s in err for s in says), err
    return err


def test_no_token_is_one_line_before_the_model_loads(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", str(tmp_path / "token"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    assert main(RUN) == 2
    refused(capsys, "--push-to-hub needs a Hugging Face token", "hf auth login", "HF_TOKEN")


def test_a_hub_that_does_not_answer_is_one_line(token, monkeypatch, capsys):
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", f"http://127.0.0.1:{free_port()}")
    assert main([*RUN, "--output-dir", "runs/x"]) == 2
    refused(
        capsys,
        "--push-to-hub: the Hub does not answer",
        "ConnectError",
        "upload afterwards: `hf upload REPO_ID runs/x`",
    )


def test_offline_mode_is_one_line(token, monkeypatch, capsys):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    assert main(RUN) == 2
    refused(capsys, "--push-to-hub: the Hub does not answer", "offline")


@pytest.fixture
def hub_refusing_tokens() -> Iterator[str]:
    """An HTTP server that answers every request as the Hub answers an invalid token (401)."""

    class Refuse(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b'{"error": "Invalid credentials in Authorization header"}'
            self.send_response(401)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_rejected_token_is_one_line(token, hub_refusing_tokens, monkeypatch, capsys):
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", hub_refusing_tokens)
    assert main(RUN) == 2
    refused(capsys, "--push-to-hub: the Hub does not answer", "Invalid user token")


def test_without_the_flag_nothing_is_asked(monkeypatch, capsys):
    """No push, no request: an unreachable Hub changes nothing (the run fails on the model folder, as it should)."""
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", f"http://127.0.0.1:{free_port()}")
    assert main(RUN[:-2]) == 2
    refused(capsys, "/no/such/model")
