# -*- coding: utf-8 -*-
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""sglang_router_worker: argument handling, diff and failure through the module's entry points (fake HTTP)."""
import json

import pytest

from ansible.module_utils import basic
from ansible.module_utils.testing import patch_module_args

from ansible_collections.gpufleet.inference.plugins.module_utils import _router
from ansible_collections.gpufleet.inference.plugins.module_utils._router import http_result
from ansible_collections.gpufleet.inference.plugins.modules import sglang_router_worker

ROUTER = "http://127.0.0.1:30080"
W1 = "http://127.0.1.11:30000"
W2 = "http://127.0.1.12:30000"


class Exit(Exception):
    pass


class Fail(Exception):
    pass


@pytest.fixture
def module_exits(monkeypatch):
    def exit_json(self, **kwargs):
        raise Exit(kwargs)

    def fail_json(self, **kwargs):
        raise Fail(kwargs)

    monkeypatch.setattr(basic.AnsibleModule, "exit_json", exit_json)
    monkeypatch.setattr(basic.AnsibleModule, "fail_json", fail_json)


def fake_transport(workers):
    listing = [{"id": "id-%d" % i, "url": url, "is_healthy": True} for i, url in enumerate(workers)]

    def transport(method, url, payload, headers, timeout):
        if method == "GET" and url == ROUTER + "/workers":
            return http_result(200, json.dumps({"workers": listing}))
        if method == "DELETE":
            wid = url.rsplit("/", 1)[1]
            listing[:] = [w for w in listing if w["id"] != wid]
            return http_result(202, "{}")
        if url.endswith("/v1/loads"):
            return http_result(200, json.dumps({"aggregate": {"total_reqs": 0}}))
        raise AssertionError("unexpected %s %s" % (method, url))

    return transport


def params(**overrides):
    base = {"router_url": ROUTER, "worker_url": W1, "state": "absent", "api_key": None, "worker_api_key": None,
            "drain_timeout": 10, "wait_healthy": True, "timeout": 10, "request_timeout": 5.0, "validate_certs": True}
    base.update(overrides)
    return base


def test_run_returns_diff_of_worker_urls():
    result = _router.worker_change(params(), False, transport=fake_transport([W2, W1]), sleep=lambda s: None)
    assert result["changed"] is True and result["drained"] is True
    assert result["diff"] == {"before": "%s\n%s\n" % (W1, W2), "after": "%s\n" % W2}


def test_main_fails_with_the_router_error(module_exits, monkeypatch):
    def transport(method, url, payload, headers, timeout):
        return http_result(error="[Errno 111] Connection refused")

    monkeypatch.setattr(_router, "open_url_transport", lambda validate_certs=True: transport)
    with patch_module_args({"router_url": ROUTER, "worker_url": W1, "state": "absent"}):
        with pytest.raises(Fail) as failed:
            sglang_router_worker.main()
    assert "listing the router's workers at %s/workers: connection refused" % ROUTER in failed.value.args[0]["msg"]


def test_main_check_mode_without_diff(module_exits, monkeypatch):
    transport = fake_transport([W1])
    monkeypatch.setattr(_router, "open_url_transport", lambda validate_certs=True: transport)
    with patch_module_args({"router_url": ROUTER, "worker_url": W1, "state": "absent", "_ansible_check_mode": True}):
        with pytest.raises(Exit) as done:
            sglang_router_worker.main()
    result = done.value.args[0]
    assert result["changed"] is True and result["workers"] == [] and "diff" not in result
