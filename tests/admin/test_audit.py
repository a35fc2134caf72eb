"""The audit trail's edges, in-process (no group attached): what a refused request leaves behind."""

import logging

from fastapi.testclient import TestClient

from r2cc_serve.admin import create_app
from r2cc_serve.admin.sources import StaticSource

TOKEN = "in-process-secret"


def test_a_refused_request_is_recorded_on_one_line_without_the_token(caplog):
    app = create_app(source=StaticSource([]), token=TOKEN)
    with caplog.at_level(logging.WARNING, logger="r2cc_serve.admin"), TestClient(app) as client:
        r = client.post("/r2cc/v1/rails/evil%0Ahost/1/failover?force=maybe", headers={"Authorization": "Bearer nope"})
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"  # the token check's answer, kept
        r = client.post("/r2cc/v1/rails/h0/1/restore", params={"reason": "x" * 201},
                        headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 422
        events = client.get("/r2cc/v1/events", params={"kind": "admin", "limit": 1}).json()["events"]
        assert [(e["action"], e["result"], e["reason"]) for e in events] == [("restore", "invalid", "x" * 200)]
        assert client.get("/r2cc/v1/events", params={"kind": "rail"}).json()["events"] == []
        metrics = client.get("/metrics").text
    lines = [r.getMessage() for r in caplog.records if "audit" in r.getMessage()]
    assert len(lines) == 2 and "\n" not in lines[0] and 'host="evil\\nhost"' in lines[0] and "force=null" in lines[0]
    assert 'r2cc_admin_mutations_total{action="failover",result="unauthorized"} 1.0' in metrics
    assert TOKEN not in caplog.text + metrics
