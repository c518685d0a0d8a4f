# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one HTTP client: every network outcome is a Response, the key only in the Authorization header."""
import io
import json
import socket
import ssl
from urllib.error import HTTPError, URLError

import pytest

from ansible_collections.gpufleet.inference.plugins.module_utils import _http as http


class FakeResp(object):
    def __init__(self, status, body, with_status=True):
        if with_status:
            self.status = status
        self.code = status
        self.body = body

    def read(self):
        return self.body

    def getcode(self):
        return self.code

    def close(self):
        pass


@pytest.fixture
def open_url(monkeypatch):
    """Replaces the urllib opener (http._build_opener) with one that records each request."""
    calls = []
    outcomes = []
    built = []

    class Opener(object):
        def __init__(self, validate_certs, https):
            self.key = (validate_certs, https)

        def open(self, request, timeout):
            calls.append((request.full_url, dict(method=request.get_method(), data=request.data, timeout=timeout,
                                                 headers=dict(request.header_items()), opener=self.key)))
            if not outcomes:
                return FakeResp(200, b"{}")
            outcome = outcomes.pop(0)
            if isinstance(outcome, BaseException):
                raise outcome
            return outcome

    def build(validate_certs, https):
        built.append((validate_certs, https))
        return Opener(validate_certs, https)
    monkeypatch.setattr(http, "_build_opener", build)
    monkeypatch.setattr(http, "_OPENERS", {})
    fake = type("OpenUrl", (), {})()
    fake.calls, fake.outcomes, fake.built = calls, outcomes, built
    return fake


def test_one_opener_per_process_not_one_per_request(open_url):
    for dummy in range(3):  # a transport per router call, as an action plugin makes them
        transport = http.open_url_transport(validate_certs=False)
        for dummy in range(5):
            transport("GET", "http://h:1/health", None, {}, 1)
    assert open_url.built == [(False, False)]
    http.open_url_transport(validate_certs=True)("GET", "https://h:1/health", None, {}, 1)
    http.open_url_transport(validate_certs=True)("GET", "HTTPS://h:1/health", None, {}, 1)
    assert open_url.built == [(False, False), (True, True)]
    assert open_url.calls[-1][1]["opener"] == (True, True)


def test_the_real_opener_checks_certificates_unless_told_not_to():
    import urllib.request
    for validate, mode, hostname in ((True, ssl.CERT_REQUIRED, True), (False, ssl.CERT_NONE, False)):
        opener = http._build_opener(validate, True)
        https = [h for h in opener.handlers if isinstance(h, urllib.request.HTTPSHandler)]
        assert len(https) == 1 and https[0]._context.verify_mode == mode
        assert https[0]._context.check_hostname is hostname


# --------------------------------------------------------------------------- Response

def test_response_kinds_and_port_open():
    ok = http.Response(http.HTTP, 200, '{"a": 1}')
    assert ok.json() == {"a": 1} and ok.text == '{"a": 1}' and ok.port_open
    assert http.Response(http.TIMEOUT, error="timed out").port_open  # something accepted and hung
    assert not http.Response(http.REFUSED, error="refused").port_open
    assert not http.Response(http.ERROR, error="boom").port_open
    # a status only comes with an HTTP answer
    assert http.Response(http.REFUSED, 200).status is None


def test_response_json_of_garbage_or_empty_is_none():
    assert http.Response(http.HTTP, 200, "not json").json() is None
    assert http.Response(http.HTTP, 200, "").json() is None
    assert http.Response(http.HTTP, 200, None).body == ""


def test_describe():
    assert http.Response(http.HTTP, 200, "big body").describe() == "HTTP 200"  # no body for a success
    long_error = "x\n" * 400
    text = http.Response(http.HTTP, 503, long_error).describe()
    assert text.startswith("HTTP 503 x x") and "\n" not in text and len(text) <= len("HTTP 503 ") + 300
    assert http.Response(http.HTTP, 404, "").describe() == "HTTP 404"
    assert http.Response(http.REFUSED).describe() == "connection refused"
    assert http.Response(http.TIMEOUT).describe() == "no answer within the request timeout"
    assert http.Response(http.ERROR, error="SSLError: bad cert").describe() == "error: SSLError: bad cert"


def test_text_of():
    assert http.text_of(b"caf\xc3\xa9 \xff") == u"caf\xe9 \ufffd"
    assert http.text_of(None) == "" and http.text_of("s") == "s"


# --------------------------------------------------------------------------- HttpClient + open_url

