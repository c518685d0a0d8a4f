# -*- coding: utf-8 -*-
# Copyright: contributors to gpufleet.inference
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The collection's one HTTP client: JSON over the standard library's urllib.

Private to this collection: no compatibility promise. Used by the server probes, the router
client and the benchmark. It never raises for network outcomes: every exchange is a Response
whose ``kind`` says what happened (``http`` with a status, ``refused``, ``timeout``, ``error``);
a streamed answer (the benchmark's /generate) is a Stream with the same ``kind`` and ``status``.
The API key travels only in the Authorization header and is never part of a Response.
"""
from __future__ import annotations

import errno
import json
import re
import socket

from urllib.error import HTTPError, URLError

HTTP = "http"
REFUSED = "refused"
TIMEOUT = "timeout"
ERROR = "error"


class Response(object):
    """Outcome of one request: ``kind`` is http (a status arrived), refused, timeout or error."""

    def __init__(self, kind, status=None, body=None, error=None):
        self.kind = kind
        self.status = status if kind == HTTP else None
        self.body = body or ""
        self.error = error

    @property
    def text(self):
        return self.body

    @property
    def port_open(self):
        """Something accepted the connection (any answer, or a request that hung)."""
        return self.kind in (HTTP, TIMEOUT)

    def json(self):
        try:
            return json.loads(self.body) if self.body else None
        except ValueError:
            return None

    def describe(self):
        if self.kind == HTTP:
            excerpt = (self.body or "").strip().replace("\n", " ")
            return "HTTP %s%s" % (self.status, " " + excerpt[:300] if excerpt and self.status >= 400 else "")
        if self.kind == REFUSED:
            return "connection refused"
        if self.kind == TIMEOUT:
            return "no answer within the request timeout"
        return "error: %s" % self.error


def text_of(body):
    if isinstance(body, bytes):
        return body.decode("utf-8", "replace")
    return body or ""


def _is_timeout(exc):
    return isinstance(exc, socket.timeout) or "timed out" in str(exc).lower()


def _is_refused(exc):
    return isinstance(exc, ConnectionRefusedError) or getattr(exc, "errno", None) == errno.ECONNREFUSED \
        or "refused" in str(exc).lower()


def _classify(exc):
    if _is_timeout(exc):
        return Response(TIMEOUT, error=str(exc))
    if _is_refused(exc):
        return Response(REFUSED, error=str(exc))
    return Response(ERROR, error="%s: %s" % (type(exc).__name__, exc))


_OPENERS = {}  # (validate_certs, https) -> urllib opener, for every transport of this process

USER_AGENT = "gpufleet.inference"


def _build_opener(validate_certs, https):
    """A urllib opener that never follows redirects (a 3xx is the answer) and, for https, checks
    certificates unless ``validate_certs`` is false. Proxies come from the environment, as urllib's."""
    import urllib.request  # pylint: disable=import-outside-toplevel

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, req, fp, code, msg, headers, newurl):
            return None  # urllib then raises HTTPError with the 3xx status: an answer, not followed

    handlers = [NoRedirect()]
    if https:
        import ssl  # pylint: disable=import-outside-toplevel
        context = ssl.create_default_context()
        if not validate_certs:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        handlers.append(urllib.request.HTTPSHandler(context=context))
    return urllib.request.build_opener(*handlers)


def _opener(validate_certs, https):
    key = (bool(validate_certs), bool(https))
    if key not in _OPENERS:
        _OPENERS[key] = _build_opener(*key)
    return _OPENERS[key]


def preload():
    """Import what a call needs (urllib, http.client, ssl) now. For controller-side plugins, at their import:
    ansible-playbook's main process loads an action plugin's class (its strategy reads its attributes) before
    it forks a worker per host and task, so every worker that calls the router inherits these modules
    instead of importing them again. On a host, modules keep the
    lazy import: a module run that makes no call does not pay for it."""
    import ssl  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
    import urllib.request  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import


