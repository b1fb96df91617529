"""The OpenAPI document types every answer and declares the bearer scheme; /docs
works without internet."""

from __future__ import annotations


def test_every_operation_has_a_typed_success_answer_and_the_token_scheme(live):
    doc = live.admin.get("/openapi.json").json()
    assert doc["components"]["securitySchemes"]["token"] == {
        "type": "http", "scheme": "bearer", "description": doc["components"][
            "securitySchemes"]["token"]["description"]}
    untyped, open_ = [], []
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            name = f"{method.upper()} {path}"
            ok = [r for code, r in op["responses"].items() if code.startswith("2")]
            assert ok, name
            for answer in ok:
                schema = answer.get("content", {}).get("application/json", {}).get("schema")
                # a named model ($ref) or a union of them, never a bare object
                if not schema or not ("$ref" in schema or "anyOf" in schema):
                    untyped.append(name)
            if path != "/healthz" and {"token": []} not in op.get("security", []):
                open_.append(name)
    assert untyped == [] and open_ == []
    job = doc["components"]["schemas"]["JobView"]
    assert {"settled", "serving", "unavailable", "rollout_active"} <= set(job["properties"])


def test_docs_load_their_assets_from_this_server(live):
    page = live.admin.get("/docs")
    assert page.status_code == 200 and "swagger-ui" in page.text
    assert "cdn" not in page.text.lower() and "https://" not in page.text.replace(
        "https://fastapi.tiangolo.com", "")
    for asset in ("swagger-ui-bundle.js", "swagger-ui.css"):
        got = live.admin.get(f"/docs/static/{asset}")
        assert got.status_code == 200 and len(got.content) > 10_000, asset