def test_post_sends_json_bearer_key_and_timeout(open_url):
    open_url.outcomes.append(FakeResp(200, b'{"text": " Paris"}'))
    client = http.HttpClient(" http://127.0.0.1:30000/ ", "sekret", validate_certs=False)
    resp = client.post("/generate", {"text": "hi"}, timeout=2.5)
    assert (resp.kind, resp.status, resp.json()) == (http.HTTP, 200, {"text": " Paris"})
    url, kwargs = open_url.calls[0]
    assert url == "http://127.0.0.1:30000/generate"
    assert kwargs["method"] == "POST" and kwargs["timeout"] == 2.5
    assert kwargs["headers"] == {"Accept": "application/json", "Authorization": "Bearer sekret",
                                 "Content-type": "application/json", "User-agent": "gpufleet.inference"}
    assert json.loads(kwargs["data"]) == {"text": "hi"}
    assert kwargs["opener"] == (False, False)
    # the key is never part of what a Response carries
    assert "sekret" not in repr(vars(resp))


def test_get_without_key_has_no_authorization_and_no_body(open_url):
    client = http.HttpClient("http://h:1", timeout=7)
    client.get("/server_info")
    client.delete("/workers/x")
    (url, get_kwargs), (durl, del_kwargs) = open_url.calls
    assert get_kwargs["method"] == "GET" and get_kwargs["data"] is None and get_kwargs["timeout"] == 7
    assert "Authorization" not in get_kwargs["headers"] and "Content-type" not in get_kwargs["headers"]
    assert get_kwargs["opener"] == (True, False)
    assert (durl, del_kwargs["method"]) == ("http://h:1/workers/x", "DELETE")


@pytest.mark.parametrize("timeout,sent", [(0, 0.1), (-3, 0.1), (0.05, 0.1), ("2", 2.0), (0.5, 0.5)])
def test_timeout_floor(open_url, timeout, sent):
    # a deadline already passed still gets a short, real request (open_url treats 0 as "no timeout")
    http.HttpClient("http://h:1").get("/x", timeout=timeout)
    assert open_url.calls[0][1]["timeout"] == sent


def test_status_from_getcode_when_the_response_has_no_status(open_url):
    open_url.outcomes.append(FakeResp(204, b"", with_status=False))
    resp = http.HttpClient("http://h:1").get("/x")
    assert (resp.kind, resp.status) == (http.HTTP, 204)


def test_http_error_is_an_answer_with_its_status_and_body(open_url):
    open_url.outcomes.append(HTTPError("http://h:1/generate", 503, "Service Unavailable", {},
                                       io.BytesIO(b'{"error": "starting"}')))
    resp = http.HttpClient("http://h:1").post("/generate", {})
    assert (resp.kind, resp.status, resp.port_open) == (http.HTTP, 503, True)
    assert resp.json() == {"error": "starting"}


def test_http_error_with_unreadable_body(open_url):
    class Broken(io.BytesIO):
        def read(self, *args):
            raise IOError("connection reset while reading")
    open_url.outcomes.append(HTTPError("http://h:1/x", 401, "Unauthorized", {}, Broken()))
    resp = http.HttpClient("http://h:1").get("/x")
    assert (resp.kind, resp.status, resp.body) == (http.HTTP, 401, "")


@pytest.mark.parametrize("exc,kind", [
    (URLError(ConnectionRefusedError(111, "Connection refused")), http.REFUSED),
    (ConnectionRefusedError(111, "Connection refused"), http.REFUSED),
    (URLError(OSError(111, "Connection refused")), http.REFUSED),
    (URLError(socket.timeout("timed out")), http.TIMEOUT),
    (socket.timeout("timed out"), http.TIMEOUT),
    (TimeoutError("The read operation timed out"), http.TIMEOUT),
    (URLError("Name or service not known"), http.ERROR),
    (URLError(socket.gaierror(-2, "Name or service not known")), http.ERROR),
    (ssl.SSLError(1, "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed"), http.ERROR),
    (ConnectionResetError(104, "Connection reset by peer"), http.ERROR),
    (ValueError("unknown url type: 'h'"), http.ERROR),
])
def test_network_outcomes_never_raise(open_url, exc, kind):
    open_url.outcomes.append(exc)
    resp = http.HttpClient("http://h:1").post("/generate", {"text": "x"}, timeout=1)
    assert resp.kind == kind and resp.status is None
    assert resp.port_open == (kind == http.TIMEOUT)
    assert resp.error  # says what happened
    if kind == http.ERROR:
        assert type(getattr(exc, "reason", exc)).__name__ in resp.error or "URLError" in resp.error


def test_injected_transport_gets_base_url_headers_and_default_timeout():
    seen = []

    def transport(method, url, payload, headers, timeout):
        seen.append((method, url, payload, headers, timeout))
        return http.Response(http.HTTP, 200, "{}")
    client = http.HttpClient("https://h:443/", "k", transport=transport, timeout=11.0)
    client.post("/p", {"a": 1})
    client.get("/g", timeout=3)
    assert seen[0] == ("POST", "https://h:443/p", {"a": 1}, {"Accept": "application/json",
                                                             "Authorization": "Bearer k"}, 11.0)
    assert seen[1][:3] == ("GET", "https://h:443/g", None) and seen[1][4] == 3