def _send(method, url, payload, headers, timeout, validate_certs):
    """Sends one request (a JSON body when ``payload`` is not None) and returns the open answer; raises as urllib."""
    import urllib.request  # pylint: disable=import-outside-toplevel
    headers = dict(headers or {})
    headers.setdefault("User-Agent", USER_AGENT)
    data = None
    if payload is not None:
        data = json.dumps(payload).encode("utf-8")
        headers["Content-Type"] = "application/json"
    opener = _opener(validate_certs, str(url).lower().startswith("https:"))
    request = urllib.request.Request(url, data=data, headers=headers, method=method)
    return opener.open(request, timeout=max(float(timeout), 0.1))


def _error_body(exc):
    """The text of an HTTP error answer ("" when it cannot be read)."""
    try:
        return text_of(exc.read())
    except Exception:  # pylint: disable=broad-except
        return ""


def open_url_transport(validate_certs=True):
    """``(method, url, payload, headers, timeout) -> Response`` over the standard library's urllib.

    One opener (and for https one SSL context, the system's CA certificates loaded once) per process
    and ``validate_certs``. Not ``ansible.module_utils.urls``: importing it loads ``cryptography``
    in every module run and every controller worker that makes a call -
    once per host per batch on the controller, once per wait slice on a host - for features these
    JSON calls do not use (client certificates, GSSAPI, netrc, unix sockets).
    """
    def transport(method, url, payload, headers, timeout):
        try:
            resp = _send(method, url, payload, headers, timeout, validate_certs)
            try:
                body = resp.read()
            finally:
                resp.close()
            return Response(HTTP, getattr(resp, "status", None) or resp.getcode(), text_of(body))
        except HTTPError as exc:
            return Response(HTTP, exc.code, _error_body(exc))
        except URLError as exc:
            reason = exc.reason
            return _classify(reason if isinstance(reason, Exception) else exc)
        except Exception as exc:  # pylint: disable=broad-except
            return _classify(exc)

    return transport


class Stream(object):
    """An answer read as it arrives (Server-Sent Events): ``kind`` and ``status`` as a Response; with
    status 200 ``readline()`` returns the next raw line (bytes, b"" at the end), otherwise ``body`` holds
    the error answer. A read that fails raises; ``describe_exception`` words it like a Response."""

    def __init__(self, kind, status=None, handle=None, body=None, error=None):
        self.kind = kind
        self.status = status if kind == HTTP else None
        self.body = body or ""
        self.error = error
        self._handle = handle

    def readline(self):
        return self._handle.readline() if self._handle is not None else b""

    def close(self):
        if self._handle is not None:
            try:
                self._handle.close()
            finally:
                self._handle = None

    def describe(self):
        return Response(self.kind, self.status, self.body, self.error).describe()


def describe_exception(exc):
    """How a failed read of an open answer is reported (timeout, refused/reset, other)."""
    return _classify(exc).describe()


def open_stream_transport(validate_certs=True):
    """``(method, url, payload, headers, timeout) -> Stream``: the request is sent and the status read;
    the body stays open for ``readline``. ``timeout`` bounds each read (seconds without a byte)."""
    def transport(method, url, payload, headers, timeout):
        headers = dict(headers or {})
        headers["Accept"] = "text/event-stream"
        try:
            resp = _send(method, url, payload, headers, timeout, validate_certs)
            status = getattr(resp, "status", None) or resp.getcode()
            if status != 200:
                try:
                    return Stream(HTTP, status, body=text_of(resp.read()))
                finally:
                    resp.close()
            return Stream(HTTP, status, handle=resp)
        except HTTPError as exc:
            return Stream(HTTP, exc.code, body=_error_body(exc))
        except URLError as exc:
            reason = exc.reason
            failed = _classify(reason if isinstance(reason, Exception) else exc)
            return Stream(failed.kind, error=failed.error)
        except Exception as exc:  # pylint: disable=broad-except
            failed = _classify(exc)
            return Stream(failed.kind, error=failed.error)

    return transport


_CONFIG_KEY = re.compile(r'^api[-_]key:[ \t]*"((?:[^"\\]|\\.)*)"[ \t]*$', re.M)
_ESCAPE = re.compile(r'\\(u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|.)', re.S)


