"""OpenAPI generation from the gateway's own declarations (security, weights, parameters,
response example), so that the document cannot drift from what the gateway enforces."""

from __future__ import annotations

from typing import Any

from drf_spectacular.openapi import AutoSchema
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
            params += [
                TIMESTAMP,
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

    def get_tags(self) -> list[str]:
        return [self.view.__module__.split(".")[0]]

    def _get_response_bodies(self, direction="response"):
        example = self.view.option("response_example", self.method)
        success = {
            "description": "Success",
            "content": {"application/json": {"schema": _schema_of(example), "example": example}},
        }
        error = {
            "description": "Error envelope; see docs/api.md for the code table.",
            "content": {"application/json": {"schema": ERROR_SCHEMA}},
        }
        return {"200": success, "4XX": error}