def test_auth_headers():
    assert http.auth_headers() == {"Accept": "application/json"}
    assert http.auth_headers("") == {"Accept": "application/json"}
    assert http.auth_headers("k")["Authorization"] == "Bearer k"


# --------------------------------------------------------------------------- a real server (no fakes)

@pytest.fixture
def server():
    """A real HTTP server on loopback: /ok echoes the JSON body and headers, /moved redirects,
    /busy answers 503, /slow answers after 2 s."""
    import threading
    import time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _answer(self, status, body, headers=()):
            data = json.dumps(body).encode()
            self.send_response(status)
            for name, value in headers:
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self):
            length = int(self.headers.get("Content-Length") or 0)
            sent = json.loads(self.rfile.read(length) or b"null")
            self.do_GET(sent)

        def do_GET(self, sent=None):
            if self.path == "/ok":
                self._answer(200, {"sent": sent, "auth": self.headers.get("Authorization"),
                                   "agent": self.headers.get("User-Agent"), "method": self.command})
            elif self.path == "/moved":
                self._answer(302, {"moved": True}, [("Location", "/ok")])
            elif self.path == "/busy":
                self._answer(503, {"error": "loading"})
            elif self.path == "/slow":
                time.sleep(2)
                self._answer(200, {})
            elif self.path.startswith("/sse"):
                # as uvicorn streams SGLang's /generate: chunked text/event-stream
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream; charset=utf-8")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for event in (b'data: {"n":1}\n\n', b"data: [DONE]\n\n"):
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                    self.wfile.flush()
                    if self.path == "/sse-stall":
                        time.sleep(2)
                self.wfile.write(b"0\r\n\r\n")

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield "http://127.0.0.1:%d" % httpd.server_address[1]
    httpd.shutdown()
    httpd.server_close()
    thread.join(5)


def test_real_exchanges_answers_redirects_errors_timeouts_and_refusals(server, monkeypatch):
    monkeypatch.delenv("http_proxy", raising=False)
    monkeypatch.delenv("HTTP_PROXY", raising=False)
    client = http.HttpClient(server, "sekret", timeout=5)
    ok = client.post("/ok", {"text": "hi"})
    assert (ok.kind, ok.status) == (http.HTTP, 200)
    assert ok.json() == {"sent": {"text": "hi"}, "auth": "Bearer sekret", "agent": "gpufleet.inference",
                         "method": "POST"}
    moved = client.get("/moved")  # never followed: the 302 is the answer
    assert (moved.kind, moved.status, moved.json()) == (http.HTTP, 302, {"moved": True})
    busy = client.get("/busy")
    assert (busy.kind, busy.status, busy.json()) == (http.HTTP, 503, {"error": "loading"})
    slow = client.get("/slow", timeout=0.3)
    assert slow.kind == http.TIMEOUT and slow.port_open
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    closed = sock.getsockname()[1]
    sock.close()
    refused = http.HttpClient("http://127.0.0.1:%d" % closed).get("/ok", timeout=2)
    assert refused.kind == http.REFUSED and not refused.port_open


def test_a_stream_is_read_line_by_line_with_the_key_and_an_event_stream_accept(server, monkeypatch):
    monkeypatch.delenv("http_proxy", raising=False)
    monkeypatch.delenv("HTTP_PROXY", raising=False)
    stream = http.HttpClient(server, "sekret").stream("/sse", {"text": "x"}, timeout=5)
    try:
        assert (stream.kind, stream.status) == (http.HTTP, 200)
        lines = []
        while True:
            line = stream.readline()
            if not line:
                break
            lines.append(line)
    finally:
        stream.close()
    assert lines == [b'data: {"n":1}\n', b"\n", b"data: [DONE]\n", b"\n"]
    stream.close()  # closing twice is harmless
    busy = http.HttpClient(server).stream("/busy", {}, timeout=5)
    assert (busy.status, busy.describe()) == (503, 'HTTP 503 {"error": "loading"}') and busy.readline() == b""


def test_a_stream_that_stalls_raises_on_read_and_is_described_as_a_timeout(server, monkeypatch):
    monkeypatch.delenv("http_proxy", raising=False)
    monkeypatch.delenv("HTTP_PROXY", raising=False)
    stream = http.HttpClient(server).stream("/sse-stall", {}, timeout=0.3)
    try:
        assert stream.readline() == b'data: {"n":1}\n' and stream.readline() == b"\n"
        with pytest.raises(Exception) as failed:
            stream.readline()
    finally:
        stream.close()
    assert http.describe_exception(failed.value) == "no answer within the request timeout"