class ApiKeyFileError(Exception):
    """The key file exists but holds no key this reader understands."""


def api_key_from_config(path):
    """The API key in an SGLang config file (YAML, key C(api-key)), read on the host; None when the file
    does not exist or sets no key. The collection writes ``api-key: "<escaped>"`` (double-quoted YAML,
    escapes \\" \\\\ \\uXXXX \\UXXXXXXXX); another layout is read with PyYAML when the host has it."""
    try:
        with open(path, "rb") as handle:
            text = handle.read().decode("utf-8")
    except (IOError, OSError) as exc:
        if exc.errno == errno.ENOENT:
            return None
        raise ApiKeyFileError("cannot read the API key file %s: %s" % (path, exc))
    except UnicodeDecodeError:
        raise ApiKeyFileError("the API key file %s is not UTF-8" % path)
    found = _CONFIG_KEY.findall(text)
    if len(found) == 1:
        def unescape(match):
            code = match.group(1)
            if code[0] in "uU" and len(code) > 1:
                return chr(int(code[1:], 16))
            return {"n": "\n", "t": "\t", "\\": "\\", '"': '"', "/": "/"}.get(code, None) or _bad(path, code)
        return _ESCAPE.sub(unescape, found[0]) or None
    try:
        import yaml  # pylint: disable=import-outside-toplevel
    except ImportError:
        yaml = None
    if yaml is not None:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ApiKeyFileError("the API key file %s is not YAML: %s" % (path, str(exc).splitlines()[0]))
        if data is None or (isinstance(data, dict) and not (data.get("api-key") or data.get("api_key"))):
            return None
        if isinstance(data, dict):
            return str(data.get("api-key") or data.get("api_key"))
    elif text.strip() in ("", "{}"):
        return None
    raise ApiKeyFileError("the API key file %s has no line like api-key: \"...\" (the layout the collection "
                          "writes)%s" % (path, "" if yaml is not None else ", and this host has no PyYAML"))


def _bad(path, code):
    raise ApiKeyFileError("the API key file %s has an escape this reader does not know: \\%s" % (path, code))


def server_api_key(module):
    """The key to probe a server with: O(api_key), or the one in O(api_key_file) read on the host (masked
    in every output like a no_log value). Fails the module when both are set or the file is unreadable."""
    params = module.params
    if not params.get("api_key_file"):
        return params.get("api_key")
    if params.get("api_key"):
        module.fail_json(msg="api_key and api_key_file are mutually exclusive")
    try:
        key = api_key_from_config(params["api_key_file"])
    except ApiKeyFileError as exc:
        module.fail_json(msg=str(exc))
    if key:
        module.no_log_values.add(key)
    return key


def auth_headers(api_key=None):
    headers = {"Accept": "application/json"}
    if api_key:
        headers["Authorization"] = "Bearer %s" % api_key
    return headers


class HttpClient(object):
    """JSON requests against one base URL, with an optional Bearer key."""

    def __init__(self, base_url, api_key=None, validate_certs=True, transport=None, timeout=30.0,
                 stream_transport=None):
        self.base_url = (base_url or "").strip().rstrip("/")
        self.api_key = api_key
        self.timeout = timeout
        self.transport = transport or open_url_transport(validate_certs)
        self.stream_transport = stream_transport or open_stream_transport(validate_certs)

    def request(self, method, path, payload=None, timeout=None):
        return self.transport(method, self.base_url + path, payload, auth_headers(self.api_key),
                              self.timeout if timeout is None else timeout)

    def get(self, path, timeout=None):
        return self.request("GET", path, None, timeout)

    def post(self, path, payload, timeout=None):
        return self.request("POST", path, payload, timeout)

    def delete(self, path, timeout=None):
        return self.request("DELETE", path, None, timeout)

    def stream(self, path, payload, timeout=None):
        """POST ``payload`` and return the open Stream (close it when done)."""
        return self.stream_transport("POST", self.base_url + path, payload, auth_headers(self.api_key),
                                     self.timeout if timeout is None else timeout)
