"""Schemathesis hooks (SCHEMATHESIS_HOOKS): every error the server answers is JSON in llama-server's shape."""

from __future__ import annotations

import schemathesis


@schemathesis.check
def llama_server_error_shape(ctx, response, case):  # type: ignore[no-untyped-def]
    if response.status_code < 400:
        return None
    body = response.json()
    error = body.get("error") if isinstance(body, dict) else None
    if not isinstance(error, dict) or error.get("code") != response.status_code \
            or not isinstance(error.get("message"), str) or not isinstance(error.get("type"), str):
        raise AssertionError(f"{response.status_code} without llama-server's error shape: {response.text[:300]}")
    return None