def test_a_stream_to_a_closed_port_is_refused_without_raising():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    closed = sock.getsockname()[1]
    sock.close()
    stream = http.HttpClient("http://127.0.0.1:%d" % closed).stream("/generate", {}, timeout=2)
    assert (stream.kind, stream.status, stream.describe()) == (http.REFUSED, None, "connection refused")


def test_stream_errors_before_an_answer_become_stream_kinds(open_url):
    transport = http.open_stream_transport()
    open_url.outcomes.append(URLError(socket.timeout("timed out")))
    assert transport("POST", "http://h:1/generate", {}, {}, 1).kind == http.TIMEOUT
    open_url.outcomes.append(HTTPError("http://h:1/generate", 401, "Unauthorized", {}, io.BytesIO(b'{"error": "Unauthorized"}')))
    denied = transport("POST", "http://h:1/generate", {}, {"Authorization": "Bearer k"}, 1)
    assert (denied.kind, denied.status, denied.body) == (http.HTTP, 401, '{"error": "Unauthorized"}')
    assert open_url.calls[-1][1]["headers"]["Accept"] == "text/event-stream"


# ---------------------------------------------------------------- the API key of an SGLang config file

@pytest.mark.parametrize("key", ["plain", 'q"uote\\back', "caf\u00e9 \u2028 \U0001F600", "x" * 300])
def test_the_key_the_collection_writes_is_read_back_exactly(tmp_path, key):
    from ansible_collections.gpufleet.inference.plugins.module_utils import _args
    path = tmp_path / "sglang.yaml"
    path.write_text(_args.config_file_text({"sglang_api_key": key}), encoding="utf-8")
    assert http.api_key_from_config(str(path)) == key


def test_no_file_or_an_empty_config_means_no_key(tmp_path):
    assert http.api_key_from_config(str(tmp_path / "missing.yaml")) is None
    (tmp_path / "empty.yaml").write_text("{}\n")
    assert http.api_key_from_config(str(tmp_path / "empty.yaml")) is None


def test_another_yaml_layout_is_read_with_pyyaml_and_garbage_is_an_error(tmp_path):
    (tmp_path / "other.yaml").write_text("port: 30000\napi_key: 'single quoted'\n")
    assert http.api_key_from_config(str(tmp_path / "other.yaml")) == "single quoted"
    (tmp_path / "bad.yaml").write_text("api-key: [unclosed\n")
    with pytest.raises(http.ApiKeyFileError, match="is not YAML"):
        http.api_key_from_config(str(tmp_path / "bad.yaml"))
    (tmp_path / "escape.yaml").write_text('api-key: "a\\qb"\n')
    with pytest.raises(http.ApiKeyFileError, match="escape this reader does not know"):
        http.api_key_from_config(str(tmp_path / "escape.yaml"))


def test_without_pyyaml_only_the_collections_layout_or_an_empty_file_is_understood(tmp_path, monkeypatch):
    import sys
    monkeypatch.setitem(sys.modules, "yaml", None)  # a host without PyYAML: `import yaml` fails
    path = tmp_path / "sglang.yaml"
    path.write_text('api-key: "k\\"ey"\n')
    assert http.api_key_from_config(str(path)) == 'k"ey'
    for empty in ("", "{}\n"):
        path.write_text(empty)
        assert http.api_key_from_config(str(path)) is None
    path.write_text("port: 30000\napi_key: 'single quoted'\n")
    with pytest.raises(http.ApiKeyFileError, match="no line like api-key.*this host has no PyYAML"):
        http.api_key_from_config(str(path))


class _Module(object):
    def __init__(self, **params):
        self.params = dict(dict(api_key=None, api_key_file=None), **params)
        self.no_log_values = set()

    def fail_json(self, **kwargs):
        raise AssertionError(kwargs["msg"])


def test_server_api_key_reads_the_file_and_masks_the_key(tmp_path):
    (tmp_path / "k.yaml").write_text('api-key: "fr0m-file"\n')
    module = _Module(api_key_file=str(tmp_path / "k.yaml"))
    assert http.server_api_key(module) == "fr0m-file" and "fr0m-file" in module.no_log_values
    assert http.server_api_key(_Module(api_key="given")) == "given"
    with pytest.raises(AssertionError, match="mutually exclusive"):
        http.server_api_key(_Module(api_key="given", api_key_file=str(tmp_path / "k.yaml")))
    (tmp_path / "dir.yaml").mkdir()  # unreadable as a file, for root too
    with pytest.raises(AssertionError, match="cannot read the API key file"):
        http.server_api_key(_Module(api_key_file=str(tmp_path / "dir.yaml")))
