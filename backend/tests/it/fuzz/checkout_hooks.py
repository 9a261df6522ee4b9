"""Schemathesis hooks for the checkout's fuzz (backend/tests/fuzz.rs).

Each operation is sent with the credential its `security` names first (a shop's secret key or
a shopper's token), and every keyed POST with a fresh Idempotency-Key, so that generated
requests run instead of replaying one another.
"""

import os
import uuid

import schemathesis


@schemathesis.auth()
class Credentials:
    def get(self, case, ctx):
        return {
            "shop_secret_key": os.environ["FUZZ_SHOP_KEY"],
            "shopper_token": os.environ["FUZZ_SHOPPER_TOKEN"],
        }

    def set(self, case, data, ctx):
        security = case.operation.definition.raw.get("security") or []
        schemes = [name for requirement in security for name in requirement]
        headers = dict(case.headers or {})
        if schemes:
            headers["Authorization"] = f"Bearer {data[schemes[0]]}"
        if case.method.upper() == "POST":
            headers["Idempotency-Key"] = str(uuid.uuid4())
        case.headers = headers
