"""OpenAPI generation from the gateway's own declarations (security, weights, parameters,
response example), so that the document cannot drift from what the gateway enforces.

The document depends only on the code (the routes and the views' declarations), never on the
request, so each process generates it once (30-100 ms) and serves the same rendered bytes to every
caller of /openapi/schema (exchange/apis.OpenApiSchemaApi).
"""

from __future__ import annotations

import re
import threading
from dataclasses import replace
from typing import Any

from drf_spectacular.openapi import AutoSchema
from drf_spectacular.settings import spectacular_settings
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter

from exchange.api.params import RECV_WINDOW, TIMESTAMP, Param

_PARAM_TYPES = {
    "STRING": OpenApiTypes.STR,
    "INT": OpenApiTypes.INT,
    "LONG": OpenApiTypes.INT64,
    "DECIMAL": OpenApiTypes.STR,
    "BOOL": OpenApiTypes.BOOL,
    "ENUM": OpenApiTypes.STR,
}

ERROR_SCHEMA = {
    "type": "object",
    "properties": {"code": {"type": "integer", "example": -1022}, "msg": {"type": "string"}},
    "required": ["code", "msg"],
}


# A refusal in the convert envelope (exchange/api/envelope.py): HTTP 200 with a non-zero status.
CONVERT_FAILURE_SCHEMA = {
    "type": "object",
    "properties": {
        "status": {"type": "integer", "example": 10000003},
        "error": {"type": "string"},
        "data": {"nullable": True, "enum": [None]},
    },
    "required": ["status", "error", "data"],
}


def _schema_of(example: Any) -> dict:
    if isinstance(example, dict):
        return {"type": "object", "properties": {k: _schema_of(v) for k, v in example.items()}}
    if isinstance(example, list):
        return {"type": "array", "items": _schema_of(example[0]) if example else {}}
    if isinstance(example, bool):
        return {"type": "boolean"}
    if isinstance(example, int):
        return {"type": "integer", "format": "int64"}
    if example is None:
        return {"nullable": True}
    return {"type": "string"}


class GatewayAutoSchema(AutoSchema):
    def _declared_params(self) -> list[Param]:
        spec = self.view.spec_for(self.method)
        params = list(spec.params)
        if self.view.security.signed:
            timestamp = TIMESTAMP
            if getattr(self.view, "timestamp_optional", False):
                timestamp = replace(TIMESTAMP, required=False, description=TIMESTAMP.description + " Optional here.")
            params += [
                timestamp,
                RECV_WINDOW,
                Param("signature", required=True, description="Hex HMAC-SHA256 of totalParams."),
            ]
        return params

    def get_override_parameters(self):
        location = OpenApiParameter.QUERY
        return [
            OpenApiParameter(
                name=p.name,
                type=_PARAM_TYPES[p.kind],
                location=location,
                required=p.required,
                description=p.description + (" Decimal as text." if p.kind == "DECIMAL" else ""),
                enum=list(p.choices) if p.choices else None,
            )
            for p in self._declared_params()
        ]

    def get_request_serializer(self):
        return None

    def _get_serializer(self):
        return None

    def get_auth(self):
        return [{"ApiKey": []}] if self.view.security.needs_key else []

    def get_description(self) -> str:
        view = self.view
        weights = []
        ip_weight, uid_weight = view.option("ip_weight", self.method), view.option("uid_weight", self.method)
        if ip_weight:
            weights.append(f"IP {ip_weight}")
        if uid_weight:
            weights.append(f"UID {uid_weight}")
        lines = [
            super().get_description(),
            "",
            f"Security: {view.security.value}. Weight: {', '.join(weights) or '0'}.",
        ]
        if view.key_type:
            lines.append(f"Key type needed: {view.key_type}.")
        return "\n".join(lines)

    def get_operation_id(self) -> str:
        """From the path and the method: drf-spectacular's own guess named both GET transfer/v3/transfers
        and GET transfer/v3/transfers/{transfer_id} `transfer_v3_transfers_retrieve`."""
        tokens = re.findall(r"[A-Za-z0-9]+", self.path.removeprefix("/openapi/"))
        return "_".join([*tokens, self.method.lower()])

    def get_tags(self) -> list[str]:
        return [self.view.__module__.split(".")[0]]

    def _get_response_bodies(self, direction="response"):
        example = self.view.option("response_example", self.method)
        schema = _schema_of(example)
        description = "Success"
        if getattr(self.view, "convert_envelope", False):
            # Found by the schema fuzzer (tests/fuzz): a convert refusal is a 200 whose data is null.
            schema = {"oneOf": [schema, CONVERT_FAILURE_SCHEMA]}
            description = "The convert envelope: status 0 and the data, or a refusal (status 10000003, data null)."
        success = {
            "description": description,
            "content": {"application/json": {"schema": schema, "example": example}},
        }
        error = {
            "description": "Error envelope; see docs/api.md for the code table.",
            "content": {"application/json": {"schema": ERROR_SCHEMA}},
        }
        return {"200": success, "4XX": error}


_document_lock = threading.Lock()
_document: dict | None = None
_rendered: dict[type, bytes] = {}


def openapi_document() -> dict:
    """The OpenAPI document of every endpoint, generated on the first call of the process.

    Generated as public (every endpoint, whoever asks) and for no request, as the old
    per-request view did for an anonymous caller: no request data can make two documents differ."""
    global _document
    if _document is None:
        with _document_lock:
            if _document is None:
                generator = spectacular_settings.DEFAULT_GENERATOR_CLASS()
                _document = generator.get_schema(request=None, public=True)
    return _document


def openapi_rendered(renderer) -> bytes:
    """The document as `renderer` (one of the schema view's renderers) renders it, rendered once per
    renderer class. Media-type parameters (`indent=...`) are ignored: a caller must not be able to
    make the process render and keep a new variant per request."""
    cls = type(renderer)
    rendered = _rendered.get(cls)
    if rendered is None:
        document = openapi_document()
        with _document_lock:
            rendered = _rendered.get(cls)
            if rendered is None:
                rendered = _rendered[cls] = bytes(renderer.render(document, renderer.media_type, {}))
    return rendered


def forget_openapi_document() -> None:
    """Drop the generated document (tests; a process that changes its routes at run time)."""
    global _document
    with _document_lock:
        _document = None
        _rendered.clear()
